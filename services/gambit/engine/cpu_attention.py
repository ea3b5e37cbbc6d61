"""Paged attention on the CPU without gathering the cache (a small C++ kernel).

``paged_decode`` serves one query row per sequence; ``paged_attention`` serves any rows with a
causal or a per-sequence tree mask among the new tokens: short plain chunks in the one-row order
(plain decoding's floats), draft trees and speculative context passes in a tiled order (16 query rows
per vector lane: no per-score horizontal sum). Both orders take their exps sixteen at a time (no libm
``exp``); with AVX-512 and a head_dim that is a multiple of 16 the one-row order runs in explicit
512-bit multiply-adds, and ``paged_decode`` holds each head's query and value sums in registers across
the whole sequence (1.5-2x the KV read rate of the compiler-vectorised loops on a Zen 4 at batch 64).
The cache may be float32 or bfloat16 (``EngineConfig.kv_dtype``): a bfloat16 key or value is widened to
fp32 as it is loaded, so the arithmetic, and every float, is the fp32 kernel's over the rounded values.

The PyTorch path copies every sequence's KV blocks into a padded batch before SDPA (read + write +
read per step). This kernel reads each key and value once, straight from the blocks (scores,
softmax, weighted values); threads split over (sequence, kv head) and share each loaded key across the query
heads of its GQA group. It is compiled on first use (``torch.utils.cpp_extension``, cached under
``~/.cache/torch_extensions``); without a compiler the engine keeps the PyTorch path.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading

import torch

log = logging.getLogger(__name__)

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

// Every kernel called from Python releases the GIL for the call (no Python object is touched inside),
// so the process's other threads (a replica's event loop, RPC and writer threads, a client reading
// events) run while the engine thread is in a forward; a nested call (GIL already released) keeps it so.
struct NoGil {
  PyThreadState* state = nullptr;
  NoGil() {
    if (PyGILState_Check()) state = PyEval_SaveThread();
  }
  ~NoGil() {
    if (state) PyEval_RestoreThread(state);
  }
};

// KV elements are float or bfloat16 (EngineConfig.kv_dtype: half the bytes a step reads from the cache);
// a bfloat16 key or value is widened to fp32 as it is read (exact), so all arithmetic stays fp32
using bf16 = at::BFloat16;

// n keys or values as fp32 for the portable loops and the tiled order: a float row as it is, a bfloat16
// one widened into a per-thread buffer first, so that how the compiler vectorises a loop (hence the order
// of a dot product's sums) never depends on the element type, a cache's floats are those of an fp32 cache
// holding the same (rounded) values, and a block the tiled order reads once per lane vector is widened
// once (per element there it cost ~1.3x the fp32 kernel's time)
static inline const float* as_float(const float* p, int64_t) { return p; }
static inline const float* as_float(const bf16* p, int64_t n) {
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(n);
  for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<float>(p[i]);
  return buf.data();
}

typedef float vf16 __attribute__((vector_size(64)));
typedef int vi16 __attribute__((vector_size(64)));

// e^x lane-wise for x <= 0 (scores less their row's maximum): Cody-Waite reduction and Cephes' degree-5
// polynomial, ~1 ulp; lanes below -87.3 (masked keys: -inf) give exactly 0. No libm call, so it stays
// in vector registers (a std::exp per score was a large part of the softmax).
static inline vf16 exp_le0(vf16 x) {
  const vf16 lim = vf16{} - 87.33654f;
  const auto zero = x < lim;
  const vf16 xc = zero ? lim : x;
  const vf16 magic = vf16{} + 12582912.f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer
  const vf16 n = (xc * 1.44269504088896341f + magic) - magic;
  vf16 r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  vf16 p = vf16{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const vf16 y = p * (r * r) + r + 1.f;
  const vi16 e = (__builtin_convertvector(n, vi16) + 127) << 23;  // 2^n, n >= -126
  return zero ? vf16{} : y * (vf16)e;
}

// The one-row order, shared by paged_decode and paged_attention's plain causal rows (so a row's floats do
// not depend on how its tokens were chunked). With AVX-512 and a head_dim that is a multiple of 16 (the
// shipped target's 48, SmolLM2's 64, 128) the dot products and value sums run in explicit 512-bit
// multiply-adds (the compiler's reductions and per-score libm exps held the one-row kernel to ~10 GB/s of
// KV at batch 64); elsewhere the portable loops below. Either way both kernels run these same functions.
#ifdef __AVX512F__
#include <immintrin.h>
static inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
static inline __m512 load16(const bf16* p) {  // 16 bfloat16 as fp32: zero-extended, shifted to the high half
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
// q . k for D a multiple of 16: lane l sums d = l, l + 16, ... in order, then one fixed reduction
template <typename T>
static inline float dot16(const float* q, const T* k, int64_t D) {
  __m512 p = _mm512_mul_ps(_mm512_loadu_ps(q), load16(k));
  for (int64_t d = 16; d < D; d += 16) p = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), load16(k + d), p);
  return _mm512_reduce_add_ps(p);
}
#endif

// Scores of one key row against the G query heads of its GQA group:
// out[g * L] = scale * q_g . k (out points at the key's column of a [G, L] score buffer).
template <typename T>
static inline void score_key(const float* qb, const T* kt, int64_t G, int64_t D, float sc, float* out,
                             int64_t L) {
#ifdef __AVX512F__
  if (D % 16 == 0) {
    for (int64_t g = 0; g < G; ++g) out[g * L] = dot16(qb + g * D, kt, D) * sc;
    return;
  }
#endif
  const float* kf = as_float(kt, D);
  for (int64_t g = 0; g < G; ++g) {
    const float* qg = qb + g * D;
    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
    for (int64_t d = 0; d < D; ++d) dot += qg[d] * kf[d];
    out[g * L] = dot * sc;
  }
}

// Softmax of each of the G rows of a [G, L] score buffer, in place: exp_le0 sixteen scores at a time
// (the last vector padded with -inf, whose exp is exactly 0), the sum kept in sixteen lanes.
static inline void softmax_rows(float* s, int64_t G, int64_t L) {
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t g = 0; g < G; ++g) {
    float* sg = s + g * L;
    // the row's maximum sixteen lanes at a time (a maximum is exact: any order gives its float; the
    // compiler keeps a float max reduction scalar without -ffast-math)
    vf16 m16 = vf16{} + std::numeric_limits<float>::lowest();
    int64_t t = 0;
    for (; t + 16 <= L; t += 16) {
      vf16 x;
      std::memcpy(&x, sg + t, sizeof(x));
      m16 = x > m16 ? x : m16;
    }
    float mx = std::numeric_limits<float>::lowest();
    for (int k = 0; k < 16; ++k) mx = m16[k] > mx ? m16[k] : mx;
    for (; t < L; ++t) mx = sg[t] > mx ? sg[t] : mx;
    vf16 lanes = {};
    for (t = 0; t + 16 <= L; t += 16) {  // whole vectors: fixed-size copies (no memcpy call)
      vf16 x;
      std::memcpy(&x, sg + t, sizeof(x));
      const vf16 e = exp_le0(x - mx);
      std::memcpy(sg + t, &e, sizeof(e));
      lanes = lanes + e;
    }
    if (t < L) {  // the last part-filled vector, padded with -inf (exp exactly 0)
      const int64_t n = L - t;
      vf16 x = vf16{} + ninf;
      std::memcpy(&x, sg + t, n * sizeof(float));
      const vf16 e = exp_le0(x - mx);
      std::memcpy(sg + t, &e, n * sizeof(float));
      lanes = lanes + e;
    }
    float sum = 0.f;
    for (int k = 0; k < 16; ++k) sum += lanes[k];
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    for (int64_t t = 0; t < L; ++t) sg[t] *= inv;
  }
}

// acc[g] += p[g * L + o] * v_o for a block's n values (p points at the block's first column of the [G, L]
// weights): for each output float a chain of multiply-adds in order of o.
template <typename T>
static inline void value_block(const T* __restrict__ vt, int64_t n, int64_t G, int64_t D,
                               const float* __restrict__ p, int64_t L, float* __restrict__ acc) {
#ifdef __AVX512F__
  if (D % 16 == 0) {
    for (int64_t g = 0; g < G; ++g) {
      const float* pg = p + g * L;
      for (int64_t d = 0; d < D; d += 16) {
        __m512 a = _mm512_loadu_ps(acc + g * D + d);
        for (int64_t o = 0; o < n; ++o)
          a = _mm512_fmadd_ps(_mm512_set1_ps(pg[o]), load16(vt + o * D + d), a);
        _mm512_storeu_ps(acc + g * D + d, a);
      }
    }
    return;
  }
#endif
  const float* __restrict__ vblk = as_float(vt, n * D);
  for (int64_t g = 0; g < G; ++g) {  // four values per load and store of the accumulator
    const float* pg = p + g * L;
    float* __restrict__ ag = acc + g * D;
    int64_t o = 0;
    for (; o + 4 <= n; o += 4) {
      const float *v0 = vblk + o * D, *v1 = v0 + D, *v2 = v1 + D, *v3 = v2 + D;
      const float w0 = pg[o], w1 = pg[o + 1], w2 = pg[o + 2], w3 = pg[o + 3];
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) {
        float a = ag[d];
        a += w0 * v0[d];
        a += w1 * v1[d];
        a += w2 * v2[d];
        a += w3 * v3[d];
        ag[d] = a;
      }
    }
    for (; o < n; ++o) {
      const float w = pg[o];
      const float* vo = vblk + o * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) ag[d] += w * vo[d];
    }
  }
}

// acc[g] += p[g * L] * v for the G heads (p points at the value's column of the [G, L] weights).
template <typename T>
static inline void add_value(const T* vt, int64_t G, int64_t D, const float* p, int64_t L, float* acc) {
  value_block(vt, 1, G, D, p, L, acc);
}

// Ask for a block's n elements ahead of use, a 64-byte line at a time (blocks are scattered in memory:
// the hardware prefetcher follows a block, not the jump to the next one).
template <typename T>
static inline void prefetch_block(const T* p, int64_t n) {
  for (int64_t i = 0; i < n; i += 64 / sizeof(T)) __builtin_prefetch(p + i, 0, 3);
}

// The same into L2 only (prefetcht1), for blocks further ahead: L2 holds more requests in flight than L1
template <typename T>
static inline void prefetch_block_l2(const T* p, int64_t n) {
  for (int64_t i = 0; i < n; i += 64 / sizeof(T)) __builtin_prefetch(p + i, 0, 2);
}
static constexpr int64_t DECODE_AHEAD = 6;  // paged_decode: blocks asked into L2 this far ahead

#ifdef __AVX512F__
// The sums of 16 vectors' lanes, key k's in lane k, each the float _mm512_reduce_add_ps gives (the same
// pairs added in the same order: lane i + i + 8, then + 4, + 2, + 1) in ~3 ops a vector where a
// reduction takes ~8: four levels of shuffles that each add two vectors' halves, then one permutation
// back to key order.
static inline __m512 reduce16(const __m512* p) {
  __m512 s[8], t[4], u[2];
  for (int i = 0; i < 8; ++i)  // keys 2i, 2i + 1: 8 partial sums each (256-bit halves)
    s[i] = _mm512_add_ps(_mm512_shuffle_f32x4(p[2 * i], p[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(p[2 * i], p[2 * i + 1], 0xEE));
  for (int j = 0; j < 4; ++j)  // keys 4j .. 4j + 3: 4 partials each, one key per 128-bit block
    t[j] = _mm512_add_ps(_mm512_shuffle_f32x4(s[2 * j], s[2 * j + 1], 0x88),
                         _mm512_shuffle_f32x4(s[2 * j], s[2 * j + 1], 0xDD));
  for (int k = 0; k < 2; ++k)  // block b: keys 8k + b and 8k + 4 + b, 2 partials each
    u[k] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * k], t[2 * k + 1], 0x44),
                         _mm512_shuffle_ps(t[2 * k], t[2 * k + 1], 0xEE));
  // lane 4b + c: key b, b + 4, b + 8, b + 12 for c = 0 .. 3
  const __m512 v = _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], 0x88), _mm512_shuffle_ps(u[0], u[1], 0xDD));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, v);
}

// Query heads whose value sums value_heads holds at once for D = 16 * DV: at most 16 accumulator
// registers (with DV for the value row and one weight, within AVX-512's 32), and at most 4 heads.
static constexpr int value_heads_max(int DV) { return DV >= 16 ? 1 : (16 / DV < 4 ? 16 / DV : 4); }

// The value pass of decode_group for GC query heads of a group at once (p: their [GC, L] weights, out:
// their [GC, D] outputs): each value row is loaded (and widened) once for the GC heads, and the GC * DV
// accumulator chains are independent, where one head at a time left DV chains waiting on their FMAs'
// latency. Each accumulator still sums its values in order of o, one FMA each: the same floats.
// ``ahead``: prefetch the next blocks (the first chunk of heads; later chunks find them cached).
template <int DV, int GC, typename T>
static inline void value_heads(const float* p, int64_t L, const T* vb, const int64_t* tab, int64_t bs,
                               bool ahead, float* out) {
  constexpr int64_t D = 16 * DV, AH = DECODE_AHEAD;
  auto block = [&](int64_t t0) { return vb + tab[t0 / bs] * bs * D; };
  __m512 a[GC][DV];
  for (int g = 0; g < GC; ++g)
    for (int v = 0; v < DV; ++v) a[g][v] = _mm512_setzero_ps();
  for (int64_t t0 = 0; t0 < L; t0 += bs) {
    const T* vblk = block(t0);
    if (ahead && t0 + bs < L) prefetch_block(block(t0 + bs), std::min(bs, L - t0 - bs) * D);
    if (ahead && t0 + AH * bs < L) prefetch_block_l2(block(t0 + AH * bs), std::min(bs, L - t0 - AH * bs) * D);
    const int64_t n = std::min(bs, L - t0);
    for (int64_t o = 0; o < n; ++o) {  // value_block's order
      __m512 x[DV];
      for (int v = 0; v < DV; ++v) x[v] = load16(vblk + o * D + 16 * v);
      for (int g = 0; g < GC; ++g) {
        const __m512 w = _mm512_set1_ps(p[g * L + t0 + o]);
        for (int v = 0; v < DV; ++v) a[g][v] = _mm512_fmadd_ps(w, x[v], a[g][v]);
      }
    }
  }
  for (int g = 0; g < GC; ++g)
    for (int v = 0; v < DV; ++v) _mm512_storeu_ps(out + g * D + 16 * v, a[g][v]);
}

// The scores of one query row's G heads (its group at qb) against n keys of one block (kblk): s[g * L + o]
// = scale * q_g . k_o, the floats of score_key, sixteen keys' reductions at once (reduce16).
template <int DV, typename T>
static inline void score_block(const float* qb, const T* kblk, int64_t n, int64_t G, float sc, float* s,
                               int64_t L) {
  constexpr int64_t D = 16 * DV;
  for (int64_t g = 0; g < G; ++g) {
    __m512 q[DV];
    for (int v = 0; v < DV; ++v) q[v] = _mm512_loadu_ps(qb + g * D + 16 * v);
    auto lanes = [&](int64_t o) {  // dot16's per-lane sums for key o of the block
      const T* k = kblk + o * D;
      __m512 p = _mm512_mul_ps(q[0], load16(k));
      for (int v = 1; v < DV; ++v) p = _mm512_fmadd_ps(q[v], load16(k + 16 * v), p);
      return p;
    };
    int64_t o = 0;
    for (; o + 16 <= n; o += 16) {  // dot16's floats, sixteen keys' reductions at once
      __m512 p[16];
      for (int i = 0; i < 16; ++i) p[i] = lanes(o + i);
      _mm512_storeu_ps(s + g * L + o, _mm512_mul_ps(reduce16(p), _mm512_set1_ps(sc)));
    }
    for (; o < n; ++o) s[g * L + o] = _mm512_reduce_add_ps(lanes(o)) * sc;
  }
}

// score_block for a head_dim D that is a multiple of 16, at most 128
template <typename T>
static inline void score_block_d(const float* qb, const T* kblk, int64_t n, int64_t G, int64_t D, float sc,
                                 float* s, int64_t L) {
  switch (D / 16) {
    case 1: score_block<1>(qb, kblk, n, G, sc, s, L); return;
    case 2: score_block<2>(qb, kblk, n, G, sc, s, L); return;
    case 3: score_block<3>(qb, kblk, n, G, sc, s, L); return;
    case 4: score_block<4>(qb, kblk, n, G, sc, s, L); return;
    case 5: score_block<5>(qb, kblk, n, G, sc, s, L); return;
    case 6: score_block<6>(qb, kblk, n, G, sc, s, L); return;
    case 7: score_block<7>(qb, kblk, n, G, sc, s, L); return;
    default: score_block<8>(qb, kblk, n, G, sc, s, L); return;
  }
}

// One (sequence, kv head) of paged_decode for D = 16 * DV: the floats of score_key, softmax_rows and
// value_block, with each head's query and value sums held in registers across all L keys (no store and
// reload of the accumulator per block). kb / vb: the K / V cache of this kv head; s: a [G, L] buffer.
template <int DV, typename T>
static void decode_group(const float* qb, const T* kb, const T* vb, const int64_t* tab, int64_t bs,
                         int64_t L, int64_t G, float sc, float* s, float* out) {
  constexpr int64_t D = 16 * DV, AH = DECODE_AHEAD;
  auto block = [&](const T* base, int64_t t0) { return base + tab[t0 / bs] * bs * D; };
  // the first AH blocks into L2; at each block the next into L1 and the one AH on into L2 (a sequence's
  // blocks are scattered: the hardware prefetcher stops at each block's end)
  for (int64_t a = 0; a < AH && a * bs < L; ++a)
    prefetch_block_l2(block(kb, a * bs), std::min(bs, L - a * bs) * D);
  for (int64_t t0 = 0; t0 < L; t0 += bs) {
    const T* kblk = block(kb, t0);
    if (t0 + bs < L) prefetch_block(block(kb, t0 + bs), std::min(bs, L - t0 - bs) * D);
    if (t0 + AH * bs < L) prefetch_block_l2(block(kb, t0 + AH * bs), std::min(bs, L - t0 - AH * bs) * D);
    score_block<DV>(qb, kblk, std::min(bs, L - t0), G, sc, s + t0, L);
  }
  for (int64_t a = 0; a < AH && a * bs < L; ++a)
    prefetch_block_l2(block(vb, a * bs), std::min(bs, L - a * bs) * D);
  softmax_rows(s, G, L);
  constexpr int GC = value_heads_max(DV);
  for (int64_t g0 = 0; g0 < G; g0 += GC) {
    switch (std::min<int64_t>(GC, G - g0)) {
      case 1: value_heads<DV, 1>(s + g0 * L, L, vb, tab, bs, g0 == 0, out + g0 * D); break;
      case 2: value_heads<DV, (GC >= 2 ? 2 : 1)>(s + g0 * L, L, vb, tab, bs, g0 == 0, out + g0 * D); break;
      case 3: value_heads<DV, (GC >= 3 ? 3 : 1)>(s + g0 * L, L, vb, tab, bs, g0 == 0, out + g0 * D); break;
      default: value_heads<DV, (GC >= 4 ? 4 : 1)>(s + g0 * L, L, vb, tab, bs, g0 == 0, out + g0 * D); break;
    }
  }
}
#endif

// The scores of one query row's G heads (at qb) against n consecutive keys (kblk): s[g * L + o], the
// floats of score_key, sixteen reductions at once where AVX-512 and the head_dim allow (score_block)
template <typename T>
static inline void score_keys(const float* qb, const T* kblk, int64_t n, int64_t G, int64_t D, float sc,
                              float* s, int64_t L) {
#ifdef __AVX512F__
  if (D % 16 == 0 && D <= 128) {
    score_block_d(qb, kblk, n, G, D, sc, s, L);
    return;
  }
#endif
  for (int64_t o = 0; o < n; ++o) score_key(qb, kblk + o * D, G, D, sc, s + o, L);
}

// A KV cache the kernels read: float or bfloat16 blocks, keys and values alike (q and out stay float)
static bool kv_is_bf16(const torch::Tensor& q, const torch::Tensor& kc, const torch::Tensor& vc) {
  TORCH_CHECK(q.dtype() == torch::kFloat32, "float32 queries only");
  TORCH_CHECK(kc.dtype() == vc.dtype() && (kc.dtype() == torch::kFloat32 || kc.dtype() == torch::kBFloat16),
              "a float32 or bfloat16 KV cache (keys and values alike)");
  TORCH_CHECK(q.is_contiguous() && kc.is_contiguous() && vc.is_contiguous(), "contiguous inputs");
  return kc.dtype() == torch::kBFloat16;
}

template <typename T>
static torch::Tensor paged_decode_t(const torch::Tensor& q, const torch::Tensor& kc, const torch::Tensor& vc,
                                    const torch::Tensor& tables, const torch::Tensor& lens, double scale) {
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t Hkv = kc.size(0), NB = kc.size(1), bs = kc.size(2);
  const int64_t G = H / Hkv, nbmax = tables.size(1);
  auto out = torch::empty_like(q);
  const float* qp = q.data_ptr<float>();
  const T* kp = kc.data_ptr<T>();
  const T* vp = vc.data_ptr<T>();
  const int64_t* tp = tables.data_ptr<int64_t>();
  const int64_t* lp = lens.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, B * Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> sc_buf, acc(G * D);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / Hkv, hk = i % Hkv;
      const int64_t L = lp[b];
      const float* qb = qp + (b * H + hk * G) * D;
      sc_buf.resize(G * L);
#ifdef __AVX512F__
      if (D % 16 == 0 && D <= 128) {  // up to 8 query and 8 accumulator registers a head
        if (i + 1 < end) {  // this thread's next item's first key blocks, into L2
          const int64_t b2 = (i + 1) / Hkv, hk2 = (i + 1) % Hkv, L2 = lp[b2];
          for (int64_t a = 0; a < DECODE_AHEAD && a * bs < L2; ++a)
            prefetch_block_l2(kp + (hk2 * NB + tp[b2 * nbmax + a]) * bs * D, std::min(bs, L2 - a * bs) * D);
        }
        const T *kb = kp + hk * NB * bs * D, *vb = vp + hk * NB * bs * D;
        float* ob = op + (b * H + hk * G) * D;
        const int64_t* tab = tp + b * nbmax;
        switch (D / 16) {
          case 1: decode_group<1>(qb, kb, vb, tab, bs, L, G, sc, sc_buf.data(), ob); continue;
          case 2: decode_group<2>(qb, kb, vb, tab, bs, L, G, sc, sc_buf.data(), ob); continue;
          case 3: decode_group<3>(qb, kb, vb, tab, bs, L, G, sc, sc_buf.data(), ob); continue;
          case 4: decode_group<4>(qb, kb, vb, tab, bs, L, G, sc, sc_buf.data(), ob); continue;
          case 5: decode_group<5>(qb, kb, vb, tab, bs, L, G, sc, sc_buf.data(), ob); continue;
          case 6: decode_group<6>(qb, kb, vb, tab, bs, L, G, sc, sc_buf.data(), ob); continue;
          case 7: decode_group<7>(qb, kb, vb, tab, bs, L, G, sc, sc_buf.data(), ob); continue;
          case 8: decode_group<8>(qb, kb, vb, tab, bs, L, G, sc, sc_buf.data(), ob); continue;
        }
      }
#endif
      // pass 1: scores q.k for every key of the sequence (each key row loaded once for the group)
      for (int64_t t0 = 0; t0 < L; t0 += bs) {  // block by block: no division per token
        const T* kblk = kp + (hk * NB + tp[b * nbmax + t0 / bs]) * bs * D;
        if (t0 + bs < L) prefetch_block(kp + (hk * NB + tp[b * nbmax + t0 / bs + 1]) * bs * D,
                                        std::min(bs, L - t0 - bs) * D);
        const int64_t n = std::min(bs, L - t0);
        for (int64_t o = 0; o < n; ++o) {
          score_key(qb, kblk + o * D, G, D, sc, sc_buf.data() + t0 + o, L);
        }
      }
      prefetch_block(vp + (hk * NB + tp[b * nbmax]) * bs * D, std::min(bs, L) * D);  // pass 2's first
      // softmax per query head: one exp per score
      softmax_rows(sc_buf.data(), G, L);
      // pass 2: weighted sum of values
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t0 = 0; t0 < L; t0 += bs) {
        const T* vblk = vp + (hk * NB + tp[b * nbmax + t0 / bs]) * bs * D;
        if (t0 + bs < L) prefetch_block(vp + (hk * NB + tp[b * nbmax + t0 / bs + 1]) * bs * D,
                                        std::min(bs, L - t0 - bs) * D);
        value_block(vblk, std::min(bs, L - t0), G, D, sc_buf.data() + t0, L, acc.data());
      }
      for (int64_t g = 0; g < G; ++g) {
        float* o = op + (b * H + hk * G + g) * D;
        for (int64_t d = 0; d < D; ++d) o[d] = acc[g * D + d];
      }
    }
  });
  return out;
}

// q [B, H, D]; kc, vc [Hkv, NB, bs, D]; tables [B, nbmax] int64; lens [B] int64 → out [B, H, D]
torch::Tensor paged_decode(torch::Tensor q, torch::Tensor kc, torch::Tensor vc, torch::Tensor tables,
                           torch::Tensor lens, double scale) {
  NoGil no_gil;
  return kv_is_bf16(q, kc, vc) ? paged_decode_t<bf16>(q, kc, vc, tables, lens, scale)
                               : paged_decode_t<float>(q, kc, vc, tables, lens, scale);
}

// One row of RMSNorm: o = r * (1 / sqrt(mean(r^2) + eps)) * w. Never inlined: the kernel below and the
// drafter's fused forward run this one compiled body, so their floats agree.
__attribute__((noinline)) static void rms_norm_row(const float* r, const float* wp, float* o, int64_t H,
                                                   float eps) {
  float ss = 0.f;
#pragma omp simd reduction(+ : ss)
  for (int64_t h = 0; h < H; ++h) ss += r[h] * r[h];
  const float inv = 1.f / std::sqrt(ss / static_cast<float>(H) + eps);
#pragma omp simd
  for (int64_t h = 0; h < H; ++h) o[h] = r[h] * inv * wp[h];
}

// RMSNorm of x [N, H] with weight [H] in one pass (torch's CPU rms_norm runs ~7 kernels: at a
// drafter's few rows their dispatch costs more than the arithmetic).
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps) {
  NoGil no_gil;
  TORCH_CHECK(x.dtype() == torch::kFloat32 && w.dtype() == torch::kFloat32, "float32 only");
  auto xc = x.contiguous();
  auto out = torch::empty_like(xc);
  const int64_t H = xc.size(-1), N = xc.numel() / H;
  const float* xp = xc.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* op = out.data_ptr<float>();
  for (int64_t n = 0; n < N; ++n) rms_norm_row(xp + n * H, wp, op + n * H, H, static_cast<float>(eps));
  return out;
}

// Multi-token rows (prefill chunks, draft trees) straight from the blocks. Sequence b's rows are
// qoff[b] .. qoff[b] + qlen[b] - 1; its i-th new token sees the sequence's ctx[b] cached keys
// and, among the new keys ctx[b] + j (j < qlen[b]), those with j <= i (causal: moff[b] < 0) or
// those set in its mask row mask[moff[b] + i * qlen[b] + j] (a tree). New keys are in the cache.
//
// Threads split over (sequence, kv head, chunk of up to ROWS rows). A chunk's rows share the
// cached keys, so each key and value row is loaded once for all of them. Two orders of arithmetic:
// * moff[b] == -1 (plain causal rows: prefill chunks, a plain forward's few rows): each row's
//   multiply-adds run in the order of the one-row code (score_key per key, value_block = add_value's
//   order), so a row's floats are those paged_decode gives it, and plain decoding's floats do not
//   depend on how its tokens were chunked.
// * moff[b] >= 0 (a draft tree) or moff[b] == -2 (causal rows of a speculative forward: the drafter's
//   context pass): tiled_rows, 16 query rows (x GQA heads) per vector lane, ~3-5x faster; floats
//   differ from the one-row order by rounding (a speculative forward's linears already differ from a
//   one-row step's: GEMM shapes), and each row's still do not depend on the rows beside it.
// One work item in the tiled order: query rows i0 .. i0 + R - 1 of a sequence (flat rows row0 ..), kv
// head hk, over its L keys. Lane x * G + g of a vector holds row x's query head g. Every key is scored
// against every lane, NK keys at a time (a lane's dot product runs over d in order). Which keys a row
// sees: with an additive mask (madd: row i's at madd + i * mstride, one value per key, as SDPA's
// attn_mask) every key plus its mask value; else the keys before c, and among the new keys c + j
// (j < ql) those set in its bool mask row (mrow0 + i * ql) or, without one, j <= i (causal). A key a
// row does not see gets -inf, so its weight is exactly 0 and adds exactly nothing below. Keys sit in
// blocks of bs rows: block t / bs at kbase / vbase + tab[t / bs] * bs * D.
struct TiledScratch { std::vector<vf16> qT, sw, acc; };  // [D][V], [L][V], [D][V]

template <typename T>
static void tiled_rows(const float* qp, const T* kbase, const T* vbase, const int64_t* tab,
                       int64_t bs, int64_t L, int64_t c, int64_t ql, int64_t i0, int64_t R, int64_t row0,
                       const bool* mrow0, const float* madd, int64_t mstride, int64_t hk, int64_t H,
                       int64_t G, int64_t D, float sc, float* op, TiledScratch& s) {
  constexpr int64_t NK = 8, DC = 8;
  const int64_t V = (R * G + 15) / 16;
  auto lane = [](std::vector<vf16>& t, int64_t at, int64_t V, int64_t l) -> float& {
    return t[at * V + l / 16][l % 16];
  };
  s.qT.assign(D * V, vf16{});
  for (int64_t x = 0; x < R; ++x)
    for (int64_t g = 0; g < G; ++g) {
      const float* qv = qp + ((row0 + x) * H + hk * G + g) * D;
      for (int64_t d = 0; d < D; ++d) lane(s.qT, d, V, x * G + g) = qv[d];
    }
  auto block = [&](const T* base, int64_t t) { return base + tab[t / bs] * bs * D; };
  s.sw.resize(L * V);
  for (int64_t t0 = 0; t0 < L; t0 += bs) {  // scores
    if (t0 + bs < L) prefetch_block(block(kbase, t0 + bs), std::min(bs, L - t0 - bs) * D);
    const int64_t n = std::min(bs, L - t0);
    const float* kblk = as_float(block(kbase, t0), n * D);  // a bfloat16 block widened once, not per lane
    for (int64_t v = 0; v < V; ++v) {
      int64_t o = 0;
      for (; o + NK <= n; o += NK) {
        vf16 a[NK] = {};
        for (int64_t d = 0; d < D; ++d) {
          const vf16 qd = s.qT[d * V + v];
          for (int64_t k = 0; k < NK; ++k) a[k] = a[k] + qd * kblk[(o + k) * D + d];
        }
        for (int64_t k = 0; k < NK; ++k) s.sw[(t0 + o + k) * V + v] = a[k] * sc;
      }
      for (; o < n; ++o) {
        vf16 a = {};
        for (int64_t d = 0; d < D; ++d) a = a + s.qT[d * V + v] * kblk[o * D + d];
        s.sw[(t0 + o) * V + v] = a * sc;
      }
    }
  }
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t x = 0; x < R; ++x) {
    const int64_t i = i0 + x;
    if (madd) {
      const float* mr = madd + i * mstride;
      for (int64_t t = 0; t < L; ++t)
        for (int64_t g = 0; g < G; ++g) lane(s.sw, t, V, x * G + g) += mr[t];
      continue;
    }
    const bool* row = mrow0 ? mrow0 + i * ql : nullptr;
    for (int64_t j = 0; j < ql; ++j)
      if (!(row ? row[j] : j <= i))
        for (int64_t g = 0; g < G; ++g) lane(s.sw, c + j, V, x * G + g) = ninf;
  }
  for (int64_t v = 0; v < V; ++v) {  // softmax of every lane over the L keys
    vf16 mx = vf16{} + ninf;
    for (int64_t t = 0; t < L; ++t) mx = s.sw[t * V + v] > mx ? s.sw[t * V + v] : mx;
    vf16 sum = {};
    for (int64_t t = 0; t < L; ++t) {
      const vf16 e = exp_le0(s.sw[t * V + v] - mx);
      s.sw[t * V + v] = e;
      sum = sum + e;
    }
    const vf16 inv = sum > 0.f ? 1.f / sum : vf16{};
    for (int64_t t = 0; t < L; ++t) s.sw[t * V + v] = s.sw[t * V + v] * inv;
  }
  // values: acc[d][lane] += v_t[d] * w_t[lane], DC dims held in registers across a block's keys
  s.acc.assign(D * V, vf16{});
  for (int64_t t0 = 0; t0 < L; t0 += bs) {  // values
    if (t0 + bs < L) prefetch_block(block(vbase, t0 + bs), std::min(bs, L - t0 - bs) * D);
    const int64_t n = std::min(bs, L - t0);
    const float* vblk = as_float(block(vbase, t0), n * D);
    for (int64_t v = 0; v < V; ++v) {
      int64_t d0 = 0;
      for (; d0 + DC <= D; d0 += DC) {
        vf16 a[DC];
        for (int64_t k = 0; k < DC; ++k) a[k] = s.acc[(d0 + k) * V + v];
        for (int64_t o = 0; o < n; ++o) {
          const vf16 wt = s.sw[(t0 + o) * V + v];
          const float* vr = vblk + o * D + d0;
          for (int64_t k = 0; k < DC; ++k) a[k] = a[k] + wt * vr[k];
        }
        for (int64_t k = 0; k < DC; ++k) s.acc[(d0 + k) * V + v] = a[k];
      }
      for (; d0 < D; ++d0)  // a head_dim off the multiple of DC: the same sums, one dim at a time
        for (int64_t o = 0; o < n; ++o)
          s.acc[d0 * V + v] = s.acc[d0 * V + v] + s.sw[(t0 + o) * V + v] * vblk[o * D + d0];
    }
  }
  for (int64_t x = 0; x < R; ++x)
    for (int64_t g = 0; g < G; ++g) {
      float* o = op + ((row0 + x) * H + hk * G + g) * D;
      for (int64_t d = 0; d < D; ++d) o[d] = lane(s.acc, d, V, x * G + g);
    }
}

template <typename T>
static torch::Tensor paged_attention_t(const torch::Tensor& q, const torch::Tensor& kc,
                                       const torch::Tensor& vc, const torch::Tensor& tables,
                                       const torch::Tensor& ctx, const torch::Tensor& qoff,
                                       const torch::Tensor& qlen, const torch::Tensor& moff,
                                       const torch::Tensor& mask, double scale) {
  constexpr int64_t ROWS = 16;
  const int64_t H = q.size(1), D = q.size(2);
  const int64_t Hkv = kc.size(0), NB = kc.size(1), bs = kc.size(2);
  const int64_t G = H / Hkv, nbmax = tables.size(1), S = ctx.size(0);
  auto out = torch::empty_like(q);
  const float* qp = q.data_ptr<float>();
  const T* kp = kc.data_ptr<T>();
  const T* vp = vc.data_ptr<T>();
  const int64_t* tp = tables.data_ptr<int64_t>();
  const int64_t* cp = ctx.data_ptr<int64_t>();
  const int64_t* op_ = qoff.data_ptr<int64_t>();
  const int64_t* lp = qlen.data_ptr<int64_t>();
  const int64_t* mp = moff.data_ptr<int64_t>();
  const bool* mk = mask.data_ptr<bool>();
  float* op = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  std::vector<int64_t> wseq, wrow;  // work chunks: sequence, first row
  for (int64_t b = 0; b < S; ++b)
    for (int64_t i0 = 0; i0 < lp[b]; i0 += ROWS) { wseq.push_back(b); wrow.push_back(i0); }
  const int64_t W = static_cast<int64_t>(wseq.size());
  at::parallel_for(0, W * Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> sc_buf, acc;
    std::vector<int64_t> vis, vis_at;  // one-row order: visible new keys, row x's from vis_at[x]
    TiledScratch tiled;
    for (int64_t r = begin; r < end; ++r) {
      const int64_t w = r / Hkv, hk = r % Hkv, b = wseq[w], i0 = wrow[w];
      const int64_t c = cp[b], ql = lp[b], R = std::min(ROWS, ql - i0), stride = G * (c + ql);
      if (mp[b] != -1 && mp[b] > -3) {
        tiled_rows(qp, kp + hk * NB * bs * D, vp + hk * NB * bs * D, tp + b * nbmax, bs, c + ql, c, ql, i0, R,
                   op_[b] + i0, mp[b] >= 0 ? mk + mp[b] : nullptr, nullptr, 0, hk, H, G, D, sc, op, tiled);
        continue;
      }
      // the one-row order. Causal (-1): row x sees the cached keys and new keys 0 .. i0 + x. A tree in
      // this order (moff <= -3, its mask rows at -3 - moff): the new keys set in its mask row, taken in
      // order and packed after the cached ones, so a node's floats are those plain decoding gives the
      // same token once its ancestors are cached in order (the batch-invariant engine's verification)
      const bool* mrow = mp[b] <= -3 ? mk + (-3 - mp[b]) : nullptr;
      vis.clear();
      vis_at.assign(R + 1, 0);
      for (int64_t x = 0; x < R; ++x) {
        for (int64_t y = 0; y < (mrow != nullptr ? ql : i0 + x + 1); ++y)
          if (mrow == nullptr || mrow[(i0 + x) * ql + y]) vis.push_back(y);
        vis_at[x + 1] = static_cast<int64_t>(vis.size());
      }
      // row x: a [G, L_x] score buffer at x * stride, L_x = c + its visible new keys
      sc_buf.resize(R * stride);
      acc.assign(R * G * D, 0.f);
      const float* qb = qp + ((op_[b] + i0) * H + hk * G) * D;  // row x's group at qb + x * H * D
      // the block holding key t of this sequence and kv head, in the K or V cache; the cached one after
      // t0's block asked for ahead of use
      auto block = [&](const T* cache, int64_t t) {
        return cache + (hk * NB + tp[b * nbmax + t / bs]) * bs * D;
      };
      auto prefetch_next = [&](const T* cache, int64_t t0) {
        if (t0 + bs < c) prefetch_block(block(cache, t0 + bs), std::min(bs, c - t0 - bs) * D);
      };
      auto row_len = [&](int64_t x) { return c + vis_at[x + 1] - vis_at[x]; };
      // value_block over several values gives add_value's floats value by value in its 512-bit loops
#ifdef __AVX512F__
      const bool vector_values = D % 16 == 0;
#else
      const bool vector_values = false;
#endif
      // a causal row's new keys c .. c + i0 + x as segments within blocks: fn(first key, count)
      auto segments = [&](int64_t x, auto fn) {
        for (int64_t t = c, end = c + i0 + x + 1; t < end;) {
          const int64_t n = std::min(end - t, bs - t % bs);
          fn(t, n);
          t += n;
        }
      };
      // pass 1: the cached keys' scores for every row, each key row loaded once
      for (int64_t t0 = 0; t0 < c; t0 += bs) {
        const T* kblk = block(kp, t0);
        prefetch_next(kp, t0);
        for (int64_t x = 0; x < R; ++x)
          score_keys(qb + x * H * D, kblk, std::min(bs, c - t0), G, D, sc, sc_buf.data() + x * stride + t0,
                     row_len(x));
      }
      // each row's visible new keys, then its softmax
      for (int64_t x = 0; x < R; ++x) {
        const int64_t L = row_len(x);
        if (mrow == nullptr)  // causal: block segment by block segment
          segments(x, [&](int64_t t, int64_t n) {
            score_keys(qb + x * H * D, block(kp, t) + (t % bs) * D, n, G, D, sc,
                       sc_buf.data() + x * stride + t, L);
          });
        else
          for (int64_t j = vis_at[x]; j < vis_at[x + 1]; ++j) {
            const int64_t t = c + vis[j];
            score_key(qb + x * H * D, block(kp, t) + (t % bs) * D, G, D, sc,
                      sc_buf.data() + x * stride + c + j - vis_at[x], L);
          }
        softmax_rows(sc_buf.data() + x * stride, G, L);
      }
      // pass 2: the cached values for every row, then each row's new ones
      if (c > 0) prefetch_block(block(vp, 0), std::min(bs, c) * D);
      for (int64_t t0 = 0; t0 < c; t0 += bs) {
        const T* vblk = block(vp, t0);
        prefetch_next(vp, t0);
        const int64_t n = std::min(bs, c - t0);
        for (int64_t x = 0; x < R; ++x)
          value_block(vblk, n, G, D, sc_buf.data() + x * stride + t0, row_len(x), acc.data() + x * G * D);
      }
      for (int64_t x = 0; x < R; ++x) {
        const int64_t L = row_len(x);
        if (vector_values && mrow == nullptr)  // causal: value_block over a segment
          segments(x, [&](int64_t t, int64_t n) {
            value_block(block(vp, t) + (t % bs) * D, n, G, D, sc_buf.data() + x * stride + t, L,
                        acc.data() + x * G * D);
          });
        else
          for (int64_t j = vis_at[x]; j < vis_at[x + 1]; ++j) {
            const int64_t t = c + vis[j];
            add_value(block(vp, t) + (t % bs) * D, G, D, sc_buf.data() + x * stride + c + j - vis_at[x], L,
                      acc.data() + x * G * D);
          }
        for (int64_t g = 0; g < G; ++g) {
          float* o = op + ((op_[b] + i0 + x) * H + hk * G + g) * D;
          for (int64_t d = 0; d < D; ++d) o[d] = acc[(x * G + g) * D + d];
        }
      }
    }
  });
  return out;
}

torch::Tensor paged_attention(torch::Tensor q, torch::Tensor kc, torch::Tensor vc, torch::Tensor tables,
                              torch::Tensor ctx, torch::Tensor qoff, torch::Tensor qlen,
                              torch::Tensor moff, torch::Tensor mask, double scale) {
  NoGil no_gil;
  const bool half = kv_is_bf16(q, kc, vc);
  TORCH_CHECK(mask.dtype() == torch::kBool && mask.is_contiguous(), "bool contiguous mask");
  return half ? paged_attention_t<bf16>(q, kc, vc, tables, ctx, qoff, qlen, moff, mask, scale)
              : paged_attention_t<float>(q, kc, vc, tables, ctx, qoff, qlen, moff, mask, scale);
}

// Attention over dense per-sequence key/value buffers with an additive mask, in the tiled order: what
// the drafter's tree steps ran through SDPA (TreeAttention). q [B, T, H, D]; kb, vb [B, Hkv, W, D] (the
// first n keys are read); mask: additive, float, row i of sequence b at b * stride(0) + i * stride(2),
// n values each ([B, 1, T, >= n] with its last dim contiguous) → out [B, T, H, D].
torch::Tensor dense_attention(torch::Tensor q, torch::Tensor kb, torch::Tensor vb, int64_t n,
                              torch::Tensor mask, double scale) {
  NoGil no_gil;
  TORCH_CHECK(q.dtype() == torch::kFloat32 && kb.dtype() == torch::kFloat32, "float32 only");
  TORCH_CHECK(mask.dtype() == torch::kFloat32, "an additive float32 mask");
  TORCH_CHECK(q.is_contiguous() && kb.is_contiguous() && vb.is_contiguous(), "contiguous q, k, v");
  TORCH_CHECK(mask.dim() == 4 && mask.stride(3) == 1 && mask.size(2) == q.size(1) && mask.size(3) >= n,
              "mask [B, 1, T, >= n] with a contiguous last dim");
  constexpr int64_t ROWS = 16;
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3);
  const int64_t Hkv = kb.size(1), W = kb.size(2), G = H / Hkv;
  TORCH_CHECK(n >= 1 && n <= W, "n keys within the buffers");
  auto out = torch::empty_like(q);
  const float* qp = q.data_ptr<float>();
  const float* kp = kb.data_ptr<float>();
  const float* vp = vb.data_ptr<float>();
  const float* mp = mask.data_ptr<float>();
  const int64_t ms0 = mask.stride(0), ms2 = mask.stride(2);
  float* op = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  const int64_t chunks = (T + ROWS - 1) / ROWS;
  static const int64_t zero = 0;  // one block per sequence and head: W keys
  at::parallel_for(0, B * chunks * Hkv, 1, [&](int64_t begin, int64_t end) {
    TiledScratch tiled;
    for (int64_t r = begin; r < end; ++r) {
      const int64_t hk = r % Hkv, w = r / Hkv, b = w / chunks, i0 = (w % chunks) * ROWS;
      const int64_t off = (b * Hkv + hk) * W * D;
      tiled_rows(qp, kp + off, vp + off, &zero, W, n, n, 0, i0, std::min(ROWS, T - i0), b * T + i0, nullptr,
                 mp + b * ms0, ms2, hk, H, G, D, sc, op, tiled);
    }
  });
  return out;
}
"""

