"""The whole sampling step in plain loops (``sample_step``): ``cpu_sampler``'s draw and ``top_logprobs``
in one call, with ATen's floats, for a batch whose every row samples (top-k / top-p through ``cpu_filter``).

With the layer loop in C++, a batch-1 step of the shipped target spent ~10% of its time in the
sampler's ~12 ATen calls, ``top_logprobs``' three and the tensors built for them. Here the division by
temperature and the row maximum are exact, ``exp`` is MKL VML's (what ``at::exp`` runs on these builds),
the 256-entry block sums follow ATen's cascade (``cpu_decoder``'s ``aten_sum8``), and the draw is
``cpu_sampler``'s ``sample_row``; the log-probabilities come from each row's maximum and log-sum as
``log_softmax`` computes them and the top entries are ``topk``'s picks (``cpu_logprobs``; ATen's
``log_softmax`` into a reused block where those do not serve). Each piece serves only after a probe in
this process matched ATen (``fused_sampler_exact``, ``sample_top1_exact`` and ``cpu_logprobs``' two);
otherwise the engine keeps the ATen calls. Greedy rows take the compiled argmax. Compiled with the
other CPU kernels (after ``cpu_decoder``, ``cpu_filter``, ``cpu_sampler`` and ``cpu_logprobs``, whose
functions it calls).
"""

from __future__ import annotations

import torch

from gambit.engine import cpu_attention
from gambit.engine.sampler import CDF_BLOCK

