"""Batch-invariant products: every output row's floats are those of the row alone, at any row count.

Plain decoding multiplies one row at a time (``cpu_gemv``); a verification forward, a batch of
traces or a prefill chunk multiplies many (oneDNN / MKL), in other orders of summation. In fp32 that
moves a logit by ~1e-7; with bfloat16 weights or a bfloat16 KV cache a value near a rounding boundary
moves by a bfloat16 ulp and greedy near-ties flip, so speculative output on a real checkpoint stopped
being plain decoding's token for token (stop 48, ``tools/spec_divergence.py``). Here there is one
order, whatever the rows (``EngineConfig.batch_invariant``):

* the weight ``wt [in, out]`` is packed once into tiles of ``INV_TILE`` output columns, each tile's
  ``in`` rows contiguous (a one-row product streams each tile front to back);
* every output is one chain over the input in order: fp32 weights ``acc = fma(x_i, w_i, acc)``;
  bfloat16 weights (pairs of input rows interleaved) one ``vdpbf16ps`` per pair of inputs (AVX512-BF16;
  elsewhere the same two rounded multiply-adds in plain code), the row rounded to bfloat16 first and
  each output last, as oneDNN's bfloat16 products;
* up to ``INV_ROWS`` rows share each weight load, each in its own registers: more rows cost arithmetic,
  never a different sum. Threads split the tiles, never a sum.
"""

from __future__ import annotations

import torch

from gambit.engine import cpu_attention

INV_TILE = 64  # output columns per tile (four 16-float vectors)

