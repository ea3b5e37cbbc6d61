"""One-row products of large fp32 or bfloat16 weights, streamed from memory in one pass (a small C++
kernel).

At batch 1 a decode step is the whole model's weights read once: a 135M-parameter model is 538 MB
per token, so the step is bounded by memory bandwidth, and the one-row GEMMs of MKL and oneDNN read
weights at 11-25 GB/s against the 26 GB/s a plain ``x.sum()`` streams on the same machine (README,
"A real checkpoint"). This kernel multiplies ``x [1, in]`` by the transposed layout the engine already
stores (``wt [in, out]`` contiguous, ``engine/linear.py``): ``GEMV_PARTS`` fixed contiguous bands of
input rows, each streamed front to back into its own partial sums held in L1-sized tiles of outputs
(four weight rows per pass over a tile, vectorised over the outputs), then the partials added in a
fixed order. The bands are fixed, not per thread, so the floats do not depend on the thread count.

The sums run in a different order from MKL's, so only weights of at least
``linear.STREAM_MIN_ELEMENTS`` take this path: the shipped 2.7M target keeps exactly its floats.

Bfloat16 weights (``EngineConfig.cpu_weights``) stream the same way at half the bytes: each weight is
widened to fp32 exactly (interleaved with a zero word: a bfloat16 is a float's top half), the sums run
in fp32 in the same order, and as in oneDNN's bfloat16 products of several rows the row is rounded to
bfloat16 first and each output last.
"""

from __future__ import annotations

import torch

from gambit.engine import cpu_attention

