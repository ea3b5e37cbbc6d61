"""``sampler.sample`` in one C++ call, drawing bit for bit the same tokens.

At a small vocabulary the sampler is ~40 tiny tensor ops a step, and their dispatch, not the
arithmetic, was its cost: ~0.4 ms a step at 96 rows of the shipped target's 100 symbols (in a search,
cache-cold after the forward, 0.8 ms of an ~11 ms step). The float work keeps the ATen calls
``sampler.py`` makes (temperature division, top-k/top-p filtering, max, exp, the blocks' fp32 sums);
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

// sampler._nucleus and filter_logits
static at::Tensor sample_filter(const at::Tensor& logits, const at::Tensor& top_k,
                                const at::Tensor& top_p) {
  const int64_t V = logits.size(-1);
  const bool needs = at::bitwise_or(at::bitwise_and(at::gt(top_k, 0), at::lt(top_k, V)).any(),
                                    at::lt(top_p, 1).any()).item<bool>();
  if (!needs) return logits;
  auto sorted = logits.sort(-1, true);
  auto sl = std::get<0>(sorted), order = std::get<1>(sorted);
  auto k = at::where(at::gt(top_k, 0), top_k.clamp_max(V), at::scalar_tensor(V, top_k.options()));
  auto rank = at::arange(V, sl.options().dtype(at::kLong)).unsqueeze(0);
  auto remove = at::ge(rank, k.unsqueeze(1));
  auto probs = sl.masked_fill(remove, -std::numeric_limits<double>::infinity()).softmax(-1);
  remove.bitwise_or_(at::gt(at::sub(probs.cumsum(-1), probs), top_p.unsqueeze(1)));
  remove.select(1, 0).fill_(false);
  return logits.masked_fill(at::zeros_like(remove).scatter(1, order, remove),
                            -std::numeric_limits<double>::infinity());
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

// sampler._invert_cdf_ (w overwritten). The float work stays in ATen (exp, the blocks' pairwise fp32
// sums); the rest is exact or sequential, as ATen's CPU kernels do it: the float64 cumsums accumulate
// in order from 0 (cpu_cum_base_kernel), searchsorted(right=True) is the first entry > x, and the
// inner cumsum gets the block's prefix added after (cumsum_, then add_).
static at::Tensor sample_invert_cdf(at::Tensor w, const int64_t* seeds, const int64_t* counters,
                                    int64_t block) {
  const int64_t B = w.size(0), V = w.size(1);
  w.sub_(w.amax(-1, true)).exp_();
  const int64_t nb = (V + block - 1) / block;
  if (nb * block != V) w = at::constant_pad_nd(w, {0, nb * block - V}, 0);
  auto wc = w.contiguous();
  auto bsum = wc.view({B, nb, block}).sum(-1).contiguous();
  auto out = at::empty({B}, at::kLong);
  const float* wp = wc.data_ptr<float>();
  const float* sp = bsum.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  std::vector<double> bcdf(nb);
  for (int64_t b = 0; b < B; ++b)
    op[b] = sample_row(wp + b * nb * block, V, sp + b * nb, nb, block, sample_uniform(seeds[b], counters[b]),
                       bcdf.data());
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
  if (!all_hot && !hot.any().item<bool>()) return logits.argmax(-1);
  auto t = all_hot ? temperature : at::where(hot, temperature, at::scalar_tensor(1.0, temperature.options()));
  auto scaled = at::div(logits, t.unsqueeze(1));
  if (filtered) scaled = sample_filter(scaled, top_k, top_p);
  auto sc = seeds.contiguous(), cc = counters.contiguous();
  auto sampled = sample_invert_cdf(scaled, sc.data_ptr<int64_t>(), cc.data_ptr<int64_t>(), block);
  return all_hot ? sampled : at::where(hot, sampled, logits.argmax(-1));
}

// ---- the whole sampling step in plain loops (sample_step): the same floats as the ATen calls above ----
// at::exp of a float tensor on this build is MKL VML's single-precision exp (ATen's vml::vexp asks for
// it in this mode: high accuracy, denormals kept, errors ignored). Weak: a torch build without MKL still
// loads the extension, and the step then keeps the ATen calls.
extern "C" void vmsExp(int n, const float* a, float* r, long long mode) __attribute__((weak));
// VML_HA | VML_ERRMODE_IGNORE | VML_FTZDAZ_OFF
static constexpr long long SAMPLE_VML_MODE = 0x2LL | 0x100LL | 0x140000LL;

static void sample_exp(float* x, int64_t n) {  // in place, as exp_
  for (int64_t i = 0; i < n; i += (1 << 30))
    vmsExp(static_cast<int>(std::min<int64_t>(n - i, 1 << 30)), x + i, x + i, SAMPLE_VML_MODE);
}

// Whether sample_exp gives at::exp's floats here (every magnitude a sampler feeds it, exp's limits,
// tails of odd lengths at odd offsets); checked once.
static bool sample_exp_exact() {
  static bool ok = false;
  static std::once_flag once;
  std::call_once(once, [] {
    if (vmsExp == nullptr) return;
    const int64_t n = 2 * 49152 + 77;
    auto x = at::empty({n}, at::kFloat);
    float* p = x.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i)
      p[i] = -std::fabs(std::sin(0.37f * i) * std::pow(2.f, static_cast<float>(i % 37) / 4 - 6));
    for (int64_t i = 0; i < n; i += 101) p[i] = -80.f - static_cast<float>(i % 3001) * 0.01f;  // denormals
    p[0] = 0.f, p[1] = -0.f, p[2] = -std::numeric_limits<float>::infinity(), p[3] = -104.f, p[4] = 1e-30f;
    p[5] = 3.5f, p[6] = 88.f, p[7] = -1e-7f;
    bool same = true;  // against at::exp of each piece itself: ATen may take other paths for small sizes
    const int64_t lens[] = {n, 49152, 9600, 256, 100, 37, 1};
    for (int64_t len : lens) {
      for (int64_t off : {int64_t(0), int64_t(5)}) {
        if (off + len > n) continue;
        auto piece = x.slice(0, off, off + len).clone();
        auto ref = at::exp(piece);
        sample_exp(piece.data_ptr<float>(), len);
        same = same && at::equal(piece, ref);
      }
    }
    ok = same;
  });
  return ok;
}

// Whether aten_sum8 over `block` floats gives the blocks' sums of `w.view({B, nb, block}).sum(-1)` here.
static bool sample_sum_exact(int64_t block) {
  static std::mutex mu;
  static std::map<int64_t, bool> known;
  std::lock_guard<std::mutex> lock(mu);
  auto it = known.find(block);
  if (it != known.end()) return it->second;
  bool ok = block >= 8;
  for (auto shape : {std::pair<int64_t, int64_t>{1, 1}, {3, 5}, {96, 1}, {16, 3}}) {  // (rows, blocks a row)
    const int64_t B = shape.first, nb = shape.second;
    auto w = at::empty({B, nb * block}, at::kFloat);
    float* p = w.data_ptr<float>();
    for (int64_t i = 0; i < B * nb * block; ++i)
      p[i] = (i % 7 == 3) ? 0.f
                          : std::fabs(std::sin(0.61f * i)) * std::pow(2.f, -static_cast<float>(i % 41) / 2);
    auto ref = w.view({B, nb, block}).sum(-1).contiguous();
    const float* r = ref.data_ptr<float>();
    for (int64_t i = 0; ok && i < B * nb; ++i) ok = aten_sum8(p + i * block, block) == r[i];
  }
  known[block] = ok;
  return ok;
}

// A row's largest value, NaN if it holds one (amax's answer; the sign of a zero maximum may differ from
// amax's, which no caller can see: x - (+0) and x - (-0) differ only at x = 0, whose exp is 1 either way).
static float sample_row_max(const float* x, int64_t V) {
  float m = -std::numeric_limits<float>::infinity();
  bool nan = false;
  int64_t v = 0;
#ifdef __AVX512F__
  __m512 mv = _mm512_set1_ps(m);
  __mmask16 nm = 0;
  for (; v + 16 <= V; v += 16) {
    const __m512 a = _mm512_loadu_ps(x + v);
    nm |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
    mv = _mm512_max_ps(a, mv);  // a NaN lane of a keeps mv's lane (nm has seen it)
  }
  m = _mm512_reduce_max_ps(mv);
  nan = nm != 0;
#endif
  for (; v < V; ++v) {
    nan = nan || std::isnan(x[v]);
    m = x[v] > m ? x[v] : m;
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : m;
}

// topk(1)'s entry of a row: its first largest value, NaN above every number (ATen's CPU topk for k = 1
// keeps a one-entry heap and replaces it only by a strictly larger entry).
static int64_t sample_top1(const float* x, int64_t V) {
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

// Whether sample_top1 picks at::topk(1)'s entries at width V here (rows of ties, NaNs, -inf); once per V.
static bool sample_top1_exact(int64_t V) {
  static std::mutex mu;
  static std::map<int64_t, bool> known;
  std::lock_guard<std::mutex> lock(mu);
  auto it = known.find(V);
  if (it != known.end()) return it->second;
  const int64_t B = 6;
  auto x = at::empty({B, V}, at::kFloat);
  float* p = x.data_ptr<float>();
  for (int64_t i = 0; i < B * V; ++i) p[i] = std::round(std::sin(0.77f * i) * 3.f);  // many ties
  for (int64_t v = 0; v < V; ++v) p[v] = 0.f, p[V + v] = -std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  p[2 * V + V / 2] = nan, p[2 * V + V - 1] = nan;
  p[3 * V + V - 1] = 9.f;
  auto top = x.topk(1, -1);
  const int64_t* ti = std::get<1>(top).data_ptr<int64_t>();
  bool ok = true;
  for (int64_t b = 0; ok && b < B; ++b) ok = sample_top1(p + b * V, V) == ti[b];
  known[V] = ok;
  return ok;
}

// The plain-loop step serves here (a probe of each piece matched ATen in this process).
bool fused_sampler_exact(int64_t block) {
  NoGil no_gil;
  return sample_exp_exact() && sample_sum_exact(block);
}

// sampler.sample and top_logprobs of one step in one call, for a batch whose every row samples
// (temperature > 0 in float32) without top-k / top-p: the same tokens and log-probabilities, the
// sampler's tensors never built (temperature, seeds and counters come as lists). Per row: logits /
// temperature, less the row's max, exp (MKL's, as at::exp), block sums in ATen's order (aten_sum8;
// the padding's zeros as ATen sums them), then sample_row. The log-probabilities (want > 0) are
// log_softmax's (ATen's call) at the tokens, and its `top` largest (0: none; topk's picks). Tokens
// come back empty where this does not serve (a greedy row): the caller takes the ATen path.
std::tuple<std::vector<int64_t>, std::vector<double>, at::Tensor, at::Tensor> sample_step(
    torch::Tensor logits, std::vector<double> temperature, std::vector<int64_t> seeds,
    std::vector<int64_t> counters, int64_t want, int64_t top, int64_t block) {
  NoGil no_gil;
  const int64_t B = logits.size(0), V = logits.size(1);
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.device().is_cpu(),
              "sample_step: float32 CPU logits [B, V]");
  TORCH_CHECK(static_cast<int64_t>(temperature.size()) == B && static_cast<int64_t>(seeds.size()) == B &&
              static_cast<int64_t>(counters.size()) == B, "sample_step: one setting per row");
  std::tuple<std::vector<int64_t>, std::vector<double>, at::Tensor, at::Tensor> none;
  for (double t : temperature)
    if (!(static_cast<float>(t) > 0.f)) return none;
  const auto lg = logits.contiguous();
  const float* lp = lg.data_ptr<float>();
  auto w = at::empty({B, V}, at::kFloat);
  float* wp = w.data_ptr<float>();
  const int64_t nb = (V + block - 1) / block;
  std::vector<int64_t> tokens(B);
  // rows split over the threads as ATen splits its large steps (each row's floats do not depend on it)
  at::parallel_for(0, B, std::max<int64_t>(1, at::internal::GRAIN_SIZE / std::max<int64_t>(V, 1)),
                   [&](int64_t begin, int64_t end) {
    std::vector<float> bsum(nb), pad(block);
    std::vector<double> bcdf(nb);
    for (int64_t b = begin; b < end; ++b) {
      const float t = static_cast<float>(temperature[b]);
      const float* x = lp + b * V;
      float* y = wp + b * V;
      for (int64_t v = 0; v < V; ++v) y[v] = x[v] / t;
      const float m = sample_row_max(y, V);
      for (int64_t v = 0; v < V; ++v) y[v] = y[v] - m;
    }
    sample_exp(wp + begin * V, (end - begin) * V);  // one call for the rows: MKL's per-call cost is ~0.2 us
    for (int64_t b = begin; b < end; ++b) {
      const float* y = wp + b * V;
      for (int64_t i = 0; i < nb; ++i) {
        const int64_t n = std::min(block, V - i * block);
        if (n == block) {
          bsum[i] = aten_sum8(y + i * block, block);
        } else {  // the row's last block, zero-padded as ATen pads it
          std::fill(pad.begin(), pad.end(), 0.f);
          std::copy(y + i * block, y + i * block + n, pad.begin());
          bsum[i] = aten_sum8(pad.data(), block);
        }
      }
      tokens[b] = sample_row(y, V, bsum.data(), nb, block, sample_uniform(seeds[b], counters[b]),
                             bcdf.data());
    }
  });
  std::vector<double> chosen;
  at::Tensor vals, ids;
  if (want > 0) {
    auto ls = at::log_softmax(lg, -1).contiguous();
    const float* l = ls.data_ptr<float>();
    chosen.resize(B);
    for (int64_t b = 0; b < B; ++b) chosen[b] = l[b * V + tokens[b]];  // gather
    if (top == 0) {
      // the chosen tokens' log-probabilities only
    } else if (top == 1 && sample_top1_exact(V)) {
      vals = at::empty({B, 1}, at::kFloat), ids = at::empty({B, 1}, at::kLong);
      for (int64_t b = 0; b < B; ++b) {
        const int64_t j = sample_top1(l + b * V, V);
        vals.data_ptr<float>()[b] = l[b * V + j], ids.data_ptr<int64_t>()[b] = j;
      }
    } else {
      auto tk = ls.topk(std::min(top, V), -1);
      vals = std::get<0>(tk), ids = std::get<1>(tk);
    }
  }
  return {tokens, chosen, vals, ids};
}
"""


def sample(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """``sampler.sample`` through the compiled kernel (CPU; the caller checks ``available``)."""
    return cpu_attention.kernel().sample_tokens(logits, batch.temperature, batch.top_k, batch.top_p,
                                                batch.seeds, batch.counters, batch.filtered, CDF_BLOCK)


def available(device: torch.device) -> bool:
    return device.type == "cpu" and cpu_attention.kernel() is not None


def step_kernel(device: torch.device, vocab_size: int):
    """``sample_step`` where it gives the ATen path's tokens and log-probabilities in this process
    (CPU, the kernels built, MKL's exp and ATen's block sums matched by their probes), else None."""
    k = cpu_attention.kernel() if device.type == "cpu" else None
    if k is None or vocab_size < 1 or not hasattr(k, "sample_step") or not k.fused_sampler_exact(CDF_BLOCK):
        return None
    return k.sample_step