SOURCE = r"""
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

// The shift below which sample_exp gives +0 here: exp(x) for every x <= SAMPLE_EXP_ZERO rounds to +0 (the
// smallest denormal is exp(-103.28)); MKL's exp takes a slow path for such underflows (~12x a finite value's
// time), so a row's entries that far below its maximum (a cold row: T well below 1, no filter) are written
// as 0 without it. Every float in [-112, -104], 4096 of each lower binade, -FLT_MAX and -inf are checked
// once; -inf otherwise (only -inf entries then skip exp: exp(-inf) = 0 exactly).
static constexpr float SAMPLE_EXP_ZERO = -104.f;
static float sample_exp_zero_below() {
  static float below = -std::numeric_limits<float>::infinity();
  static std::once_flag once;
  std::call_once(once, [] {
    if (vmsExp == nullptr) return;
    std::vector<float> x;
    uint32_t lo, hi;
    const float a = -SAMPLE_EXP_ZERO, b = 112.f;
    std::memcpy(&lo, &a, 4), std::memcpy(&hi, &b, 4);
    for (uint32_t u = lo; u <= hi; ++u) {
      float f;
      std::memcpy(&f, &u, 4);
      x.push_back(-f);
    }
    for (uint32_t e = 134; e < 255; ++e)  // binades from 128 up to FLT_MAX's
      for (uint32_t j = 0; j < 4096; ++j) {
        const uint32_t u = (e << 23) | (j * 2047u % (1u << 23));
        float f;
        std::memcpy(&f, &u, 4);
        x.push_back(-f);
      }
    x.push_back(-std::numeric_limits<float>::max()), x.push_back(-std::numeric_limits<float>::infinity());
    sample_exp(x.data(), static_cast<int64_t>(x.size()));
    bool ok = true;
    for (float r : x) ok = ok && r == 0.f && !std::signbit(r);
    if (ok) below = SAMPLE_EXP_ZERO;
  });
  return below;
}

// Whether aten_sum8 over `block` floats gives the blocks' sums of `w.view({B, nb, block}).sum(-1)` here.
static bool sample_sum_exact(int64_t block) {
  static std::mutex mu;
  static std::map<int64_t, bool> known;
  return probe_once(known, mu, block, [block] {
    bool ok = block >= 8;
    // (rows, blocks a row)
    for (auto shape : {std::pair<int64_t, int64_t>{1, 1}, {3, 5}, {96, 1}, {16, 3}}) {
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
    return ok;
  });
}

// topk(1)'s entry of a row is its first largest value, NaN above every number (ATen's CPU topk for k = 1
// keeps a one-entry heap and replaces it only by a strictly larger entry): argmax_row's (cpu_sampler, with
// sample_row_max).
// Whether argmax_row picks at::topk(1)'s entries at width V here (rows of ties, NaNs, -inf); once per V.
static bool sample_top1_exact(int64_t V) {
  static std::mutex mu;
  static std::map<int64_t, bool> known;
  return probe_once(known, mu, V, [V] {
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
    for (int64_t b = 0; ok && b < B; ++b) ok = argmax_row(p + b * V, V) == ti[b];
    return ok;
  });
}

// A [B, V] float block kept by the calling thread across steps (grown, never shrunk): a fresh one at
// SmolLM2's vocabulary and batch 64 (12.6 MB) came from mmap and was faulted in page by page every step.
static at::Tensor step_scratch(at::Tensor& buf, int64_t B, int64_t V) {
  if (!buf.defined() || buf.numel() < B * V) buf = at::empty({B * V}, at::kFloat);
  return buf.narrow(0, 0, B * V).view({B, V});
}

// The plain-loop step serves here (a probe of each piece matched ATen in this process).
bool fused_sampler_exact(int64_t block) {
  NoGil no_gil;
  return sample_exp_exact() && sample_sum_exact(block);
}

// exp(y - m) in place over a row (m its finite maximum) where only entries with y - m > L go through
// sample_exp, packed together (exp is elementwise: each value's result is its own, whatever its
// neighbours; sample_exp_exact checks pieces at every offset); the others become 0 without it, exp's value
// for them (L: sample_exp_zero_below's, or -inf). MKL takes its slow special-value path for -inf (a block
// of -inf: ~3x the time of finite values) and for underflows (~12x), and a nucleus leaves most of a row at
// -inf, a cold row most of it below L. Packing and unpacking are branch-free (kept entries lie anywhere in a
// row: a branch an entry mispredicted often enough to cost more than the exp saved). kept: scratch, grown.
static void sample_exp_kept(float* y, int64_t V, float m, float L, std::vector<float>& kept) {
  if (static_cast<int64_t>(kept.size()) < V + 16) kept.resize(V + 16);
  float* k = kept.data();
  int64_t n = 0, v = 0;
#ifdef __AVX512F__
  const __m512 mv = _mm512_set1_ps(m), lv = _mm512_set1_ps(L);
  for (; v + 16 <= V; v += 16) {
    const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(y + v), mv);
    const __mmask16 in = _mm512_cmp_ps_mask(d, lv, _CMP_GT_OQ);
    _mm512_storeu_ps(k + n, _mm512_maskz_compress_ps(in, d));  // no compress to memory
    n += __builtin_popcount(in);
  }
#endif
  for (; v < V; ++v) {
    const float d = y[v] - m;
    k[n] = d, n += d > L;
  }
  sample_exp(k, n);
  int64_t j = 0;
  v = 0;
#ifdef __AVX512F__
  for (; v + 16 <= V; v += 16) {
    const __mmask16 in = _mm512_cmp_ps_mask(_mm512_sub_ps(_mm512_loadu_ps(y + v), mv), lv, _CMP_GT_OQ);
    _mm512_storeu_ps(y + v, _mm512_maskz_expand_ps(in, _mm512_loadu_ps(k + j)));
    j += __builtin_popcount(in);
  }
#endif
  for (; v < V; ++v) {
    const bool in = y[v] - m > L;
    y[v] = in ? k[j] : 0.f, j += in;
  }
}

// How many of a row's entries lie at or below m + L (y - m <= L: exp gives them 0).
static int64_t sample_count_below(const float* y, int64_t V, float m, float L) {
  int64_t n = 0, v = 0;
#ifdef __AVX512F__
  const __m512 mv = _mm512_set1_ps(m), lv = _mm512_set1_ps(L);
  for (; v + 16 <= V; v += 16)
    n += __builtin_popcount(_mm512_cmp_ps_mask(_mm512_sub_ps(_mm512_loadu_ps(y + v), mv), lv, _CMP_LE_OQ));
#endif
  for (; v < V; ++v) n += y[v] - m <= L;
  return n;
}

// For an unfiltered row (maximum m, smallest entry lo): sample_exp_kept's L where the row is cold (at least
// 1/128 of it at or below m + L), else NaN (one exp over the row). Packing costs two passes over the row;
// below ~1% of entries the slow path costs less (`tools/sampler_speed.py 64 49152 3 1 1.0 4 0.1`: a row
// at T = 0.1). The probe runs only once a row reaches that far (~30 ms, once per process).
static float sample_row_shift(const float* y, int64_t V, float m, float lo) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  if (!std::isfinite(m) || !(lo - m <= SAMPLE_EXP_ZERO)) return nan;
  const float L = sample_exp_zero_below();
  return sample_count_below(y, V, m, L) * 128 >= V ? L : nan;
}

// y = x / t over a row (each quotient exactly rounded, as ATen's division), returning the smallest y
// (NaNs aside) for sample_row_shift; found in the division's pass (a pass of its own cost warm rows ~3%).
static float sample_scale_row(const float* x, float* y, int64_t V, float t) {
  float lo = std::numeric_limits<float>::infinity();
  int64_t v = 0;
#ifdef __AVX512F__
  const __m512 tv = _mm512_set1_ps(t);
  __m512 l0 = _mm512_set1_ps(lo), l1 = l0;
  for (; v + 32 <= V; v += 32) {
    const __m512 a = _mm512_div_ps(_mm512_loadu_ps(x + v), tv);
    const __m512 b = _mm512_div_ps(_mm512_loadu_ps(x + v + 16), tv);
    _mm512_storeu_ps(y + v, a), _mm512_storeu_ps(y + v + 16, b);
    l0 = _mm512_min_ps(l0, a), l1 = _mm512_min_ps(l1, b);
  }
  lo = _mm512_reduce_min_ps(_mm512_min_ps(l0, l1));
#endif
  for (; v < V; ++v) y[v] = x[v] / t, lo = y[v] < lo ? y[v] : lo;
  return lo;
}

// exp(y - m) over each row of y [B, V] (m the row's maximum) in place, as the step computes it for an
// unfiltered row (sample_exp_kept for a cold one): tests compare it to ATen's.
at::Tensor sample_exp_rows(at::Tensor y) {
  TORCH_CHECK(y.dim() == 2 && y.scalar_type() == at::kFloat && y.is_contiguous(), "float32 [B, V] rows");
  const int64_t B = y.size(0), V = y.size(1);
  std::vector<float> kept;
  for (int64_t b = 0; b < B; ++b) {
    float* r = y.data_ptr<float>() + b * V;
    const float lo = sample_scale_row(r, r, V, 1.f);  // x / 1 is x: only the smallest entry is wanted
    const float m = sample_row_max(r, V);
    const float L = sample_row_shift(r, V, m, lo);
    if (!std::isnan(L)) {
      sample_exp_kept(r, V, m, L, kept);
    } else {
      for (int64_t v = 0; v < V; ++v) r[v] = r[v] - m;
      sample_exp(r, V);
    }
  }
  return y;
}

// The scaled rows [B, V] filtered in place as sampler.sample filters them (cpu_filter's filter_rows_impl).
static void sample_filter_block(at::Tensor& w, const std::vector<int64_t>& top_k,
                                const std::vector<double>& top_p) {
  auto k = at::tensor(top_k, at::kLong);
  auto p = at::tensor(std::vector<float>(top_p.begin(), top_p.end()), at::kFloat);
  auto out = filter_rows_impl(w, k, p, /*inplace=*/true);
  if (!out.is_same(w)) w.copy_(out);  // the ATen filter (its probe failed here) gave a new block
}

// sampler.sample and top_logprobs of one step in one call, for a batch whose every row samples
// (temperature > 0 in float32): the same tokens and log-probabilities, the sampler's tensors never built
// (temperature, seeds, counters, top_k and top_p come as lists; top_k / top_p empty: no row filters).
// Per row: logits / temperature, less the row's max, exp (MKL's, as at::exp), block sums in ATen's order
// (aten_sum8; the padding's zeros as ATen sums them), then sample_row; rows with top-k / top-p are
// filtered between the division and the max (cpu_filter, over the whole scaled block, as the sampler
// does). The log-probabilities (want > 0) are log_softmax's (ATen's call) at the tokens, and its `top`
// largest (0: none; sampler.top_entries' order, ties by ascending id). A greedy row (temperature 0) takes
// its argmax (argmax_row, ATen's).
std::tuple<std::vector<int64_t>, std::vector<double>, at::Tensor, at::Tensor> sample_step(
    torch::Tensor logits, std::vector<double> temperature, std::vector<int64_t> seeds,
    std::vector<int64_t> counters, int64_t want, int64_t top, int64_t block, std::vector<int64_t> top_k,
    std::vector<double> top_p) {
  NoGil no_gil;
  const int64_t B = logits.size(0), V = logits.size(1);
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.device().is_cpu(),
              "sample_step: float32 CPU logits [B, V]");
  TORCH_CHECK(static_cast<int64_t>(temperature.size()) == B && static_cast<int64_t>(seeds.size()) == B &&
              static_cast<int64_t>(counters.size()) == B, "sample_step: one setting per row");
  TORCH_CHECK(top_k.size() == top_p.size() && (top_k.empty() || static_cast<int64_t>(top_k.size()) == B),
              "sample_step: top_k and top_p, one a row or none");
  bool filtered = false;
  for (size_t b = 0; b < top_k.size() && !filtered; ++b)
    filtered = (top_k[b] > 0 && top_k[b] < V) || static_cast<float>(top_p[b]) < 1.f;
  // a greedy row (temperature 0) takes its logits' argmax, as sampler.sample's where(hot, ...), and scales by
  // 1 in the filtered block (the sampler's where(hot, temperature, 1)); its draw is skipped
  std::vector<float> temp(B);
  std::vector<char> hot(B);
  bool all_hot = true;
  for (int64_t b = 0; b < B; ++b) {
    const float t = static_cast<float>(temperature[b]);
    hot[b] = t > 0.f, temp[b] = hot[b] ? t : 1.f, all_hot = all_hot && hot[b];
  }
  const auto lg = logits.contiguous();
  const float* lp = lg.data_ptr<float>();
  static thread_local at::Tensor w_buf, ls_buf;
  auto w = step_scratch(w_buf, B, V);
  float* wp = w.data_ptr<float>();
  const int64_t nb = (V + block - 1) / block;
  std::vector<int64_t> tokens(B);
  // the log-probabilities from each row's maximum and log-sum (no [B, V] block) where they are ATen's here
  const bool by_row = want > 0 && sample_logsoftmax_exact(V) &&
                      (top == 0 || (top == 1 && sample_top1_exact(V)) || sample_topk_exact(V, top));
  std::vector<RowLogSoftmax> row_lsm(by_row ? B : 0);
  std::vector<char> row_ok(by_row ? B : 0);  // a row whose maximum or log-sum is not a number: ATen's path
  if (filtered) {  // every row scaled first: one softmax call over the block in the filter, as the sampler
    at::parallel_for(0, B, row_grain(V), [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const float t = temp[b];
        const float* x = lp + b * V;
        float* y = wp + b * V;
        for (int64_t v = 0; v < V; ++v) y[v] = x[v] / t;
      }
    });
    sample_filter_block(w, top_k, top_p);
  }
  // rows split over the threads as ATen splits its large steps (each row's floats do not depend on it)
  at::parallel_for(0, B, row_grain(V), [&](int64_t begin, int64_t end) {
    std::vector<float> bsum(nb), pad(block), kept;
    std::vector<double> bcdf(nb);
    std::vector<char> packed(end - begin);  // exp taken by sample_exp_kept (read where every row samples)
    for (int64_t b = begin; b < end; ++b) {
      if (!hot[b]) continue;  // greedy: no draw
      const float* x = lp + b * V;
      float* y = wp + b * V;
      const float lo = filtered ? 0.f : sample_scale_row(x, y, V, temp[b]);
      const float m = sample_row_max(y, V);
      if (!std::isfinite(m)) {  // +inf (a tiny temperature overflowed), NaN or all -inf: the argmax, as
        hot[b] = 0;             // sampler.sample (its weights would be NaN or none)
        continue;
      }
      // exp of the entries that can be nonzero only: a filtered row's kept ones (its -inf entries give 0),
      // a cold row's above the zero shift; NaN: one exp over the row
      const float L = !filtered ? sample_row_shift(y, V, m, lo)
                                : std::isfinite(m) ? -std::numeric_limits<float>::infinity()
                                                   : std::numeric_limits<float>::quiet_NaN();
      if (!std::isnan(L)) {
        sample_exp_kept(y, V, m, L, kept);
        packed[b - begin] = 1;
        continue;
      }
      for (int64_t v = 0; v < V; ++v) y[v] = y[v] - m;
      if (!all_hot || filtered) sample_exp(y, V);
    }
    if (all_hot && !filtered) {  // the rows' exp in one call (~0.2 us a call) where none was packed
      if (std::find(packed.begin(), packed.end(), 1) == packed.end()) {
        sample_exp(wp + begin * V, (end - begin) * V);
      } else {
        for (int64_t b = begin; b < end; ++b)
          if (!packed[b - begin]) sample_exp(wp + b * V, V);
      }
    }
    for (int64_t b = begin; b < end; ++b) {
      const float* y = wp + b * V;
      for (int64_t i = 0; hot[b] && i < nb; ++i) {
        const int64_t n = std::min(block, V - i * block);
        if (n == block) {
          bsum[i] = aten_sum8(y + i * block, block);
        } else {  // the row's last block, zero-padded as ATen pads it
          std::fill(pad.begin(), pad.end(), 0.f);
          std::copy(y + i * block, y + i * block + n, pad.begin());
          bsum[i] = aten_sum8(pad.data(), block);
        }
      }
      tokens[b] = hot[b] ? sample_row(y, V, bsum.data(), nb, block, sample_uniform(seeds[b], counters[b]),
                                      bcdf.data())
                         : argmax_row(lp + b * V, V);
      if (by_row) {
        RowLogSoftmax& r = row_lsm[b];
        row_ok[b] = aten_logsoftmax_row(lp + b * V, V, &r.m, &r.s) && std::isfinite(r.m) &&
                    std::isfinite(r.s);
      }
    }
  });
  std::vector<double> chosen;
  at::Tensor vals, ids;
  if (by_row && std::all_of(row_ok.begin(), row_ok.end(), [](char ok) { return ok != 0; })) {
    chosen.resize(B);
    for (int64_t b = 0; b < B; ++b) chosen[b] = row_lsm[b](lp[b * V + tokens[b]]);
    if (top > 0) {
      vals = at::empty({B, top}, at::kFloat), ids = at::empty({B, top}, at::kLong);
      pick_top_rows(lp, B, V, top, [&](int64_t b) { return row_lsm[b]; }, vals.data_ptr<float>(),
                    ids.data_ptr<int64_t>());
    }
  } else if (want > 0) {
    auto ls = step_scratch(ls_buf, B, V);
    at::_log_softmax_out(ls, lg, 1, false);  // ATen's kernel, into the reused block
    const float* l = ls.data_ptr<float>();
    chosen.resize(B);
    for (int64_t b = 0; b < B; ++b) chosen[b] = l[b * V + tokens[b]];  // gather
    if (top == 0) {
      // the chosen tokens' log-probabilities only
    } else if ((top == 1 && sample_top1_exact(V)) || sample_topk_exact(V, top)) {
      vals = at::empty({B, top}, at::kFloat), ids = at::empty({B, top}, at::kLong);
      pick_top_rows(l, B, V, top, [](int64_t) { return RowAsIs{}; }, vals.data_ptr<float>(),
                    ids.data_ptr<int64_t>());
    } else {  // (top > V, or a probe failed here) a stable descending sort's first entries: the heap's and
      // sampler.top_entries' order (ties by ascending id, NaN first), not topk's, whose pick among ties
      // moves with k and the thread count (a trace's list changed with its batch); rare, so a full sort
      auto st = ls.sort(/*stable=*/true, -1, /*descending=*/true);
      const int64_t k = std::min(top, V);
      vals = std::get<0>(st).narrow(1, 0, k).contiguous(), ids = std::get<1>(st).narrow(1, 0, k).contiguous();
    }
  }
  return {tokens, chosen, vals, ids};
}
"""


def step_kernel(device: torch.device, vocab_size: int):
    """``sample_step`` where it gives the ATen path's tokens and log-probabilities in this process
    (CPU, the kernels built, MKL's exp and ATen's block sums matched by their probes), else None."""
    k = cpu_attention.kernel() if device.type == "cpu" else None
    if k is None or vocab_size < 1 or not hasattr(k, "sample_step") or not k.fused_sampler_exact(CDF_BLOCK):
        return None
    return k.sample_step