_lock = threading.Lock()
_module = None
_failed = False


def kernel():
    """The compiled module, or None when it cannot be built here (then callers use PyTorch)."""
    global _module, _failed
    if _module is not None or _failed:
        return _module
    with _lock:
        if _module is None and not _failed:
            if os.environ.get("GAMBIT_NO_CPU_KERNEL"):
                _failed = True
                return None
            try:
                from gambit.engine.cpu_decoder import SOURCE as DECODER_SOURCE  # uses the kernels here
                from gambit.engine.cpu_filter import SOURCE as FILTER_SOURCE  # uses cpu_rank's
                from gambit.engine.cpu_gemv import SOURCE as GEMV_SOURCE
                from gambit.engine.cpu_invariant import SOURCE as INVARIANT_SOURCE
                from gambit.engine.cpu_logprobs import SOURCE as LOGPROBS_SOURCE  # uses cpu_decoder's
                from gambit.engine.cpu_rank import SOURCE as RANK_SOURCE  # uses cpu_decoder's
                from gambit.engine.cpu_sample_step import SOURCE as STEP_SOURCE  # uses the three above
                from gambit.engine.cpu_sampler import SOURCE as SAMPLER_SOURCE
                from gambit.engine.kernel_build import load_kernels
                from gambit.engine.kv_cache import SOURCE as KV_SOURCE
                from gambit.speculative.cpu_drafter import SOURCE as DRAFTER_SOURCE  # uses both
                from gambit.speculative.cpu_tree import SOURCE as TREE_SOURCE  # uses the drafter's
                from gambit.speculative.tap_store import SOURCE as TAP_SOURCE

                sources = [_SOURCE, GEMV_SOURCE, INVARIANT_SOURCE, DECODER_SOURCE, DRAFTER_SOURCE,
                           TREE_SOURCE, RANK_SOURCE, FILTER_SOURCE, SAMPLER_SOURCE,
                           LOGPROBS_SOURCE, STEP_SOURCE, KV_SOURCE, TAP_SOURCE]
                digest = hashlib.sha256("".join(sources).encode()).hexdigest()[:12]
                # named by its source: checkouts of different versions never share (or race on) a build
                name = f"gambit_cpu_kernels_{digest}"
                _module = load_kernels(
                    name, sources,
                    ["paged_decode", "paged_attention", "dense_attention", "rms_norm", "gemv_t",
                     "invariant_linear", "invariant_rowdot", "invariant_sigmoid", "invariant_gru_cell",
                     "decoder_layers", "drafter_forward", "tree_draft",
                     "sample_tokens", "argmax_rows", "sample_step", "fused_sampler_exact",
                     "sample_exp_rows", "topk_rows",
                     "log_softmax_rows", "sort_desc_rows", "filter_rows",
                     "kv_copy_slots", "rows_to_slots", "fused_silu_exact", "aten_rms_norm",
                     "aten_rms_norm_exact"],
                    ["-O3", "-march=native", "-fopenmp"], ["-fopenmp"])
            except Exception as e:  # no compiler, no ninja, ...: keep the portable path
                log.warning("CPU paged-attention kernel unavailable (%s); using the PyTorch path", e)
                _failed = True
    return _module