SOURCE = r"""
#include <cfloat>

static constexpr int64_t INV_TILE = 64;  // output columns per tile: four 16-float vectors
static constexpr int INV_ROWS = 6;       // rows per pass over a tile: 24 accumulator registers

// a bfloat16 (its bits) as the fp32 it is, denormals as zero (what vdpbf16ps reads)
static inline float inv_bf(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return (bits & 0x7f800000u) == 0 ? std::copysign(0.f, f) : f;
}
static inline float inv_ftz(float f) { return std::fabs(f) < FLT_MIN ? std::copysign(0.f, f) : f; }

// vdpbf16ps of one lane in plain code: acc + x_odd * w_odd, then + x_even * w_even, each rounded once
// (a product of two bfloat16 is exact in fp32), inputs and results flushed to zero
static inline float inv_dp_pair(float acc, uint32_t xp, uint32_t wp) {
  acc = inv_ftz(std::fma(inv_bf(xp >> 16), inv_bf(wp >> 16), inv_ftz(acc)));
  return inv_ftz(std::fma(inv_bf(xp & 0xffff), inv_bf(wp & 0xffff), acc));
}

// the 32-bit word i of p: an fp32 value, or a pair of bfloat16 (memcpy: the bits of either kind)
static inline uint32_t inv_word(const void* p, int64_t i) {
  uint32_t u;
  std::memcpy(&u, static_cast<const char*>(p) + 4 * i, sizeof u);
  return u;
}

// one step of an output's chain for input word a and weight word w: fp32 fma, or vdpbf16ps's pair
template <bool PAIRS>
static inline float inv_step(float acc, uint32_t a, uint32_t w) {
  if constexpr (PAIRS) {
    return inv_dp_pair(acc, a, w);
  } else {
    float x, y;
    std::memcpy(&x, &a, sizeof x);
    std::memcpy(&y, &w, sizeof y);
    return std::fma(x, y, acc);
  }
}

#ifdef __AVX512F__
#ifdef __AVX512BF16__
static constexpr bool INV_VECTOR_PAIRS = true;
#else
static constexpr bool INV_VECTOR_PAIRS = false;
#endif
// inv_step on sixteen lanes (pairs: AVX512-BF16 only)
template <bool PAIRS>
static inline __m512 inv_step16(__m512 acc, __m512i a, __m512i w) {
#ifdef __AVX512BF16__
  if constexpr (PAIRS) return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)w);
#endif
  return _mm512_fmadd_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(w), acc);
}
#endif

// R rows' outputs for one tile: row r's K input words at x + r * xs (fp32 values, or bfloat16 pairs),
// w the tile's [K][INV_TILE] weight words; out[r][c]. SIMD: the vector instructions where the CPU has
// them, else (and in the tests' comparison) plain code with the same roundings.
template <int R, bool PAIRS, bool SIMD>
static void inv_tile(const void* x, int64_t xs, const void* w, int64_t K, float (*out)[INV_TILE]) {
#ifdef __AVX512F__
  if constexpr (SIMD && (!PAIRS || INV_VECTOR_PAIRS)) {
    __m512 acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
    const char* wb = static_cast<const char*>(w);
    for (int64_t k = 0; k < K; ++k) {
      __m512i wj[4];
      for (int j = 0; j < 4; ++j) wj[j] = _mm512_loadu_si512(wb + 4 * (k * INV_TILE + 16 * j));
      for (int r = 0; r < R; ++r) {
        const __m512i a = _mm512_set1_epi32(static_cast<int>(inv_word(x, r * xs + k)));
        for (int j = 0; j < 4; ++j) acc[r][j] = inv_step16<PAIRS>(acc[r][j], a, wj[j]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < 4; ++j) _mm512_storeu_ps(out[r] + 16 * j, acc[r][j]);
    return;
  }
#endif
  for (int r = 0; r < R; ++r) {
    float acc[INV_TILE] = {};
    for (int64_t k = 0; k < K; ++k) {
      const uint32_t a = inv_word(x, r * xs + k);
      for (int c = 0; c < INV_TILE; ++c) acc[c] = inv_step<PAIRS>(acc[c], a, inv_word(w, k * INV_TILE + c));
    }
    std::memcpy(out[r], acc, sizeof acc);
  }
}

template <bool PAIRS, bool SIMD>
static void inv_tile_rows(int R, const void* x, int64_t xs, const void* w, int64_t K,
                          float (*out)[INV_TILE]) {
  switch (R) {
    case 1: inv_tile<1, PAIRS, SIMD>(x, xs, w, K, out); break;
    case 2: inv_tile<2, PAIRS, SIMD>(x, xs, w, K, out); break;
    case 3: inv_tile<3, PAIRS, SIMD>(x, xs, w, K, out); break;
    case 4: inv_tile<4, PAIRS, SIMD>(x, xs, w, K, out); break;
    case 5: inv_tile<5, PAIRS, SIMD>(x, xs, w, K, out); break;
    default: inv_tile<6, PAIRS, SIMD>(x, xs, w, K, out); break;
  }
}

// y [..., out] = res + x @ W for x [..., in] fp32 and W packed by cpu_invariant.pack: fp32 [T, in, INV_TILE]
// or bfloat16 pairs [T, ceil(in / 2), INV_TILE, 2]. bfloat16: x rounded to bfloat16, each sum to
// bfloat16 before the residual (res: none, or fp32 of y's shape, added last as at::add would).
static at::Tensor invariant_linear_impl(const at::Tensor& x, const at::Tensor& packed, int64_t out,
                                        const at::Tensor* res, bool simd = true) {
  const bool pairs = packed.scalar_type() == at::kBFloat16;
  TORCH_CHECK(packed.is_contiguous() && (pairs ? packed.dim() == 4 : packed.dim() == 3) &&
                  packed.size(2) == INV_TILE && (pairs || packed.scalar_type() == at::kFloat),
              "invariant_linear: packed must come from cpu_invariant.pack");
  TORCH_CHECK(x.scalar_type() == at::kFloat, "invariant_linear: fp32 rows");
  const int64_t in = x.size(-1), N = in > 0 ? x.numel() / in : 0, T = packed.size(0), K = packed.size(1);
  TORCH_CHECK(K == (pairs ? (in + 1) / 2 : in) && T * INV_TILE >= out && (T - 1) * INV_TILE < out,
              "invariant_linear: packed weight of another shape");
  RECORD_FUNCTION("gambit::invariant_linear", std::vector<c10::IValue>({x}));
  auto xc = x.contiguous();
  const float* xp = xc.data_ptr<float>();
  // bfloat16: each row's pairs (even input low, odd high), K a row; per calling thread, no allocation a call
  thread_local std::vector<uint32_t> xpairs;
  if (pairs) {
    xpairs.resize(N * K);
    uint32_t* xw = xpairs.data();
    const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(in, 1));  // rows a thread at least
    at::parallel_for(0, N, grain, [&](int64_t r0, int64_t r1) {  // the same bits on any thread
      for (int64_t r = r0; r < r1; ++r) {
        const float* xr = xp + r * in;
        uint32_t* wr = xw + r * K;
        for (int64_t k = 0; k < in / 2; ++k)  // round to nearest even, as c10::BFloat16 does
          wr[k] = c10::BFloat16(xr[2 * k]).x | static_cast<uint32_t>(c10::BFloat16(xr[2 * k + 1]).x) << 16;
        if (in % 2) wr[K - 1] = c10::BFloat16(xr[in - 1]).x;
      }
    });
  }
  auto shape = x.sizes().vec();
  shape.back() = out;
  auto y = at::empty(shape, x.options());
  float* yp = y.data_ptr<float>();
  at::Tensor rc;
  const float* rp = nullptr;
  if (res != nullptr) {
    TORCH_CHECK(res->numel() == N * out && res->scalar_type() == at::kFloat, "invariant_linear: residual");
    rc = res->contiguous();
    rp = rc.data_ptr<float>();
  }
  const void* xbase = pairs ? static_cast<const void*>(xpairs.data()) : static_cast<const void*>(xp);
  const char* wbase = static_cast<const char*>(packed.data_ptr());
  const int64_t tile_bytes = K * INV_TILE * 4;
  // Work items are (tile, block of rows), tile-major, so a thread's run of them keeps a tile's weights in
  // its cache. With few tiles for the threads (the shipped target's o and down have 3) the rows are split
  // as well: no row's chain changes, only which thread runs it.
  const int64_t threads = at::get_num_threads();
  int64_t rows_per_item = std::max<int64_t>(N, 1);
  if (T < 4 * threads && N > INV_ROWS) {
    const int64_t blocks = (4 * threads + T - 1) / T;  // row blocks per tile
    const int64_t per_block = (N + blocks - 1) / blocks;
    rows_per_item = std::max<int64_t>(INV_ROWS, (per_block + INV_ROWS - 1) / INV_ROWS * INV_ROWS);
  }
  const int64_t nb = (N + rows_per_item - 1) / rows_per_item;
  at::parallel_for(0, T * nb, 1, [&](int64_t i0, int64_t i1) {
    float acc[INV_ROWS][INV_TILE];
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / nb, r_begin = (i % nb) * rows_per_item;
      const int64_t r_end = std::min(N, r_begin + rows_per_item);
      const int64_t c0 = t * INV_TILE, nc = std::min<int64_t>(INV_TILE, out - c0);
      for (int64_t r0 = r_begin; r0 < r_end; r0 += INV_ROWS) {
        const int R = static_cast<int>(std::min<int64_t>(INV_ROWS, r_end - r0));
        const void* xr = static_cast<const char*>(xbase) + 4 * r0 * K;  // K 32-bit words a row either way
        const void* wt = wbase + t * tile_bytes;
        if (pairs)
          simd ? inv_tile_rows<true, true>(R, xr, K, wt, K, acc)
               : inv_tile_rows<true, false>(R, xr, K, wt, K, acc);
        else
          simd ? inv_tile_rows<false, true>(R, xr, K, wt, K, acc)
               : inv_tile_rows<false, false>(R, xr, K, wt, K, acc);
        for (int r = 0; r < R; ++r) {
          float* yr = yp + (r0 + r) * out + c0;
          const float* rr = rp != nullptr ? rp + (r0 + r) * out + c0 : nullptr;
          for (int64_t c = 0; c < nc; ++c) {
            float s = acc[r][c];
            if (pairs) s = static_cast<float>(c10::BFloat16(s));
            yr[c] = rr != nullptr ? rr[c] + s : s;
          }
        }
      }
    }
  });
  return y;
}

// x [..., in] fp32, packed (cpu_invariant.pack), out -> [..., out] fp32; simd false: the plain code
torch::Tensor invariant_linear(torch::Tensor x, torch::Tensor packed, int64_t out, bool simd) {
  NoGil no_gil;
  return invariant_linear_impl(x, packed, out, nullptr, simd);
}

// x [N, K] fp32 times w [K] fp32 -> [N]: a one-output linear (a scorer's head) without the tile kernel's 64
// columns. Each row the same chain: sixteen lane sums over k = 16 i + l in order (fma), then the lanes
// added in one fixed order; the compiler may vectorize the lane loop, which changes no rounding.
torch::Tensor invariant_rowdot(torch::Tensor x, torch::Tensor w) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat && x.dim() == 2 &&
                  w.dim() == 1 && w.size(0) == x.size(1),
              "invariant_rowdot: fp32 x [N, K] and w [K]");
  auto xc = x.contiguous(), wc = w.contiguous();
  const int64_t N = xc.size(0), K = xc.size(1);
  auto y = at::empty({N}, xc.options());
  const float *xp = xc.data_ptr<float>(), *wp = wc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  for (int64_t r = 0; r < N; ++r) {
    const float* xr = xp + r * K;
    float acc[16] = {};
    int64_t k = 0;
    for (; k + 16 <= K; k += 16)
      for (int l = 0; l < 16; ++l) acc[l] = std::fma(xr[k + l], wp[k + l], acc[l]);
    for (int l = 0; k + l < K; ++l) acc[l] = std::fma(xr[k + l], wp[k + l], acc[l]);
    for (int h = 8; h > 0; h /= 2)
      for (int l = 0; l < h; ++l) acc[l] += acc[l + h];
    yp[r] = acc[0];
  }
  return y;
}

// Element by element in one scalar function, whatever an element's place in the tensor: ATen's
// vectorized loops take the tail of a tensor through scalar code that rounds some results differently,
// so a row's sigmoid would depend on how many rows precede it. (No -ffast-math here: GCC does not
// vectorize these libm calls.)
static inline float inv_sigmoid1(float v) { return 1.f / (1.f + std::exp(-v)); }

// 1 / (1 + exp(-x)) of every element of an fp32 tensor
torch::Tensor invariant_sigmoid(torch::Tensor x) {
  TORCH_CHECK(x.scalar_type() == at::kFloat, "invariant_sigmoid: fp32");
  auto xc = x.contiguous();
  auto y = at::empty_like(xc);
  const float* xp = xc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  for (int64_t i = 0; i < xc.numel(); ++i) yp[i] = inv_sigmoid1(xp[i]);
  return y;
}

// PyTorch's GRU cell from its gate pre-activations gi = x W_ih + b_ih and gh = h W_hh + b_hh [N, 3D]
// (gates r, z, n) and h [N, D]: r = s(gi_r + gh_r), z = s(gi_z + gh_z), n = tanh(gi_n + r gh_n),
// h' = n + z (h - n); each element in scalar code (see invariant_sigmoid)
torch::Tensor invariant_gru_cell(torch::Tensor gi, torch::Tensor gh, torch::Tensor h) {
  TORCH_CHECK(gi.scalar_type() == at::kFloat && gh.scalar_type() == at::kFloat &&
                  h.scalar_type() == at::kFloat && h.dim() == 2 && gi.sizes() == gh.sizes() &&
                  gi.dim() == 2 && gi.size(0) == h.size(0) && gi.size(1) == 3 * h.size(1),
              "invariant_gru_cell: fp32 gi, gh [N, 3D] and h [N, D]");
  auto gic = gi.contiguous(), ghc = gh.contiguous(), hc = h.contiguous();
  auto y = at::empty_like(hc);
  const int64_t N = hc.size(0), D = hc.size(1);
  const float *a = gic.data_ptr<float>(), *b = ghc.data_ptr<float>(), *hp = hc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  for (int64_t r = 0; r < N; ++r)
    for (int64_t j = 0; j < D; ++j) {
      const float* ar = a + r * 3 * D;
      const float* br = b + r * 3 * D;
      const float rg = inv_sigmoid1(ar[j] + br[j]), zg = inv_sigmoid1(ar[D + j] + br[D + j]);
      const float n = std::tanh(ar[2 * D + j] + rg * br[2 * D + j]);
      yp[r * D + j] = n + zg * (hp[r * D + j] - n);
    }
  return y;
}
"""


