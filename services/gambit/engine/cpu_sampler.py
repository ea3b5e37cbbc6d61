"""``sampler.sample`` in one C++ call, drawing bit for bit the same tokens.

At a small vocabulary the sampler is ~40 tiny tensor ops a step, and their dispatch, not the
arithmetic, was its cost: ~0.4 ms a step at 96 rows of the shipped target's 100 symbols (in a search,
cache-cold after the forward, 0.8 ms of an ~11 ms step). The float work keeps the ATen calls
``sampler.py`` makes (temperature division, max, exp, the blocks' fp32 sums; top-k/top-p filtering is
``cpu_filter``'s, which gives ``sampler.filter_logits``'s logits);
what is exact or sequential in ATen's CPU kernels is plain C++ here: the counter hash, the float64
cumsums (in order from 0, as ``cumsum_`` accumulates) and the searches. ``tests/engine/
test_cpu_sampler.py`` compares both over greedy, hot, top-k and top-p rows and padded vocabularies.
Built with the other CPU kernels (``cpu_attention.kernel``); without a compiler the engine keeps the
Python sampler.
"""

from __future__ import annotations

import torch

from gambit.engine import cpu_attention
from gambit.engine.sampler import CDF_BLOCK, SamplingBatch

SOURCE = r"""
static constexpr uint64_t SAMPLE_GOLDEN = 0x9E3779B97F4A7C15ULL;  // sampler.py's _GOLDEN, _C1, _C2
static constexpr uint64_t SAMPLE_C1 = 0xBF58476D1CE4E5B9ULL;
static constexpr uint64_t SAMPLE_C2 = 0x94D049BB133111EBULL;

// splitmix64's finaliser; unsigned arithmetic wraps as torch's int64 ops do, and >> is logical (_srl)
static inline uint64_t sample_mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * SAMPLE_C1;
  x = (x ^ (x >> 27)) * SAMPLE_C2;
  return x ^ (x >> 31);
}

// sampler.uniforms(seeds, counters, 1)[:, 0]: integer hashing and exact conversions, so plain C++
// gives its very bits (the double is exact; the cast to float rounds to nearest, as .to() does)
static inline float sample_uniform(int64_t seed, int64_t counter) {
  const uint64_t h = sample_mix64(sample_mix64(uint64_t(seed) * SAMPLE_GOLDEN + 0) + uint64_t(counter));
  const uint64_t x = sample_mix64(h + 1 * SAMPLE_GOLDEN);
  const float u = static_cast<float>(static_cast<double>(x >> 11) * (1.0 / double(uint64_t(1) << 53)));
  return std::min(std::max(u, 1e-12f), 1.0f - 5.9604644775390625e-08f);  // clamp(1e-12, 1 - 2^-24)
}

// One row's draw from its exp weights w[0, V) (zero past V up to nb blocks of `block`) and their block
// sums: the block whose float64 running total first exceeds u * total, then the entry inside it (its
// running sums in float64 plus the blocks' before it). bcdf holds nb doubles.
static int64_t sample_row(const float* w, int64_t V, const float* bsum, int64_t nb, int64_t block, float u,
                          double* bcdf) {
  double cum = 0.0;
  for (int64_t i = 0; i < nb; ++i) bcdf[i] = cum += static_cast<double>(bsum[i]);
  const double x = static_cast<double>(u) * bcdf[nb - 1];
  int64_t blk = std::upper_bound(bcdf, bcdf + nb, x) - bcdf;
  blk = std::min(blk, nb - 1);
  const double prefix = blk > 0 ? bcdf[blk - 1] : 0.0;
  const float* inner = w + blk * block;
  const int64_t n = std::min(block, V - blk * block);  // the padding's zeros add nothing and are never taken
  // the running sums are non-decreasing, so upper_bound's answer is the first one above x: stop there
  cum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    cum += static_cast<double>(inner[i]);
    if (cum + prefix > x) return std::min(blk * block + i, V - 1);
  }
  int64_t last = 0;  // rounding put x at or past the block's last sum: its last positive entry
  for (int64_t i = 0; i < n; ++i)
    if (inner[i] > 0) last = i;
  return std::min(blk * block + last, V - 1);
}

// A row's largest value, NaN if it holds one (amax's answer; the sign of a zero maximum may differ from
// amax's, which no caller can see: x - (+0) and x - (-0) differ only at x = 0, whose exp is 1 either way,
// and -0 == +0 for argmax_row). Four vectors a pass: the max is exact in any order.
static float sample_row_max(const float* x, int64_t V) {
  float m = -std::numeric_limits<float>::infinity();
  bool nan = false;
  int64_t v = 0;
#ifdef __AVX512F__
  __m512 m0 = _mm512_set1_ps(m), m1 = m0, m2 = m0, m3 = m0;
  __mmask16 nm = 0;
  for (; v + 64 <= V; v += 64) {
    const __m512 a = _mm512_loadu_ps(x + v), b = _mm512_loadu_ps(x + v + 16);
    const __m512 c = _mm512_loadu_ps(x + v + 32), d = _mm512_loadu_ps(x + v + 48);
    nm |= _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(c, d, _CMP_UNORD_Q);
    m0 = _mm512_max_ps(a, m0), m1 = _mm512_max_ps(b, m1);  // a NaN lane keeps the accumulator's (nm saw it)
    m2 = _mm512_max_ps(c, m2), m3 = _mm512_max_ps(d, m3);
  }
  for (; v + 16 <= V; v += 16) {
    const __m512 a = _mm512_loadu_ps(x + v);
    nm |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
    m0 = _mm512_max_ps(a, m0);
  }
  m = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
  nan = nm != 0;
#endif
  for (; v < V; ++v) {
    nan = nan || std::isnan(x[v]);
    m = x[v] > m ? x[v] : m;
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : m;
}

// One row's argmax as ATen's CPU kernel answers it (and topk(1)'s pick): the first NaN if the row holds
// one (NaN ranks above every number), else the first index of the largest value. Exact: comparisons only.
static int64_t argmax_row(const float* x, int64_t V) {
  const float m = sample_row_max(x, V);
  const bool nan = std::isnan(m);
  int64_t v = 0;
#ifdef __AVX512F__
  const __m512 mv = _mm512_set1_ps(m);
  for (; v + 16 <= V; v += 16) {
    const __m512 a = _mm512_loadu_ps(x + v);
    const __mmask16 hit = nan ? _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q)
                              : _mm512_cmp_ps_mask(a, mv, _CMP_EQ_OQ);
    if (hit) return v + __builtin_ctz(hit);
  }
#endif
  for (; v < V; ++v)
    if (nan ? std::isnan(x[v]) : x[v] == m) return v;
  return 0;
}

// logits.argmax(-1) for float32 logits [..., V] with V > 0: ATen's answer (argmax_row) at a fraction of
// its cost (ATen's index reduction is scalar: ~1.3 ms for 16 rows of a 49k vocabulary on one thread,
// ~0.1 ms here), rows split over the threads when they are long.
torch::Tensor argmax_rows(torch::Tensor logits) {
  NoGil no_gil;
  TORCH_CHECK(logits.scalar_type() == at::kFloat && logits.dim() >= 1 && logits.size(-1) > 0,
              "argmax_rows: float32 rows of at least one value");
  auto x = logits.contiguous();
  const int64_t V = x.size(-1), N = x.numel() / V;
  auto shape = x.sizes().vec();
  shape.pop_back();
  auto out = at::empty(shape, x.options().dtype(at::kLong));
  const float* xp = x.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  at::parallel_for(0, N, row_grain(V), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) op[b] = argmax_row(xp + b * V, V);
  });
  return out;
}

// sampler._invert_cdf_ (w overwritten). The float work stays in ATen (exp, the blocks' pairwise fp32
// sums); the rest is exact or sequential, as ATen's CPU kernels do it: the float64 cumsums accumulate
// in order from 0 (cpu_cum_base_kernel), searchsorted(right=True) is the first entry > x, and the
// inner cumsum gets the block's prefix added after (cumsum_, then add_).
// A row whose largest scaled value is not finite (+inf: logits / a tiny temperature overflowed; NaN; all
// -inf) has NaN or no weights: it takes its logits' argmax instead (argmax_row of `logits`), T -> 0's limit.
static at::Tensor sample_invert_cdf(at::Tensor w, const int64_t* seeds, const int64_t* counters,
                                    int64_t block, const at::Tensor& logits) {
  const int64_t B = w.size(0), V = w.size(1);
  auto top = w.amax(-1, true);
  w.sub_(top).exp_();
  auto topc = top.contiguous();
  const float* tp = topc.data_ptr<float>();
  auto lc = logits.contiguous();
  const float* lp = lc.data_ptr<float>();
  const int64_t nb = (V + block - 1) / block;
  if (nb * block != V) w = at::constant_pad_nd(w, {0, nb * block - V}, 0);
  auto wc = w.contiguous();
  auto bsum = wc.view({B, nb, block}).sum(-1).contiguous();
  auto out = at::empty({B}, at::kLong);
  const float* wp = wc.data_ptr<float>();
  const float* sp = bsum.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  std::vector<double> bcdf(nb);
  for (int64_t b = 0; b < B; ++b) {
    const float u = sample_uniform(seeds[b], counters[b]);
    const float* wr = wp + b * nb * block;
    op[b] = std::isfinite(tp[b]) ? sample_row(wr, V, sp + b * nb, nb, block, u, bcdf.data())
                                 : argmax_row(lp + b * V, V);
  }
  return out;
}

// sampler.sample(logits, SamplingBatch(temperature, top_k, top_p, seeds, counters, filtered))
torch::Tensor sample_tokens(torch::Tensor logits, torch::Tensor temperature, torch::Tensor top_k,
                            torch::Tensor top_p, torch::Tensor seeds, torch::Tensor counters, bool filtered,
                            int64_t block) {
  NoGil no_gil;
  logits = logits.to(at::kFloat);
  auto hot = at::gt(temperature, 0);
  const bool all_hot = hot.all().item<bool>();
  if (!all_hot && !hot.any().item<bool>()) return argmax_rows(logits);
  auto t = all_hot ? temperature : at::where(hot, temperature, at::scalar_tensor(1.0, temperature.options()));
  auto scaled = at::div(logits, t.unsqueeze(1));
  if (filtered) scaled = filter_rows_impl(scaled, top_k, top_p, /*inplace=*/true);
  auto sc = seeds.contiguous(), cc = counters.contiguous();
  auto sampled = sample_invert_cdf(scaled, sc.data_ptr<int64_t>(), cc.data_ptr<int64_t>(), block, logits);
  return all_hot ? sampled : at::where(hot, sampled, argmax_rows(logits));
}

"""


def sample(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """``sampler.sample`` through the compiled kernel (CPU; the caller checks ``available``)."""
    return cpu_attention.kernel().sample_tokens(logits, batch.temperature, batch.top_k, batch.top_p,
                                                batch.seeds, batch.counters, batch.filtered, CDF_BLOCK)


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(-1)``, the same indices, through the compiled kernel where it serves (float32 on
    the CPU); ATen's otherwise."""
    k = cpu_attention.kernel() if logits.device.type == "cpu" and logits.dtype == torch.float32 else None
    fn = getattr(k, "argmax_rows", None)  # None: no kernel, or another commit's (tools/kernel_ab.py)
    if fn is None or logits.dim() == 0 or logits.size(-1) == 0:
        return logits.argmax(-1)
    return fn(logits)


def available(device: torch.device) -> bool:
    return device.type == "cpu" and cpu_attention.kernel() is not None

