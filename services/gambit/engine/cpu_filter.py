"""``sampler.filter_logits`` (top-k / top-p) in C++ without sorting whole rows, giving its very logits.

A nucleus is a prefix of a row's ranking (logits descending, ties by vocabulary index), but the Python
filter sorts all V entries to find it and scatters a [B, V] mask back: at 64 rows of SmolLM2's 49,152
symbols that was 50-75 ms a step on 2 cores, more than the decode step itself. Here each row's rank
order is the order of 64-bit items ``(key << 32) | index`` (``sort_desc_key``: keys ascend as the values
rank), so "ranked after the nucleus's last entry" is one integer comparison, and finding that entry
needs only the top of the ranking:

* top-k: a histogram of the keys' top bits finds the bucket holding rank k, and only that bucket's
  items are partially sorted (``std::nth_element``).
* top-p: the same histogram carries each bucket's probability mass; the buckets are taken best first
  until the mass before one exceeds top_p by a margin, so the nucleus ends inside them; only those
  items are sorted (radix), and walked with ATen's float cumsum (a float64 running sum, cast per
  entry) until ``cumsum - p > top_p``. A row whose walk ends without a cut (the margin failed: never
  seen) sorts the whole row and walks again.

The probabilities are ATen's ``softmax`` itself; what is replicated is exact (keys, comparisons, the
running sum's order). A probe per vocabulary width compares against the same ATen calls as the Python
filter; where it fails they serve. ``tests/engine/test_cpu_filter.py`` compares with ``filter_logits``.
"""

from __future__ import annotations

import torch

from gambit.engine import cpu_attention