SOURCE = r"""
#include <ATen/record_function.h>

static constexpr int64_t GEMV_PARTS = 4;    // input-row bands (fixed: floats independent of threads)
static constexpr int64_t GEMV_TILE = 4096;  // outputs per accumulator tile (16 KB, stays in L1)

// a weight as fp32: itself, or a bfloat16's bits shifted into a float's top half (exact)
static inline float wval(float w) { return w; }
static inline float wval(c10::BFloat16 w) {
  const uint32_t bits = static_cast<uint32_t>(w.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

#ifdef __AVX512F__
#include <immintrin.h>
// gemv_band for bfloat16 weights, 32 outputs (one 64-byte line of a row) at a time, eight rows a pass:
// each line's 32 weights widened to fp32 exactly by interleaving them with zero words (a bfloat16 is a
// float's top half), one in-lane unpack per 16 weights where a zero-extend and a shift took two (the
// widening, not the memory, held the kernel back on AVX-512 CPUs that split 512-bit ops, e.g. Zen 4).
// The unpack leaves the columns in the order {0-3, 8-11, 16-19, 24-27 | 4-7, ...}; the accumulators keep
// that order and each tile is put back in column order once at its end. The sums are those of
// gemv_band: in order of i, one FMA per weight.
static constexpr int GEMV_ROWS = 8;
static void gemv_band_bf16(const float* x, const c10::BFloat16* wt, int64_t i0, int64_t i1, int64_t out,
                           float* acc) {
  const __m512i zero = _mm512_setzero_si512();
  const __m512i to_lo = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
  const __m512i to_hi = _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10, 9, 8);
  const auto lo16 = [&](__m512i v) { return _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, v)); };
  const auto hi16 = [&](__m512i v) { return _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, v)); };
  for (int64_t c0 = 0; c0 < out; c0 += GEMV_TILE) {
    const int64_t c1 = std::min(out, c0 + GEMV_TILE), cv = c0 + (c1 - c0) / 32 * 32;
    std::fill(acc + c0, acc + c1, 0.f);
    for (int64_t i = i0; i < i1; i += GEMV_ROWS) {
      const int rows = static_cast<int>(std::min<int64_t>(GEMV_ROWS, i1 - i));
      __m512 a[GEMV_ROWS];
      const c10::BFloat16* w[GEMV_ROWS];
      for (int r = 0; r < rows; ++r) {
        a[r] = _mm512_set1_ps(x[i + r]);
        w[r] = wt + (i + r) * out;
      }
      // the vector part of a pass over n rows; n a compile-time constant for full passes (unrolled)
      const auto lines = [&](auto n) {
        for (int64_t c = c0; c < cv; c += 32) {
          __m512 lo = _mm512_loadu_ps(acc + c), hi = _mm512_loadu_ps(acc + c + 16);
          for (int r = 0; r < n; ++r) {
            const __m512i v = _mm512_loadu_si512(w[r] + c);
            lo = _mm512_fmadd_ps(a[r], lo16(v), lo);
            hi = _mm512_fmadd_ps(a[r], hi16(v), hi);
          }
          _mm512_storeu_ps(acc + c, lo);
          _mm512_storeu_ps(acc + c + 16, hi);
        }
      };
      if (rows == GEMV_ROWS)
        lines(std::integral_constant<int, GEMV_ROWS>{});
      else
        lines(rows);
      for (int64_t c = cv; c < c1; ++c) {
        float s = acc[c];
        for (int r = 0; r < rows; ++r) s = std::fma(x[i + r], wval(w[r][c]), s);
        acc[c] = s;
      }
    }
    for (int64_t c = c0; c < cv; c += 32) {  // back to column order
      const __m512 lo = _mm512_loadu_ps(acc + c), hi = _mm512_loadu_ps(acc + c + 16);
      _mm512_storeu_ps(acc + c, _mm512_permutex2var_ps(lo, to_lo, hi));
      _mm512_storeu_ps(acc + c + 16, _mm512_permutex2var_ps(lo, to_hi, hi));
    }
  }
}
#endif

// acc[0:out] = sum over i in [i0, i1) of x[i] * wt[i, :], in order of i, tile by tile.
template <typename W>
static void gemv_band(const float* x, const W* wt, int64_t i0, int64_t i1, int64_t out, float* acc) {
  for (int64_t c0 = 0; c0 < out; c0 += GEMV_TILE) {
    const int64_t c1 = std::min(out, c0 + GEMV_TILE);
    std::fill(acc + c0, acc + c1, 0.f);
    int64_t i = i0;
    for (; i + 4 <= i1; i += 4) {
      const float a0 = x[i], a1 = x[i + 1], a2 = x[i + 2], a3 = x[i + 3];
      const W *w0 = wt + i * out, *w1 = w0 + out, *w2 = w1 + out, *w3 = w2 + out;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c)
        acc[c] = acc[c] + a0 * wval(w0[c]) + a1 * wval(w1[c]) + a2 * wval(w2[c]) + a3 * wval(w3[c]);
    }
    for (; i < i1; ++i) {
      const float a = x[i];
      const W* w = wt + i * out;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) acc[c] = acc[c] + a * wval(w[c]);
    }
  }
}

// y [..., out] = res + x @ wt (res: none, or a tensor of y's shape, added last as at::add would) for x
// [..., in] holding one row (fp32) and wt [in, out] contiguous fp32 or bfloat16.
// w is the weight as the model holds it, [out, in] viewed over contiguous [in, out] storage (strides
// (1, out)), or with transposed = false that storage itself.
static at::Tensor gemv_add(const at::Tensor& x, const at::Tensor& w, const at::Tensor* res, bool transposed) {
  const int64_t in = w.size(transposed ? 1 : 0), out = w.size(transposed ? 0 : 1);
  const bool bf16 = w.scalar_type() == at::kBFloat16;
  TORCH_CHECK(w.dim() == 2 && (w.scalar_type() == at::kFloat || bf16) && w.stride(transposed ? 0 : 1) == 1 &&
                  w.stride(transposed ? 1 : 0) == out,
              "gemv_t: wt must be a contiguous [in, out] of float32 or bfloat16");
  TORCH_CHECK(x.numel() == in && x.scalar_type() == at::kFloat, "gemv_t: x must hold one row of ", in);
  RECORD_FUNCTION("gambit::gemv_t", std::vector<c10::IValue>({x, w}));
  // bfloat16 weights: the row rounded to bfloat16 and each sum rounded to bfloat16 before the residual,
  // what oneDNN's bfloat16 products of two or more rows give (PackedLinear "onednn-bf16"), so one-row and
  // multi-row products of a model differ only in their order of summation
  auto xc = x.contiguous();
  const float* xp = xc.data_ptr<float>();
  thread_local std::vector<float> parts, rounded;  // per calling thread: no allocation per call
  if (bf16) {  // rounded here: two ATen conversions cost more than this loop
    rounded.resize(in);
    for (int64_t i = 0; i < in; ++i) rounded[i] = static_cast<float>(c10::BFloat16(xp[i]));
    xp = rounded.data();
  }
  parts.resize(GEMV_PARTS * out);
  float* pp = parts.data();
  const int64_t band = ((in + GEMV_PARTS - 1) / GEMV_PARTS + 3) / 4 * 4;
  at::parallel_for(0, GEMV_PARTS, 1, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      const int64_t i0 = std::min(in, p * band), i1 = std::min(in, i0 + band);
      if (bf16)
#ifdef __AVX512F__
        gemv_band_bf16(xp, w.data_ptr<c10::BFloat16>(), i0, i1, out, pp + p * out);
#else
        gemv_band(xp, w.data_ptr<c10::BFloat16>(), i0, i1, out, pp + p * out);
#endif
      else
        gemv_band(xp, w.data_ptr<float>(), i0, i1, out, pp + p * out);
    }
  });
  auto shape = x.sizes().vec();
  shape.back() = out;
  auto y = at::empty(shape, x.options());
  float* yp = y.data_ptr<float>();
  at::Tensor rc;
  const float* rp = nullptr;
  if (res != nullptr) {
    TORCH_CHECK(res->numel() == out && res->scalar_type() == at::kFloat, "gemv_t: residual of ", out);
    rc = res->contiguous();
    rp = rc.data_ptr<float>();
  }
  at::parallel_for(0, out, 16384, [&](int64_t b, int64_t e) {
    if (bf16) {
      for (int64_t c = b; c < e; ++c) {
        float s = pp[c];
        for (int64_t p = 1; p < GEMV_PARTS; ++p) s = s + pp[p * out + c];
        s = static_cast<float>(c10::BFloat16(s));  // round to nearest even
        yp[c] = rp != nullptr ? rp[c] + s : s;
      }
      return;
    }
#pragma omp simd
    for (int64_t c = b; c < e; ++c) {
      float s = pp[c];
      for (int64_t p = 1; p < GEMV_PARTS; ++p) s = s + pp[p * out + c];
      yp[c] = rp != nullptr ? rp[c] + s : s;
    }
  });
  return res != nullptr ? y.view(res->sizes()) : y;
}

// x [..., in] holding one row (fp32), wt [in, out] contiguous fp32 or bfloat16 -> [..., out] fp32.
torch::Tensor gemv_t(torch::Tensor x, torch::Tensor wt) {
  NoGil no_gil;
  return gemv_add(x, wt, nullptr, false);
}
"""


def gemv(x: torch.Tensor, wt: torch.Tensor) -> torch.Tensor:
    """``x [..., in]`` (one fp32 row) times ``wt [in, out]`` (contiguous, transposed layout; fp32 or
    bfloat16) → [..., out] in fp32."""
    return cpu_attention.kernel().gemv_t(x, wt)