def pack(wt: torch.Tensor, bf16: bool) -> torch.Tensor:
    """``wt [in, out]`` (any layout; fp32, or values already bfloat16 when ``bf16``) in the kernel's
    tiles: fp32 ``[T, in, INV_TILE]``, or bfloat16 pairs ``[T, ceil(in / 2), INV_TILE, 2]`` (input
    rows 2k and 2k + 1 of a column side by side), the last tile padded with zero columns."""
    n_in, n_out = wt.shape
    tiles = -(-n_out // INV_TILE)
    if bf16:
        k = -(-n_in // 2)
        w = torch.zeros(2 * k, tiles * INV_TILE, dtype=torch.bfloat16)
        w[:n_in, :n_out] = wt.detach()
        return w.view(k, 2, tiles, INV_TILE).permute(2, 0, 3, 1).contiguous()
    w = torch.zeros(n_in, tiles * INV_TILE, dtype=torch.float32)
    w[:, :n_out] = wt.detach()
    return w.view(n_in, tiles, INV_TILE).permute(1, 0, 2).contiguous()


def linear(x: torch.Tensor, packed: torch.Tensor, out: int, simd: bool = True) -> torch.Tensor:
    """``x [..., in]`` fp32 times the packed weight → ``[..., out]`` fp32, each row's floats those of
    the row alone (``simd=False``: the plain code, for tests: the same floats)."""
    return cpu_attention.kernel().invariant_linear(x, packed, out, simd)
