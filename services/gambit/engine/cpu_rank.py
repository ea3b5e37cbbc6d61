"""A row's ranking as 64-bit items, the order a stable descending sort gives its entries.

An entry's item is ``(key << 32) | index`` with ``key`` from ``sort_desc_key`` (keys ascend as the values
rank under ATen's comparator: NaN first, larger first, +0 and -0 equal), so comparing items compares ranks,
ties by index. On these: an LSD radix sort of items (``sort_desc_rows``: ``x.sort(descending=True,
stable=True)``'s very permutation, probe-checked per width), the items of the entries at or above a
threshold (a prefix of the ranking), and cutting a row after an item (``cpu_filter``'s top-k / top-p).
Compiled with the other CPU kernels, before ``cpu_filter`` and ``cpu_sampler``.
"""

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

#ifdef __AVX512F__
// sort_desc_key of 16 values that are not NaN
static inline __m512i rank_keys16(__m512 x) {
  __m512i u = _mm512_castps_si512(x);
  const __m512i low = _mm512_set1_epi32(0x7fffffff);
  u = _mm512_maskz_mov_epi32(_mm512_test_epi32_mask(u, low), u);  // -0 ranks with +0
  const __mmask16 neg = _mm512_cmplt_epi32_mask(u, _mm512_setzero_si512());
  return _mm512_mask_mov_epi32(_mm512_andnot_si512(u, low), neg, u);
}
#endif

// The items of the entries >= t, in index order; returns how many. items: room for V + 8.
static int64_t rank_gather_above(const float* x, int64_t V, float t, uint64_t* items) {
  int64_t n = 0, v = 0;
#ifdef __AVX512F__
  const __m512 tv = _mm512_set1_ps(t);
  const __m512i step = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
  for (; v + 16 <= V; v += 16) {
    const __m512 a = _mm512_loadu_ps(x + v);
    const __mmask16 in = _mm512_cmp_ps_mask(a, tv, _CMP_GE_OQ);
    if (!in) continue;
    const __m512i k = rank_keys16(a);
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
static void rank_cut_after(float* x, int64_t V, uint64_t last) {
  const float ninf = -std::numeric_limits<float>::infinity();
  int64_t v = 0;
#ifdef __AVX512F__
  const __m512i lk = _mm512_set1_epi32(static_cast<int32_t>(last >> 32));
  const __m512i li = _mm512_set1_epi32(static_cast<int32_t>(static_cast<uint32_t>(last)));
  const __m512i step = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  for (; v + 16 <= V; v += 16) {
    const __m512 a = _mm512_loadu_ps(x + v);
    const __mmask16 real = _mm512_cmp_ps_mask(a, a, _CMP_ORD_Q);  // a NaN's key is 0: it ranks first
    const __m512i k = _mm512_maskz_mov_epi32(real, rank_keys16(a));
    const __m512i idx = _mm512_add_epi32(step, _mm512_set1_epi32(static_cast<int32_t>(v)));
    const __mmask16 after = _mm512_cmpgt_epu32_mask(k, lk) |
                            (_mm512_cmpeq_epi32_mask(k, lk) & _mm512_cmpgt_epu32_mask(idx, li));
    _mm512_mask_storeu_ps(x + v, after, _mm512_set1_ps(ninf));
  }
#endif
  for (; v < V; ++v)
    if (rank_item(x[v], v) > last) x[v] = ninf;
}

"""