SOURCE = r"""
// parallel_for's grain for rows of V entries: about ATen's grain size of work a task, at least one row
static inline int64_t row_grain(int64_t V) {
  return std::max<int64_t>(1, at::internal::GRAIN_SIZE / std::max<int64_t>(V, 1));
}

// A row's rank key for a descending stable sort under ATen's comparator (NaN before every number, larger
// first, +0 and -0 equal): keys ascend as the values rank, NaN's is 0.
static inline uint32_t sort_desc_key(float f) {
  if (std::isnan(f)) return 0;
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) == 0) u = 0;  // -0 ranks with +0
  return ~((u & 0x80000000u) ? ~u : (u | 0x80000000u));  // floats ascending, then reversed; never 0
}

// An entry's place in its row's ranking: items ascend as a stable descending sort orders the entries.
static inline uint64_t rank_item(float x, int64_t v) {
  return (uint64_t(sort_desc_key(x)) << 32) | uint64_t(v);
}

// Sorts n items ascending by their keys (the high 32 bits), keeping the order of equal keys: a
// least-significant-digit radix sort, four 8-bit digits, a digit every key shares skipped. Items in index
// order come out in ranking order. t: n scratch items. Returns where the result lies (a or t).
static uint64_t* sort_rank_items(uint64_t* a, uint64_t* t, int64_t n) {
  if (n < 2) return a;
  uint32_t count[4][256] = {};
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t k = static_cast<uint32_t>(a[i] >> 32);
    ++count[0][k & 255], ++count[1][(k >> 8) & 255], ++count[2][(k >> 16) & 255], ++count[3][k >> 24];
  }
  for (int d = 0; d < 4; ++d) {
    const int shift = 32 + 8 * d;
    uint32_t* c = count[d];
    if (c[(a[0] >> shift) & 255] == static_cast<uint32_t>(n)) continue;  // one digit for every key
    uint32_t sum = 0;
    for (int b = 0; b < 256; ++b) {
      const uint32_t m = c[b];
      c[b] = sum, sum += m;
    }
    for (int64_t i = 0; i < n; ++i) t[c[(a[i] >> shift) & 255]++] = a[i];
    std::swap(a, t);
  }
  return a;
}

// x.sort(-1, descending=true, stable=true) of one row, the same permutation as ATen's stable sort,
// O(V) instead of O(V log V) comparisons (~26 ms for 16 rows of a 49k vocabulary in ATen here).
// buf: 2V scratch items.
static void sort_desc_row(const float* x, int64_t V, float* vals, int64_t* idx, uint64_t* buf) {
  for (int64_t v = 0; v < V; ++v) buf[v] = rank_item(x[v], v);
  const uint64_t* a = sort_rank_items(buf, buf + V, V);
  for (int64_t r = 0; r < V; ++r) {
    const uint32_t i = static_cast<uint32_t>(a[r]);
    idx[r] = i, vals[r] = x[i];
  }
}

static std::tuple<at::Tensor, at::Tensor> sort_desc_rows_into(const at::Tensor& x) {
  const auto xc = x.contiguous();
  const int64_t V = xc.size(-1), N = xc.numel() / std::max<int64_t>(V, 1);
  auto vals = at::empty_like(xc), idx = at::empty(xc.sizes(), xc.options().dtype(at::kLong));
  const float* xp = xc.data_ptr<float>();
  float* vp = vals.data_ptr<float>();
  int64_t* ip = idx.data_ptr<int64_t>();
  at::parallel_for(0, N, row_grain(V), [&](int64_t b0, int64_t b1) {
    static thread_local std::vector<uint64_t> buf;  // 2V items, kept by the thread
    if (static_cast<int64_t>(buf.size()) < 2 * V) buf.resize(2 * V);
    for (int64_t b = b0; b < b1; ++b) sort_desc_row(xp + b * V, V, vp + b * V, ip + b * V, buf.data());
  });
  return {vals, idx};
}

// Whether the radix sort gives at::sort(stable, descending)'s values and indices at width V here (ties,
// NaNs, +-0, +-inf, denormals); once per V.
static bool sort_desc_exact(int64_t V) {
  static std::mutex mu;
  static std::map<int64_t, bool> known;
  if (V < 1 || V >= (int64_t(1) << 31)) return false;
  return probe_once(known, mu, V, [V] {
    const int64_t B = 4;
    auto x = at::empty({B, V}, at::kFloat);
    float* p = x.data_ptr<float>();
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    const float specials[] = {0.f, -0.f, inf, -inf, nan, 1e-40f, -1e-40f, 3.f, -3.f};
    for (int64_t i = 0; i < B * V; ++i) {
      const int64_t r = i / V;
      p[i] = r == 0 ? std::round(std::sin(0.77f * i) * 4.f)  // many ties
             : r == 1 ? specials[(i * 7) % 9]
             : r == 2 ? std::sin(0.37f * i) * std::pow(2.f, static_cast<float>(i % 61) - 30)
                      : static_cast<float>(i % 5) - 2.f;
    }
    auto ref = at::sort(x, /*stable=*/true, -1, /*descending=*/true);
    auto got = sort_desc_rows_into(x);
    return at::equal(std::get<1>(ref), std::get<1>(got)) &&
           at::equal(std::get<0>(ref).nan_to_num(0.5), std::get<0>(got).nan_to_num(0.5));
  });
}

// logits.sort(-1, descending=true, stable=true) for float32 CPU rows: the radix sort where its probe
// passed here, ATen's otherwise.
std::tuple<at::Tensor, at::Tensor> sort_desc_rows(torch::Tensor logits) {
  NoGil no_gil;
  TORCH_CHECK(logits.scalar_type() == at::kFloat && logits.dim() >= 1, "sort_desc_rows: float32 rows");
  if (logits.numel() == 0 || !sort_desc_exact(logits.size(-1))) return at::sort(logits, true, -1, true);
  return sort_desc_rows_into(logits);
}

// sampler.filter_logits through ATen's calls (the fallback and the probes' reference)
static at::Tensor filter_aten(const at::Tensor& logits, const at::Tensor& top_k, const at::Tensor& top_p) {
  const int64_t V = logits.size(-1);
  const double inf = std::numeric_limits<double>::infinity();
  auto order = std::get<1>(at::sort(logits, /*stable=*/true, -1, /*descending=*/true));
  auto k = at::where(at::gt(top_k, 0), top_k.clamp_max(V), at::scalar_tensor(V, top_k.options()));
  auto outside = at::ge(at::arange(V, top_k.options()).unsqueeze(0), k.unsqueeze(1));
  auto masked = logits.masked_fill(at::zeros_like(outside).scatter(1, order, outside), -inf);
  auto probs = masked.softmax(-1).gather(1, order);
  auto beyond = at::gt(at::sub(probs.cumsum(-1), probs), top_p.unsqueeze(1)).logical_and_(
      at::lt(top_p, 1).unsqueeze(1));
  outside.logical_or_(at::gt(beyond.cumsum(-1), 0));
  outside.select(1, 0).fill_(false);
  return logits.masked_fill(at::zeros_like(outside).scatter(1, order, outside), -inf);
}

static constexpr int64_t FILTER_WHOLE = 4096;  // rows up to this long are ranked whole
static constexpr double FILTER_MARGIN = 1e-4;   // probability mass past top_p the ranked entries hold
static constexpr int64_t FILTER_FEW = 1024;     // entries worth ranking without narrowing the threshold

struct FilterScratch {
  std::vector<uint64_t> items, tmp;
};

static FilterScratch& filter_scratch(int64_t V) {
  static thread_local FilterScratch s;
  if (static_cast<int64_t>(s.items.size()) < V + 8) s.items.resize(V + 8), s.tmp.resize(V + 8);
  return s;
}

#ifdef __AVX512F__
// sort_desc_key of 16 values that are not NaN
static inline __m512i filter_keys16(__m512 x) {
  __m512i u = _mm512_castps_si512(x);
  const __m512i low = _mm512_set1_epi32(0x7fffffff);
  u = _mm512_maskz_mov_epi32(_mm512_test_epi32_mask(u, low), u);  // -0 ranks with +0
  const __mmask16 neg = _mm512_cmplt_epi32_mask(u, _mm512_setzero_si512());
  return _mm512_mask_mov_epi32(_mm512_andnot_si512(u, low), neg, u);
}
#endif

// The row's largest value and its smallest above -inf, and whether it holds a NaN.
static float filter_range(const float* x, int64_t V, float& lowest, bool& nan) {
  const float inf = std::numeric_limits<float>::infinity();
  float m = -inf;
  int64_t v = 0;
  lowest = inf, nan = false;
#ifdef __AVX512F__
  __m512 mv = _mm512_set1_ps(m), lv = _mm512_set1_ps(inf);
  __mmask16 nm = 0;
  for (; v + 16 <= V; v += 16) {
    const __m512 a = _mm512_loadu_ps(x + v);
    nm |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
    mv = _mm512_max_ps(a, mv);
    lv = _mm512_mask_min_ps(lv, _mm512_cmp_ps_mask(a, _mm512_set1_ps(-inf), _CMP_NEQ_OQ), a, lv);
  }
  m = _mm512_reduce_max_ps(mv), lowest = _mm512_reduce_min_ps(lv), nan = nm != 0;
#endif
  for (; v < V; ++v) {
    nan = nan || std::isnan(x[v]), m = std::max(m, x[v]);
    if (x[v] != -inf) lowest = std::min(lowest, x[v]);
  }
  return m;
}

// How many entries are >= t; with p, about their probability mass and their smallest probability (float
// sums: only how many entries get ranked depends on them, never which survive the filter).
static int64_t filter_count(const float* x, const float* p, int64_t V, float t, double& mass, float& pmin) {
  int64_t n = 0, v = 0;
  float sum = 0.f;
  pmin = std::numeric_limits<float>::infinity();
#ifdef __AVX512F__
  const __m512 tv = _mm512_set1_ps(t);
  if (p == nullptr) {
    for (; v + 16 <= V; v += 16)
      n += __builtin_popcount(_mm512_cmp_ps_mask(_mm512_loadu_ps(x + v), tv, _CMP_GE_OQ));
  } else {
    __m512 s[4], lo[4];
    for (int j = 0; j < 4; ++j) s[j] = _mm512_setzero_ps(), lo[j] = _mm512_set1_ps(pmin);
    for (; v + 64 <= V; v += 64)
      for (int j = 0; j < 4; ++j) {  // four independent sums: an add's latency is not the loop's
        const __mmask16 in = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + v + 16 * j), tv, _CMP_GE_OQ);
        const __m512 pv = _mm512_loadu_ps(p + v + 16 * j);
        n += __builtin_popcount(in);
        s[j] = _mm512_mask_add_ps(s[j], in, s[j], pv), lo[j] = _mm512_mask_min_ps(lo[j], in, lo[j], pv);
      }
    sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s[0], s[1]), _mm512_add_ps(s[2], s[3])));
    pmin = _mm512_reduce_min_ps(_mm512_min_ps(_mm512_min_ps(lo[0], lo[1]), _mm512_min_ps(lo[2], lo[3])));
  }
#endif
  for (; v < V; ++v)
    if (x[v] >= t) {
      ++n;
      if (p != nullptr) sum += p[v], pmin = std::min(pmin, p[v]);
    }
  mass = sum;
  return n;
}

// The items of the entries >= t, in index order; returns how many. items: room for V + 8.
static int64_t filter_gather(const float* x, int64_t V, float t, uint64_t* items) {
  int64_t n = 0, v = 0;
#ifdef __AVX512F__
  const __m512 tv = _mm512_set1_ps(t);
  const __m512i step = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
  for (; v + 16 <= V; v += 16) {
    const __m512 a = _mm512_loadu_ps(x + v);
    const __mmask16 in = _mm512_cmp_ps_mask(a, tv, _CMP_GE_OQ);
    if (!in) continue;
    const __m512i k = filter_keys16(a);
    for (int h = 0; h < 2; ++h) {
      const __mmask8 hm = static_cast<__mmask8>(in >> (8 * h));
      if (!hm) continue;
      const __m256i half = h ? _mm512_extracti64x4_epi64(k, 1) : _mm512_castsi512_si256(k);
      const __m512i key = _mm512_cvtepu32_epi64(half);
      const __m512i item = _mm512_or_si512(_mm512_slli_epi64(key, 32),
                                           _mm512_add_epi64(step, _mm512_set1_epi64(v + 8 * h)));
      _mm512_storeu_si512(items + n, _mm512_maskz_compress_epi64(hm, item));  // Zen 4: no compress to memory
      n += __builtin_popcount(hm);
    }
  }
#endif
  for (; v < V; ++v)
    if (x[v] >= t) items[n++] = rank_item(x[v], v);
  return n;
}

// Every entry ranked after `last` becomes -inf.
static void filter_cut_after(float* x, int64_t V, uint64_t last) {
  const float ninf = -std::numeric_limits<float>::infinity();
  int64_t v = 0;
#ifdef __AVX512F__
  const __m512i lk = _mm512_set1_epi32(static_cast<int32_t>(last >> 32));
  const __m512i li = _mm512_set1_epi32(static_cast<int32_t>(static_cast<uint32_t>(last)));
  const __m512i step = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  for (; v + 16 <= V; v += 16) {
    const __m512 a = _mm512_loadu_ps(x + v);
    const __mmask16 real = _mm512_cmp_ps_mask(a, a, _CMP_ORD_Q);  // a NaN's key is 0: it ranks first
    const __m512i k = _mm512_maskz_mov_epi32(real, filter_keys16(a));
    const __m512i idx = _mm512_add_epi32(step, _mm512_set1_epi32(static_cast<int32_t>(v)));
    const __mmask16 after = _mm512_cmpgt_epu32_mask(k, lk) |
                            (_mm512_cmpeq_epi32_mask(k, lk) & _mm512_cmpgt_epu32_mask(idx, li));
    _mm512_mask_storeu_ps(x + v, after, _mm512_set1_ps(ninf));
  }
#endif
  for (; v < V; ++v)
    if (rank_item(x[v], v) > last) x[v] = ninf;
}

// The highest threshold t = m - d (d = 1, 2, 4, ...) whose entries >= t pass `enough`, then halved toward
// the last one that did not while more than FILTER_FEW pass; -inf when none down to `lowest` passes.
template <typename Enough>
static float filter_threshold(const float* x, const float* p, int64_t V, float m, float lowest,
                              Enough enough) {
  double mass;
  float pmin, lo = m, hi = -std::numeric_limits<float>::infinity();
  int64_t n = 0;
  for (float d = 1.f; d < 3e38f; d *= 2.f) {
    const float t = m - d;
    n = filter_count(x, p, V, t, mass, pmin);
    if (enough(n, mass, pmin)) { hi = t; break; }
    if (t <= lowest) break;  // every entry above -inf is in: no lower threshold passes either
    lo = t;
  }
  if (hi == -std::numeric_limits<float>::infinity()) return hi;
  for (int i = 0; i < 6 && n > FILTER_FEW; ++i) {
    const float t = lo + (hi - lo) * 0.5f;
    if (!(t < lo && t > hi)) break;
    const int64_t c = filter_count(x, p, V, t, mass, pmin);
    if (enough(c, mass, pmin)) hi = t, n = c; else lo = t;
  }
  return hi;
}

// The item ranked k-th (1-based, 0 < k < V) in a row.
static uint64_t filter_kth(const float* x, int64_t V, int64_t k, FilterScratch& s) {
  uint64_t* it = s.items.data();
  int64_t n = 0;
  bool nan;
  float lowest;
  const float m = filter_range(x, V, lowest, nan);
  if (V > FILTER_WHOLE && std::isfinite(m) && !nan) {
    const auto enough = [k](int64_t c, double, float) { return c >= k; };
    const float t = filter_threshold(x, nullptr, V, m, lowest, enough);
    if (t != -std::numeric_limits<float>::infinity()) n = filter_gather(x, V, t, it);
  }
  if (n < k) {  // a short row, or NaN / inf in it: rank every entry
    n = 0;
    for (int64_t v = 0; v < V; ++v) it[n++] = rank_item(x[v], v);
  }
  std::nth_element(it, it + (k - 1), it + n);
  return it[k - 1];
}

// Walks ranked items with their probabilities as sampler.filter_logits does: the cumsum a float64 running
// sum cast to float (ATen's CPU cumsum), the first item with cumsum - p > top_p ends the nucleus. Returns
// the nucleus's last item, or ~0 if no item ends it.
static uint64_t filter_walk(const uint64_t* a, int64_t n, const float* p, float top_p) {
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float pi = p[static_cast<uint32_t>(a[i])];
    acc += static_cast<double>(pi);
    if (static_cast<float>(acc) - pi > top_p) return a[i == 0 ? 0 : i - 1];  // i = 0 never: 0 > top_p
  }
  return ~uint64_t(0);
}

// The last item of a row's top-p nucleus (~0: every entry stays), p its softmax. The entries ranked are
// those above a threshold that holds top_p + FILTER_MARGIN before its last one, so the nucleus should end
// among them; if the walk finds no end there after all, the whole row is ranked and walked.
static uint64_t filter_nucleus(const float* x, const float* p, int64_t V, float top_p, FilterScratch& s) {
  uint64_t* it = s.items.data();
  bool nan;
  float lowest;
  const float m = filter_range(x, V, lowest, nan);
  if (V > FILTER_WHOLE && std::isfinite(m) && !nan) {
    const double need = static_cast<double>(top_p) + FILTER_MARGIN;
    const float t = filter_threshold(x, p, V, m, lowest, [need](int64_t, double mass, float pmin) {
      return mass - pmin > need;
    });
    if (t != -std::numeric_limits<float>::infinity()) {
      const int64_t n = filter_gather(x, V, t, it);
      const uint64_t end = filter_walk(sort_rank_items(it, s.tmp.data(), n), n, p, top_p);
      if (end != ~uint64_t(0)) return end;
    }
  }
  for (int64_t v = 0; v < V; ++v) it[v] = rank_item(x[v], v);  // rank the whole row
  return filter_walk(sort_rank_items(it, s.tmp.data(), V), V, p, top_p);
}

// filter_logits on float32 rows [B, V] in place (top_k long [B], top_p float [B]).
static void filter_rows_fast_(at::Tensor& x, const at::Tensor& top_k, const at::Tensor& top_p) {
  const int64_t B = x.size(0), V = x.size(1);
  float* xp = x.data_ptr<float>();
  const int64_t* kp = top_k.data_ptr<int64_t>();
  const float* pp = top_p.data_ptr<float>();
  at::parallel_for(0, B, row_grain(V), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      if (kp[b] > 0 && kp[b] < V)
        filter_cut_after(xp + b * V, V, filter_kth(xp + b * V, V, kp[b], filter_scratch(V)));
  });
  std::vector<int64_t> rows;
  for (int64_t b = 0; b < B; ++b)
    if (pp[b] < 1) rows.push_back(b);
  if (rows.empty()) return;
  const bool all = static_cast<int64_t>(rows.size()) == B;
  auto probs = (all ? x : x.index_select(0, at::tensor(rows, top_k.options()))).softmax(-1).contiguous();
  const float* sp = probs.data_ptr<float>();
  at::parallel_for(0, static_cast<int64_t>(rows.size()), row_grain(V), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* row = xp + rows[r] * V;
      const uint64_t last = filter_nucleus(row, sp + r * V, V, pp[rows[r]], filter_scratch(V));
      if (last != ~uint64_t(0)) filter_cut_after(row, V, last);
    }
  });
}

// Whether filter_rows_fast_ gives filter_aten's logits at width V here: rows of ties, NaN, +-inf, a peaked
// and a flat row, under top-k and top-p settings of every kind; once per V.
static bool filter_exact(int64_t V) {
  static std::mutex mu;
  static std::map<int64_t, bool> known;
  if (V < 2 || V >= (int64_t(1) << 31)) return false;
  return probe_once(known, mu, V, [V] {
    const int64_t B = 8;
    auto x = at::empty({B, V}, at::kFloat);
    float* p = x.data_ptr<float>();
    for (int64_t i = 0; i < B * V; ++i) {
      const int64_t r = i / V, v = i % V;
      p[i] = r == 0 ? std::round(std::sin(0.77f * i) * 4.f)  // many ties
             : r == 1 ? (v == 3 ? std::numeric_limits<float>::quiet_NaN() : std::sin(0.3f * v))
             : r == 2 ? (v % 7 == 0 ? -std::numeric_limits<float>::infinity() : std::cos(0.11f * v) * 3)
             : r == 3 ? 30.f - 0.5f * static_cast<float>(v % 97)  // peaked
             : r == 4 ? std::sin(0.37f * i) * 0.01f  // flat
                      : std::sin(1.7f * i) * (2.f + static_cast<float>(r));
    }
    auto k = at::tensor(std::vector<int64_t>{3, 0, 5, 0, 0, 1, V - 1, 0}, at::kLong);
    auto tp = at::tensor(std::vector<float>{0.9f, 0.5f, 1.0f, 0.95f, 0.3f, 0.99f, 0.8f, 1e-6f}, at::kFloat);
    auto got = x.clone();
    filter_rows_fast_(got, k, tp);
    return at::equal(filter_aten(x, k, tp).nan_to_num(0.5), got.nan_to_num(0.5));
  });
}

// sampler.filter_logits on float32 rows [B, V]: x itself when no row asks for a filter, else x filtered,
// in place when `inplace` (the sampler's own scaled logits), else a copy. `probe` false skips the probe
// (the tests' way to reach the plain loops wherever they run).
static at::Tensor filter_rows_impl(at::Tensor x, at::Tensor top_k, at::Tensor top_p, bool inplace,
                                   bool probe = true) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2, "filter_rows: float32 rows [B, V]");
  const int64_t B = x.size(0), V = x.size(1);
  top_k = top_k.to(at::kLong).contiguous(), top_p = top_p.to(at::kFloat).contiguous();
  TORCH_CHECK(top_k.numel() == B && top_p.numel() == B, "filter_rows: one top_k and top_p a row");
  const int64_t* kp = top_k.data_ptr<int64_t>();
  const float* pp = top_p.data_ptr<float>();
  bool needs = false;
  for (int64_t b = 0; b < B && !needs; ++b) needs = (kp[b] > 0 && kp[b] < V) || pp[b] < 1;
  if (!needs) return x;
  if (probe && !filter_exact(V)) return filter_aten(x, top_k, top_p);
  auto out = inplace && x.is_contiguous() ? x : x.contiguous().clone();
  filter_rows_fast_(out, top_k, top_p);
  return out;
}

torch::Tensor filter_rows(torch::Tensor logits, torch::Tensor top_k, torch::Tensor top_p, bool probe) {
  NoGil no_gil;
  return filter_rows_impl(logits, top_k, top_p, false, probe);
}
"""


def available() -> bool:
    """Whether the compiled filter can serve (CPU kernels built here)."""
    return cpu_attention.kernel() is not None


def filter_logits(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                  probe: bool = True) -> torch.Tensor:
    """``sampler.filter_logits`` for float32 CPU rows [B, V], compiled where it can be (else the Python
    filter); the input is never modified. ``probe=False`` takes the plain loops even where their probe
    failed (tests)."""
    from gambit.engine import sampler

    if logits.device.type != "cpu" or logits.dtype != torch.float32 or logits.dim() != 2 or not available():
        return sampler.filter_logits(logits, top_k, top_p)
    return cpu_attention.kernel().filter_rows(logits, top_k, top_p, probe)
