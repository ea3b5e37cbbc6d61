"""A sampling step's log-probabilities without a [B, V] block (``cpu_sample_step`` calls these), in
ATen's floats: each row's maximum m and log-sum s as ATen's AVX-512 ``log_softmax`` computes them (its
entries are then (x - m) - s, one subtraction after the other), and the row's top entries in
``sampler.top_entries``' order (largest first, ties by ascending id, NaN first: the row's own, not ATen's
``topk``, whose pick among ties moves with k and the thread count) through a heap, skipping the entries
that cannot enter it sixteen at a time.

At SmolLM2's 49k vocabulary and batch 64 the ATen calls (``log_softmax`` into a fresh 12.6 MB block,
then ``topk(20)``, ~2.3 ms alone) made the step with DeepConf's top 20 take 5.6-13 ms of a ~50 ms decode
step (``tools/sampler_speed.py 64 49152 3 20``), 2.8 ms with these. Each piece serves only after a probe
in this process matched ATen's log_softmax (``sample_logsoftmax_exact``) or a stable descending sort
(``sample_topk_exact``); otherwise the step keeps ATen's calls. Compiled with the other CPU kernels, after
``cpu_decoder`` (``probe_once``, Sleef's exp) and before ``cpu_sample_step``.
"""

SOURCE = r"""
#ifdef __AVX512F__
// in libtorch_cpu: Vectorized<float>::log on AVX512 (exp's declaration is cpu_decoder's). Weak, as exp.
extern "C" __m512 Sleef_logf16_u10avx512f(__m512) __attribute__((weak));

static inline __m512 aten_maximum16(__m512 a, __m512 b) {  // vec::maximum: NaN if either lane is NaN
  const __m512 nan = _mm512_castsi512_ps(
      _mm512_mask_set1_epi32(_mm512_set1_epi32(0), _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q), -1));
  return _mm512_or_ps(_mm512_max_ps(a, b), nan);
}

template <typename Op>
static inline float aten_reduce_tree16(__m512 v, Op op) {  // VecReduceAllSIMD<float> on AVX512
  v = op(v, _mm512_shuffle_f32x4(v, v, 0x4E));
  v = op(v, _mm512_shuffle_f32x4(v, v, 0xB1));
  v = op(v, _mm512_shuffle_ps(v, v, 0x4E));
  v = op(v, _mm512_shuffle_ps(v, v, 0xB1));
  return _mm512_cvtss_f32(v);
}
#endif

// at::log_softmax's two numbers for a row of V >= 16 floats, as ATen's AVX512 kernel computes them
// (serial_vec_log_softmax_lastdim_range): the row's maximum m (vec::reduce_all of vec::maximum) and
// s = log(sum(exp(x - m))) (vec::map_reduce_all with Sleef's exp, then its log): sixteen lanes accumulated
// vector by vector, the tail's lanes blended in (Vec::set), then the four-shuffle tree. Its outputs are
// (x - m) - s, one float subtraction after the other, so a row's log-probabilities need no [B, V] block.
// False where it does not run here (no AVX512 or Sleef).
__attribute__((optimize("fp-contract=off"))) static bool aten_logsoftmax_row(const float* x, int64_t V,
                                                                             float* m_out, float* s_out) {
#ifdef __AVX512F__
  if (Sleef_expf16_u10avx512f == nullptr || Sleef_logf16_u10avx512f == nullptr || V < 16) return false;
  const int64_t full = V - V % 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (V - full)) - 1);
  __m512 acc = _mm512_loadu_ps(x);
  for (int64_t d = 16; d < full; d += 16) acc = aten_maximum16(acc, _mm512_loadu_ps(x + d));
  if (tail) acc = _mm512_mask_blend_ps(tail, acc, aten_maximum16(acc, _mm512_maskz_loadu_ps(tail, x + full)));
  const float m = aten_reduce_tree16(acc, aten_maximum16);
  const __m512 vm = _mm512_set1_ps(m);
  __m512 sum = Sleef_expf16_u10avx512f(_mm512_sub_ps(_mm512_loadu_ps(x), vm));
  for (int64_t d = 16; d < full; d += 16)
    sum = _mm512_add_ps(sum, Sleef_expf16_u10avx512f(_mm512_sub_ps(_mm512_loadu_ps(x + d), vm)));
  if (tail) {
    const __m512 e = Sleef_expf16_u10avx512f(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, x + full), vm));
    sum = _mm512_mask_blend_ps(tail, sum, _mm512_add_ps(sum, e));
  }
  const float total = aten_reduce_tree16(sum, [](__m512 a, __m512 b) { return _mm512_add_ps(a, b); });
  *m_out = m;
  *s_out = _mm512_cvtss_f32(Sleef_logf16_u10avx512f(_mm512_set1_ps(total)));
  return true;
#else
  (void)x, (void)V, (void)m_out, (void)s_out;
  return false;
#endif
}

// Whether aten_logsoftmax_row's (x - m) - s is at::log_softmax's row here, at width V (every magnitude,
// exp's range, ties, a row whose maximum is far from the rest); once per V.
__attribute__((optimize("fp-contract=off"))) static bool sample_logsoftmax_exact(int64_t V) {
  static std::mutex mu;
  static std::map<int64_t, bool> known;
  if (V < 16) return false;
  return probe_once(known, mu, V, [V] {
    const int64_t B = 6;
    auto x = at::empty({B, V}, at::kFloat);
    float* p = x.data_ptr<float>();
    for (int64_t i = 0; i < B * V; ++i)
      p[i] = std::sin(0.37f * i) * std::pow(2.f, static_cast<float>(i % 29) / 4 - 3);
    for (int64_t v = 0; v < V; ++v) {
      p[V + v] = std::round(std::sin(0.61f * v) * 6.f);  // ties
      p[2 * V + v] = -50.f - static_cast<float>(v % 101);  // exps near underflow
      p[3 * V + v] = 1e4f + static_cast<float>(v % 7) * 1e-3f;  // large, close together
      p[4 * V + v] = std::sin(0.11f * v) * 30.f;
    }
    p[5 * V + V - 1] = 80.f;  // one entry far above the rest, last (the tail)
    auto ref = at::log_softmax(x, -1).contiguous();
    const float* r = ref.data_ptr<float>();
    bool ok = true;
    for (int64_t b = 0; ok && b < B; ++b) {
      float m = 0.f, s = 0.f;
      ok = aten_logsoftmax_row(p + b * V, V, &m, &s);
      for (int64_t v = 0; ok && v < V; ++v) {
        const float d = p[b * V + v] - m;
        ok = (d - s) == r[b * V + v];
      }
    }
    return ok;
  });
}

// The row's entries as stored (RowAsIs) or as at::log_softmax stores them, (x - m) - s (RowLogSoftmax).
struct RowAsIs {
  float operator()(float v) const { return v; }
#ifdef __AVX512F__
  __m512 operator()(__m512 v) const { return v; }
#endif
};
struct RowLogSoftmax {
  float m, s;
  float operator()(float v) const { return (v - m) - s; }
#ifdef __AVX512F__
  __m512 operator()(__m512 v) const {
    return _mm512_sub_ps(_mm512_sub_ps(v, _mm512_set1_ps(m)), _mm512_set1_ps(s));
  }
#endif
};

// A row's k (<= V) largest entries in one order of its own (sampler.top_entries'): by value, NaN above every
// number, ties by ascending index, so a row's top k are the first k of its top m >= k whatever the batch
// asks (ATen's topk picks among ties by its kernel's path). A heap of the first k (value, index) pairs, its
// top the worst, each later entry that ranks above the top replacing it (pop_heap on k + 1 slots), then
// sort_heap. The scan runs in ascending index, so an entry equal to the top never enters: sixteen entries
// none greater than the top (one compare) are skipped at once. out_v / out_i get the k entries, best first.
template <typename Entry = RowAsIs>
static void topk_row_heap(const float* x, int64_t V, int64_t k, std::pair<float, int64_t>* heap, float* out_v,
                          int64_t* out_i, Entry f = {}) {
  auto comp = [](const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b) {  // a ranks first
    const bool an = std::isnan(a.first), bn = std::isnan(b.first);
    if (an != bn) return an;
    return (!an && a.first != b.first) ? a.first > b.first : a.second < b.second;
  };
  for (int64_t j = 0; j < k; ++j) heap[j] = {f(x[j]), j};
  std::make_heap(heap, heap + k, comp);
  int64_t j = k;
  auto offer = [&](int64_t i) {
    const std::pair<float, int64_t> e{f(x[i]), i};
    if (!comp(e, heap[0])) return;
    heap[k] = e;
    std::pop_heap(heap, heap + k + 1, comp);
  };
#ifdef __AVX512F__
  while (j < V && !std::isnan(heap[0].first)) {  // a NaN top: nothing beats it
    const __m512 top = _mm512_set1_ps(heap[0].first);
    for (; j + 16 <= V; j += 16)  // greater than the top, or NaN (the top is a number)
      if (_mm512_cmp_ps_mask(f(_mm512_loadu_ps(x + j)), top, _CMP_NLE_UQ) != 0) break;
    if (j + 16 > V) break;
    for (const int64_t end = j + 16; j < end; ++j) offer(j);
  }
#endif
  for (; j < V; ++j) offer(j);
  std::sort_heap(heap, heap + k, comp);
  for (int64_t r = 0; r < k; ++r) out_v[r] = heap[r].first, out_i[r] = heap[r].second;
}

// The first of a row's n entries whose log-probability f(x) equals `target` (n where none does).
static int64_t first_equal_row(const float* x, int64_t n, RowLogSoftmax f, float target) {
  int64_t v = 0;
#ifdef __AVX512F__
  const __m512 t = _mm512_set1_ps(target);
  for (; v + 16 <= n; v += 16) {
    const __mmask16 eq = _mm512_cmp_ps_mask(f(_mm512_loadu_ps(x + v)), t, _CMP_EQ_OQ);
    if (eq != 0) return v + __builtin_ctz(eq);
  }
#endif
  for (; v < n; ++v)
    if (f(x[v]) == target) return v;
  return n;
}

// Whether topk_row_heap gives the first k entries of a stable descending at::sort at width V here (ties by
// ascending index, NaNs first; rows of many ties, NaNs, -inf, a sorted run); once per (V, k), 2 <= k <= V.
static bool sample_topk_exact(int64_t V, int64_t k) {
  static std::mutex mu;
  static std::map<int64_t, bool> known;
  if (k < 2 || k > V) return false;
  return probe_once(known, mu, V * (V + 1) + k, [V, k] {
    const int64_t B = 7;
    auto x = at::empty({B, V}, at::kFloat);
    float* p = x.data_ptr<float>();
    for (int64_t i = 0; i < B * V; ++i) p[i] = std::round(std::sin(0.77f * i) * 3.f);  // many ties
    for (int64_t v = 0; v < V; ++v) {
      p[V + v] = -std::numeric_limits<float>::infinity();
      p[4 * V + v] = static_cast<float>(v % 97) * 0.25f;  // rising runs: many replacements
      p[5 * V + v] = std::sin(0.37f * v) * 40.f;
      p[6 * V + v] = std::round(std::sin(0.61f * v) * 8.f) * 0.125f - 30.f;
    }
    const float nan = std::numeric_limits<float>::quiet_NaN();
    p[V + 3] = 0.f;
    p[2 * V + V / 2] = nan, p[2 * V + V - 1] = nan, p[2 * V + 1] = nan;
    p[3 * V + V - 1] = 9.f, p[3 * V + 5] = 9.f;
    auto ref = at::sort(x, /*stable=*/true, -1, /*descending=*/true);
    const auto ref_v = std::get<0>(ref).narrow(1, 0, k).contiguous();
    const auto ref_i = std::get<1>(ref).narrow(1, 0, k).contiguous();
    const float* rv = ref_v.data_ptr<float>();
    const int64_t* ri = ref_i.data_ptr<int64_t>();
    std::vector<std::pair<float, int64_t>> heap(k + 1);
    std::vector<float> v(k);
    std::vector<int64_t> ix(k);
    bool ok = true;
    for (int64_t b = 0; ok && b < B; ++b) {
      topk_row_heap(p + b * V, V, k, heap.data(), v.data(), ix.data());
      for (int64_t r = 0; ok && r < k; ++r)
        ok = ix[r] == ri[b * k + r] &&
             (v[r] == rv[b * k + r] || (std::isnan(v[r]) && std::isnan(rv[b * k + r])));
    }
    return ok;
  });
}

// topk(1)'s entry of a row read as stored: argmax_row's (sample_top1_exact), its first largest (NaN first).
static void top1_row(const float* x, int64_t V, RowAsIs, float* v, int64_t* i) {
  const int64_t j = argmax_row(x, V);
  *v = x[j], *i = j;
}

// topk(1)'s entry of a row read as log-probabilities (finite m and s): the largest is -s, at the row's
// first maximum or at an earlier entry that rounds to it.
static void top1_row(const float* x, int64_t V, RowLogSoftmax f, float* v, int64_t* i) {
  const int64_t j = argmax_row(x, V);
  *v = f(x[j]), *i = first_equal_row(x, j + 1, f, *v);
}

// The `top` largest entries of each row [B, V] in topk_row_heap's order (top 1: topk's, the same entry;
// else where sample_topk_exact serves), the row read through entry_of(b) (RowAsIs, or the row's
// RowLogSoftmax); rows over the threads.
template <typename EntryOf>
static void pick_top_rows(const float* x, int64_t B, int64_t V, int64_t top, EntryOf entry_of, float* vals,
                          int64_t* ids) {
  at::parallel_for(0, B, row_grain(V), [&](int64_t begin, int64_t end) {
    std::vector<std::pair<float, int64_t>> heap(top + 1);
    for (int64_t b = begin; b < end; ++b) {
      if (top == 1) top1_row(x + b * V, V, entry_of(b), vals + b, ids + b);
      else topk_row_heap(x + b * V, V, top, heap.data(), vals + b * top, ids + b * top, entry_of(b));
    }
  });
}

// The k largest entries of float32 CPU rows [B, V] in sampler.top_entries' order (x.topk's values; ties by
// ascending index) through topk_row_heap where its probe passed here; two empty tensors where it does not
// serve (k < 2, k > V, or the probe failed).
std::tuple<at::Tensor, at::Tensor> topk_rows(torch::Tensor x, int64_t k) {
  NoGil no_gil;
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu(),
              "topk_rows: float32 CPU rows [B, V]");
  const int64_t B = x.size(0), V = x.size(1);
  if (!sample_topk_exact(V, k)) return {at::empty({0}, at::kFloat), at::empty({0}, at::kLong)};
  const auto xc = x.contiguous();
  auto vals = at::empty({B, k}, at::kFloat), ids = at::empty({B, k}, at::kLong);
  pick_top_rows(xc.data_ptr<float>(), B, V, k, [](int64_t) { return RowAsIs{}; }, vals.data_ptr<float>(),
                ids.data_ptr<int64_t>());
  return {vals, ids};
}

// Each row's (maximum, log-sum) as at::log_softmax computes them (its rows are (x - m) - s) where that is
// reproduced here; two empty tensors where not (tests, tools).
std::tuple<at::Tensor, at::Tensor> log_softmax_rows(torch::Tensor x) {
  NoGil no_gil;
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu(),
              "log_softmax_rows: float32 CPU rows [B, V]");
  const int64_t B = x.size(0), V = x.size(1);
  if (!sample_logsoftmax_exact(V)) return {at::empty({0}, at::kFloat), at::empty({0}, at::kFloat)};
  const auto xc = x.contiguous();
  auto m = at::empty({B}, at::kFloat), s = at::empty({B}, at::kFloat);
  for (int64_t b = 0; b < B; ++b)
    aten_logsoftmax_row(xc.data_ptr<float>() + b * V, V, m.data_ptr<float>() + b, s.data_ptr<float>() + b);
  return {m, s};
}
"""