def paged_decode(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, tables: torch.Tensor,
                 lens: torch.Tensor, scale: float) -> torch.Tensor:
    """q [B, H, D], caches [Hkv, NB, bs, D], tables [B, nb], lens [B] → [B, H, D]."""
    return kernel().paged_decode(q.contiguous(), kc, vc, tables, lens, scale)


def paged_attention(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, tables: torch.Tensor,
                    ctx: torch.Tensor, qoff: torch.Tensor, qlen: torch.Tensor, moff: torch.Tensor,
                    mask: torch.Tensor, scale: float) -> torch.Tensor:
    """Multi-token rows: q [N, H, D]; per sequence ctx/qoff/qlen/moff [B] (moff < 0: causal among
    the new tokens, else the offset of its [qlen, qlen] rows in the flat bool ``mask``) → [N, H, D]."""
    return kernel().paged_attention(q.contiguous(), kc, vc, tables, ctx, qoff, qlen, moff, mask, scale)


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n: int, mask: torch.Tensor,
                    scale: float) -> torch.Tensor:
    """q [B, T, H, D]; k, v [B, Hkv, W, D] (the first n keys read); mask additive [B, 1, T, >= n]
    (float, last dim contiguous) → [B, T, H, D], in the tiled order (SDPA's result to rounding)."""
    return kernel().dense_attention(q.contiguous(), k, v, n, mask, scale)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim in one kernel call (fp32 CPU; see ``RMSNorm.fast``)."""
    return kernel().rms_norm(x, weight, eps)
