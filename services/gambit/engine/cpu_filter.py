"""``sampler.filter_logits`` (top-k / top-p) in C++ without sorting whole rows, giving its very logits.

A nucleus is a prefix of a row's ranking (logits descending, ties by vocabulary index), but the Python
filter sorts all V entries to find it and scatters a [B, V] mask back: at 64 rows of SmolLM2's 49,152
symbols that was 50-75 ms a step on 2 cores, more than the decode step itself. Here an entry's rank is
its 64-bit item (``cpu_rank``: key and index), so "ranked after the nucleus's last entry" is one integer
comparison, and finding that entry needs only the top of the ranking. The entries at or above a
threshold t are a prefix of the ranking (ties at t included); t = max - 1, 2, 4, ... (a counting pass
each, AVX-512), then halved back while many entries pass:

* top-k: the first t with at least k entries; ``std::nth_element`` over their items picks the k-th.
* top-p: the first t whose entries hold more than top_p (+ a margin) of the probability before their
  last one; only their items are sorted (radix) and walked with ATen's float cumsum (a float64 running
  sum, cast per entry) until ``cumsum - p > top_p``. The mass is summed in float: it decides how many
  entries get ranked, never which survive; a walk that ends without a cut ranks the whole row.

The probabilities are ATen's ``softmax`` itself (one call over the block); what is replicated is exact
(keys, comparisons, the running sum's order). A probe per vocabulary width compares against the same ATen
calls as the Python filter; where it fails they serve. ``tests/engine/test_cpu_filter.py`` compares the
plain loops with ``filter_logits`` wherever they run.
"""

from __future__ import annotations

import torch

from gambit.engine import cpu_attention

SOURCE = r"""
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
static int64_t filter_count(const float* x, const float* p, int64_t V, float t, float& mass, float& pmin) {
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

// The highest threshold t = m - d (d = 1, 2, 4, ...) whose entries >= t pass `enough`, then halved toward
// the last one that did not while more than FILTER_FEW pass; -inf when none down to `lowest` passes.
template <typename Enough>
static float filter_threshold(const float* x, const float* p, int64_t V, float m, float lowest,
                              Enough enough) {
  float mass, pmin, lo = m, hi = -std::numeric_limits<float>::infinity();
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
    const auto enough = [k](int64_t c, float, float) { return c >= k; };
    const float t = filter_threshold(x, nullptr, V, m, lowest, enough);
    if (t != -std::numeric_limits<float>::infinity()) n = rank_gather_above(x, V, t, it);
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
    const float t = filter_threshold(x, p, V, m, lowest, [need](int64_t, float mass, float pmin) {
      return mass - pmin > need;
    });
    if (t != -std::numeric_limits<float>::infinity()) {
      const int64_t n = rank_gather_above(x, V, t, it);
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
        rank_cut_after(xp + b * V, V, filter_kth(xp + b * V, V, kp[b], filter_scratch(V)));
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
      if (last != ~uint64_t(0)) rank_cut_after(row, V, last);
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
