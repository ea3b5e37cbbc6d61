"""The decoder-layer loop in one C++ call for forwards the CPU attention kernels serve.

At batch 1 on a 30-layer model a decode step is ~750 eager ops plus ~4,600 Python calls
(``nn.Module.__call__``, views, attribute look-ups): 7-10 ms of a 29 ms step on top of the weight
streaming that bounds it. This loop issues the same ATen calls, with the same shapes and strides, as
``CausalLM.forward`` with ``PagedAttention`` (``rms_norm``, ``linear`` or MKL's packed linear, the
RoPE ``neg``/``cat``/``mul``/``add``, ``index_copy_``, the paged kernels, ``silu``), only from C++, so
its output is bit-identical to the Python path (tested) while the per-op Python cost goes away. Three of
them run as plain loops with ATen's floats: the residual add lands in the product's output
(``add_into``); ``silu(gate) * up`` is one pass reproducing ATen's AVX512 kernel (``silu_mul``); and
RMSNorm follows ATen's own order of operations, its cascade sum in 8-float lanes included
(``aten_order_rms_norm``, also the model's final norm). Each serves only where ATen would run it serially
and a probe in the process matched ATen bit for bit, else ATen runs. On an Intel Xeon
(``tools/kernel_ab.py``): plain decoding at batch 1 0.96x the time for the first two, then 0.88x for the
norm; a B = 48 tree's forward 2.46 -> 2.02 ms. It
serves models without biases or q/k norms, with fused q/k/v and gate/up (what ``Engine`` builds); every
other model, and forwards with multi-token SDPA groups, keep the Python path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gambit.engine import cpu_attention, linear
from gambit.engine.attention import PagedAttention
from gambit.engine.linear import PackedLinear
from gambit.model.llama import CausalLM

SOURCE = r"""
#include <ATen/core/dispatch/Dispatcher.h>
#include <map>
#include <mutex>

// mkl::_mkl_linear (the op PackedLinear calls), through the dispatcher as torch.ops does.
static at::Tensor mkl_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& w,
                             int64_t rows) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkl::_mkl_linear", "")
      .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                        const std::optional<at::Tensor>&, int64_t)>();
  return op.call(x, packed, w, std::nullopt, rows);
}

// mkldnn::_linear_pointwise(x, packed, None, "none", [], "") (PackedLinear's oneDNN backend), boxed.
static at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& packed) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  std::vector<c10::IValue> stack{x, packed, c10::IValue(), std::string("none"),
                                 c10::List<std::optional<c10::Scalar>>(), std::string("")};
  op.callBoxed(&stack);
  return stack[0].toTensor();
}

// Which packed GEMM the model's PackedLinears use (one for all of them, see layer_weights), and the
// smallest weight whose one-row products stream through gemv_t (PackedLinear.stream).
// per thread: the GIL no longer orders calls from two engine threads
static thread_local bool g_onednn = false;
static thread_local int64_t g_stream_min = INT64_MAX;
// the packed weights are cpu_invariant's tiles (EngineConfig.batch_invariant): every row count on them
static thread_local bool g_invariant = false;

// packed_project(): the packed weight for lo <= rows <= hi (PackedLinear), else at::linear.
static at::Tensor packed_project(const at::Tensor& x, const at::Tensor& w, const at::Tensor& packed,
                                 int64_t lo, int64_t hi) {
  const int64_t in = x.size(-1), rows = x.numel() / in;
  if (g_invariant && packed.numel() > 0) return invariant_linear_impl(x, packed, w.size(0), nullptr);
  if (packed.numel() > 0 && lo <= rows && rows <= hi) {
    auto x2 = x.reshape({rows, in});
    at::Tensor out;
    if (packed.scalar_type() == at::kBFloat16)  // bfloat16 weights (cpu_weights): the row rounded, fp32 back
      out = onednn_linear(x2.to(at::kBFloat16), packed).to(at::kFloat);
    else
      out = g_onednn ? onednn_linear(x2, packed) : mkl_linear(x2, packed, w, rows);
    auto shape = x.sizes().vec();
    shape.back() = out.size(-1);
    return out.view(shape);
  }
  return at::linear(x, w);
}

// project(): one row of a large weight through gemv_t (the target's [in, out] layout), else packed_project.
static at::Tensor project(const at::Tensor& x, const at::Tensor& w, const at::Tensor& packed, int64_t lo,
                          int64_t hi) {
  if (x.numel() == x.size(-1) && w.numel() >= g_stream_min) return gemv_add(x, w, nullptr, true);
  return packed_project(x, w, packed, lo, hi);
}

#ifdef __AVX512F__
#include <immintrin.h>
// in libtorch_cpu: Vectorized<float>::exp on AVX512. Weak: a torch build without it still loads the
// extension (the address is then null and ATen's silu runs).
extern "C" __m512 Sleef_expf16_u10avx512f(__m512) __attribute__((weak));
#endif
#include <mutex>

// act [N, I] = silu(g) * u for gu [N, 2I] (g its first half, u the second), in the floats of
// at::mul(at::silu(g), u) on ATen's AVX512 kernels when they run it serially (N * I under their grain
// size): per row, blocks of 32 values as x / (1 + exp(-x)) with Sleef's vector exp (ATen's vectorised
// loop takes two vectors a block), the rest of the row scalar. Returns false where not served.
static bool silu_mul_rows(const float* gu, float* act, int64_t N, int64_t I) {
#ifdef __AVX512F__
  if (Sleef_expf16_u10avx512f == nullptr) return false;
  const __m512 one = _mm512_set1_ps(1.f), sign = _mm512_set1_ps(-0.f);
  for (int64_t r = 0; r < N; ++r) {
    const float *g = gu + r * 2 * I, *u = g + I;
    float* y = act + r * I;
    int64_t j = 0;
    for (; j + 32 <= I; j += 32)
      for (int64_t v = j; v < j + 32; v += 16) {
        const __m512 x = _mm512_loadu_ps(g + v);
        const __m512 e = Sleef_expf16_u10avx512f(_mm512_xor_ps(sign, x));  // exp(-x)
        const __m512 sl = _mm512_div_ps(x, _mm512_add_ps(one, e));
        _mm512_storeu_ps(y + v, _mm512_mul_ps(sl, _mm512_loadu_ps(u + v)));
      }
    for (; j < I; ++j) y[j] = (g[j] / (1.f + std::exp(-g[j]))) * u[j];
  }
  return true;
#else
  return false;
#endif
}

// Whether silu_mul_rows gives ATen's floats in this process (its CPU kernels, its version): checked once
// on a probe against at::silu and at::mul (every magnitude, a block-and-a-half row, exp's limits).
static bool silu_mul_exact() {
  static bool ok = false;
  static std::once_flag once;
  std::call_once(once, [] {
    const int64_t N = 3, I = 80;
    auto gu = at::empty({N, 2 * I}, at::kFloat);
    float* p = gu.data_ptr<float>();
    for (int64_t i = 0; i < N * 2 * I; ++i)
      p[i] = std::sin(0.7f * i) * std::pow(1.6f, static_cast<float>(i % 23) - 9);
    p[0] = 0.f, p[1] = -0.f, p[2] = 88.7f, p[3] = -88.7f, p[4] = -104.f, p[5] = 1e-30f;
    auto ch = gu.chunk(2, -1);
    auto ref = at::mul(at::silu(ch[0]), ch[1]);
    auto fast = at::empty({N, I}, at::kFloat);
    ok = silu_mul_rows(p, fast.data_ptr<float>(), N, I) && at::equal(ref, fast);
  });
  return ok;
}

// Exported for the tests: where ATen runs its AVX512 kernels the fused forward must take this path.
bool fused_silu_exact() { return silu_mul_exact(); }

// `out` = a + b elementwise, rows of contiguous tensors (at::add's floats: one rounding per element),
// split over the threads as ATen would a large one.
static void add_into(const float* a, float* out_b, int64_t n) {
  at::parallel_for(0, n, at::internal::GRAIN_SIZE, [&](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) out_b[i] = a[i] + out_b[i];
  });
}

// x + project(h, ...): a streamed one-row product adds x as it writes its sums (the same floats as
// at::add after it), else the sum lands in the product's own output (add_into: at::add's floats).
static at::Tensor residual(const at::Tensor& x, const at::Tensor& h, const at::Tensor& w,
                           const at::Tensor& packed, int64_t lo, int64_t hi) {
  if (g_invariant && packed.numel() > 0) return invariant_linear_impl(h, packed, w.size(0), &x);
  if (h.numel() == h.size(-1) && w.numel() >= g_stream_min) return gemv_add(h, w, &x, true);
  auto p = project(h, w, packed, lo, hi);
  if (!p.is_contiguous() || !x.is_contiguous() || p.sizes() != x.sizes() || p.scalar_type() != at::kFloat ||
      x.scalar_type() != at::kFloat || p.numel() >= at::internal::GRAIN_SIZE)
    return at::add(x, p);
  add_into(x.data_ptr<float>(), p.data_ptr<float>(), p.numel());
  return p;
}

// silu(gate) * up of a fused gate/up product gu [..., 2I]: silu_mul_rows where it gives ATen's floats
// (ATen's serial range, the probe matched), else at::silu and at::mul.
static at::Tensor silu_mul(const at::Tensor& gu) {
  const int64_t I = gu.size(-1) / 2, N = gu.numel() / (2 * I);
  if (gu.is_contiguous() && gu.scalar_type() == at::kFloat && N * I < at::internal::GRAIN_SIZE &&
      silu_mul_exact()) {
    auto shape = gu.sizes().vec();
    shape.back() = I;
    auto act = at::empty(shape, gu.options());
    silu_mul_rows(gu.data_ptr<float>(), act.data_ptr<float>(), N, I);
    return act;
  }
  auto ch = gu.chunk(2, -1);
  return at::mul(at::silu(ch[0]), ch[1]);
}

// apply_rope's arithmetic on one head row of D values: x * cos + cat(-x2, x1) * sin, with each product
// and the sum rounded on its own as the ATen mul/mul/add do (no FMA contraction here).
__attribute__((optimize("fp-contract=off")))
static void rope_row(const float* x, const float* c, const float* s, float* o, int64_t D) {
  const int64_t half = D / 2;
  for (int64_t j = 0; j < half; ++j) {
    const float a = x[j] * c[j], b = (-x[j + half]) * s[j];
    o[j] = a + b;
  }
  for (int64_t j = half; j < D; ++j) {
    const float a = x[j] * c[j], b = x[j - half] * s[j];
    o[j] = a + b;
  }
}

// The attention block's middle: RoPE on q and k of the fused projection qkv [1, T, (H + 2 Hkv) D],
// k and v written to their cache slots (what index_copy_ does; a bfloat16 cache gets them rounded to
// nearest even, as index_copy_ of .to(bfloat16) rounds), q returned as [T, H, D].
static at::Tensor rope_and_write(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                                 const at::Tensor& slots, at::Tensor& kc, at::Tensor& vc, int64_t H,
                                 int64_t Hkv, int64_t D) {
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && kc.is_contiguous() && vc.is_contiguous(),
              "contiguous rope tables and caches");
  const bool half = kc.scalar_type() == at::kBFloat16;
  TORCH_CHECK(vc.scalar_type() == kc.scalar_type() && (half || kc.scalar_type() == at::kFloat),
              "a float32 or bfloat16 KV cache");
  const int64_t T = qkv.size(1), W = (H + 2 * Hkv) * D, rows = kc.size(1) * kc.size(2);
  auto q = at::empty({T, H, D}, qkv.options());
  const float* x = qkv.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  const int64_t* slot = slots.data_ptr<int64_t>();
  float* qp = q.data_ptr<float>();
  float *kf = half ? nullptr : kc.data_ptr<float>(), *vf = half ? nullptr : vc.data_ptr<float>();
  at::BFloat16* kh = half ? kc.data_ptr<at::BFloat16>() : nullptr;
  at::BFloat16* vh = half ? vc.data_ptr<at::BFloat16>() : nullptr;
  std::vector<float> kr(half ? D : 0);  // a bfloat16 cache: the rotated key row before rounding
  for (int64_t t = 0; t < T; ++t) {
    const float *xt = x + t * W, *c = cp + t * D, *s = sp + t * D;
    for (int64_t h = 0; h < H; ++h) rope_row(xt + h * D, c, s, qp + (t * H + h) * D, D);
    for (int64_t h = 0; h < Hkv; ++h) {
      const int64_t at = (h * rows + slot[t]) * D;
      const float* vr = xt + (H + Hkv + h) * D;
      if (!half) {
        rope_row(xt + (H + h) * D, c, s, kf + at, D);
        std::copy(vr, vr + D, vf + at);
        continue;
      }
      rope_row(xt + (H + h) * D, c, s, kr.data(), D);
      at::BFloat16 *kb = kh + at, *vb = vh + at;
      for (int64_t d = 0; d < D; ++d) {
        kb[d] = at::BFloat16(kr[d]);
        vb[d] = at::BFloat16(vr[d]);
      }
    }
  }
  return q;
}

// PagedAttention.__call__ for a mix of decode rows and multi-token groups: the decode rows through the
// kernel, each group's blocks gathered into a padded batch for one SDPA call with its mask.
// meta: decode rows, tables, lens (empty rows: none), then per group rows, valid, flat_valid_rows,
// blocks, mask.
static at::Tensor grouped_attention(const at::Tensor& qf, const at::Tensor& kc, const at::Tensor& vc,
                                    const std::vector<torch::Tensor>& meta, int64_t H, int64_t Hkv, int64_t D,
                                    double scale) {
  auto out = at::empty_like(qf);
  if (meta[0].numel() > 0)
    out.index_put_({meta[0]}, paged_decode(qf.index({meta[0]}), kc, vc, meta[1], meta[2], scale));
  for (size_t g = 3; g + 4 < meta.size(); g += 5) {
    const auto &rows = meta[g], &valid = meta[g + 1], &flat_rows = meta[g + 2], &blocks = meta[g + 3];
    const int64_t B = blocks.size(0);
    auto flat = blocks.flatten();
    auto kg = kc.index_select(1, flat).view({Hkv, B, -1, D}).transpose(0, 1).to(qf.scalar_type());
    auto vg = vc.index_select(1, flat).view({Hkv, B, -1, D}).transpose(0, 1).to(qf.scalar_type());
    auto qg = qf.index({rows}).transpose(1, 2);
    auto o = at::scaled_dot_product_attention(qg, kg, vg, meta[g + 4], 0.0, false, std::nullopt, H != Hkv)
                 .transpose(1, 2);
    out.index_put_({flat_rows}, o.index({valid}));
  }
  return out;
}

// at::rms_norm's floats without its seven ATen calls. On the CPU ATen computes a float RMSNorm as
// pow(x, 2), sum (its cascade order: 8-wide lane accumulators four at a time, folded in levels, then
// the row's tail and the eight lanes in turn), div by H, add eps, rsqrt, mul, mul by w. aten_sum8 and
// aten_rms_row follow that order (no FMA contraction); where ATen runs the row serially (rows x H under
// its grain size) and a probe of this width matched at::rms_norm bit for bit, they serve.
static inline int64_t ceil_log2(int64_t x) {
  if (x <= 2) return 1;
  int64_t b = 0;
  for (uint64_t v = x - 1; v; v >>= 1) ++b;
  return b;
}

typedef float vf8 __attribute__((vector_size(32)));  // ATen's 8-float Vectorized, lane for lane

__attribute__((optimize("fp-contract=off"))) static float aten_sum8(const float* q, int64_t n) {
  const int64_t nv = n / 8, groups = nv / 4;
  vf8 acc[4][4] = {};
  auto load = [q](int64_t v) {
    vf8 x;
    std::memcpy(&x, q + v * 8, sizeof(x));
    return x;
  };
  const int64_t lp = std::max<int64_t>(4, ceil_log2(groups) / 4), step = int64_t(1) << lp, mask = step - 1;
  int64_t i = 0;
  while (i + step <= groups) {
    for (int64_t j = 0; j < step; ++j, ++i)
      for (int k = 0; k < 4; ++k) acc[0][k] += load(i * 4 + k);
    for (int j = 1; j < 4; ++j) {
      for (int k = 0; k < 4; ++k) {
        acc[j][k] += acc[j - 1][k];
        acc[j - 1][k] = vf8{};
      }
      if ((i & (mask << (j * lp))) != 0) break;
    }
  }
  for (; i < groups; ++i)
    for (int k = 0; k < 4; ++k) acc[0][k] += load(i * 4 + k);
  for (int j = 1; j < 4; ++j)
    for (int k = 0; k < 4; ++k) acc[0][k] += acc[j][k];
  for (int64_t v = groups * 4; v < nv; ++v) acc[0][0] += load(v);
  for (int k = 1; k < 4; ++k) acc[0][0] += acc[0][k];
  float s = 0.f;
  for (int64_t k = nv * 8; k < n; ++k) s += q[k];
  for (int k = 0; k < 8; ++k) s += acc[0][0][k];
  return s;
}

// One row: q is scratch of H floats (the squares, as ATen materialises them before its sum).
__attribute__((optimize("fp-contract=off")))
static void aten_rms_row(const float* r, const float* w, float* o, float* q, int64_t H, float eps) {
  for (int64_t h = 0; h < H; ++h) q[h] = r[h] * r[h];
  const float inv = 1.f / std::sqrt(aten_sum8(q, H) / static_cast<float>(H) + eps);
  for (int64_t h = 0; h < H; ++h) o[h] = r[h] * inv * w[h];
}

static void aten_rms_rows(const float* x, const float* w, float* o, int64_t N, int64_t H, float eps) {
  thread_local std::vector<float> q;  // the squares' scratch, reused across calls
  if (static_cast<int64_t>(q.size()) < H) q.resize(H);
  for (int64_t n = 0; n < N; ++n) aten_rms_row(x + n * H, w, o + n * H, q.data(), H, eps);
}

// What `probe` (a comparison against ATen) answers for `key`: run once per key, then remembered.
template <class Probe>
static bool probe_once(std::map<int64_t, bool>& known, std::mutex& mu, int64_t key, Probe probe) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = known.find(key);
  if (it != known.end()) return it->second;
  return known[key] = probe();
}

// Whether aten_rms_rows gives at::rms_norm's floats at width H here: five rows of every magnitude.
static bool aten_rms_exact(int64_t H, double eps) {
  static std::mutex mu;
  static std::map<int64_t, bool> known;
  return probe_once(known, mu, H, [H, eps] {
    const int64_t N = 5;
    auto x = at::empty({N, H}, at::kFloat), w = at::empty({H}, at::kFloat), o = at::empty({N, H}, at::kFloat);
    float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>();
    for (int64_t i = 0; i < N * H; ++i)
      xp[i] = std::sin(1.3f * i + 0.5f) * std::pow(2.f, static_cast<float>(i % 29) / 4 - 3 + 4 * (i / H) - 8);
    for (int64_t h = 0; h < H; ++h) wp[h] = std::cos(0.9f * h) * 2;
    aten_rms_rows(xp, wp, o.data_ptr<float>(), N, H, static_cast<float>(eps));
    return at::equal(o, at::rms_norm(x, {H}, w, eps));
  });
}

static at::Tensor aten_order_rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  const int64_t H = w.size(0), N = x.numel() / std::max<int64_t>(H, 1);
  if (H >= 8 && x.size(-1) == H && x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat &&
      x.is_contiguous() && w.is_contiguous() && N * H < at::internal::GRAIN_SIZE && aten_rms_exact(H, eps)) {
    auto out = at::empty_like(x);
    const float fe = static_cast<float>(eps);
    aten_rms_rows(x.data_ptr<float>(), w.data_ptr<float>(), out.data_ptr<float>(), N, H, fe);
    return out;
  }
  return at::rms_norm(x, {H}, w, eps);
}

// Exported: at::rms_norm(x, [H], w, eps)'s result (the model's final norm after the loop), and the probe.
torch::Tensor aten_rms_norm(torch::Tensor x, torch::Tensor w, double eps) {
  NoGil no_gil;
  return aten_order_rms_norm(x.contiguous(), w.contiguous(), eps);
}

bool aten_rms_norm_exact(int64_t H, double eps) {
  NoGil no_gil;
  return H >= 8 && aten_rms_exact(H, eps);
}

static at::Tensor norm(const at::Tensor& x, const at::Tensor& w, double eps, bool kernel) {
  if (kernel) return rms_norm(x, w, eps);
  return aten_order_rms_norm(x, w, eps);
}

// x [1, T, hidden]; per layer i the tensors at lw[8 * i ...]: input norm, qkv weight, qkv packed, o weight,
// o packed, post norm, gate_up weight, gate_up packed, and at lw2[2 * i ...]: down weight, down packed
// (empty packed tensors: none). cos, sin [1, T, 1, D] contiguous; slots [T] int64 cache rows.
// attn: 0 = one decode row per sequence (paged_decode(tables, lens)), 1 = any rows
// (paged_attention(tables, ctx, qoff, qlen, moff, mask)), 2 = grouped_attention(meta).
// Returns [x after the last layer, x entering each layer in taps...].
std::vector<torch::Tensor> decoder_layers(
    torch::Tensor x, std::vector<torch::Tensor> lw, std::vector<torch::Tensor> lw2, torch::Tensor kcache,
    torch::Tensor vcache, torch::Tensor cos, torch::Tensor sin, torch::Tensor slots, int64_t attn,
    std::vector<torch::Tensor> meta, std::vector<int64_t> taps, int64_t H, int64_t Hkv, int64_t D, double eps,
    double scale, int64_t lo, int64_t hi, bool norm_kernel, bool onednn, int64_t stream_min, bool invariant) {
  NoGil no_gil;
  g_invariant = invariant;
  g_onednn = onednn;
  g_stream_min = stream_min;
  const int64_t L = static_cast<int64_t>(lw2.size()) / 2, T = x.size(1);
  std::vector<torch::Tensor> out{torch::Tensor()};
  for (int64_t i = 0; i < L; ++i) {
    if (std::find(taps.begin(), taps.end(), i) != taps.end()) out.push_back(x);
    const torch::Tensor* w = lw.data() + 8 * i;
    // attention block (Attention.forward, fused q/k/v, no q/k norm)
    auto h = norm(x, w[0], eps, norm_kernel);
    auto qkv = project(h, w[1], w[2], lo, hi).contiguous();  // [1, T, (H + 2 Hkv) D]
    auto kc = kcache.select(0, i), vc = vcache.select(0, i);  // [Hkv, NB, bs, D]
    auto qf = rope_and_write(qkv, cos, sin, slots, kc, vc, H, Hkv, D);
    auto o = attn == 0   ? paged_decode(qf, kc, vc, meta[0], meta[1], scale)
             : attn == 1 ? paged_attention(qf, kc, vc, meta[0], meta[1], meta[2], meta[3], meta[4], meta[5],
                                           scale)
                         : grouped_attention(qf, kc, vc, meta, H, Hkv, D, scale);
    x = residual(x, o.unsqueeze(0).reshape({1, T, H * D}), w[3], w[4], lo, hi);
    // MLP block (MLP.forward, fused gate/up)
    auto gu = project(norm(x, w[5], eps, norm_kernel), w[6], w[7], lo, hi);
    x = residual(x, silu_mul(gu), lw2[2 * i], lw2[2 * i + 1], lo, hi);
  }
  out[0] = x;
  return out;
}
"""


_NONE = torch.empty(0)  # "no packed weight" (pybind takes no None inside a tensor list)
_NO_ROWS = torch.empty(0, dtype=torch.long)  # "no decode rows" in grouped attention


def _packed(fast: object) -> tuple[torch.Tensor | None, tuple[int, int] | None]:
    """The packed weight and row range a ``PackedLinear`` serves (None: plain ``F.linear``)."""
    if isinstance(fast, PackedLinear) and fast.weight._version == fast.version and fast.bias is None:
        return fast.packed, (fast.min_rows, fast.max_rows)
    return None, None


@dataclass
class LayerWeights:
    """What ``decoder_layers`` takes for a model, collected once (see ``ModelRunner``)."""

    lw: list[torch.Tensor]  # per layer: input norm, qkv, qkv packed, o, o packed, post norm, gate_up, packed
    lw2: list[torch.Tensor]  # per layer: down, down packed
    lo: int  # packed weights serve lo <= rows <= hi
    hi: int
    norm_kernel: bool  # RMSNorms through cpu_attention.rms_norm
    onednn: bool  # the packed weights are oneDNN's (else MKL's)
    packs: list[PackedLinear]
    stream_min: int = 1 << 62  # weights this large stream one-row products through cpu_gemv
    invariant: bool = False  # the packed weights are cpu_invariant's tiles: every row count on them

    def stale(self) -> bool:
        """A packed weight was modified in place since it was packed (then rebuild: Python path)."""
        return any(p.weight._version != p.version for p in self.packs)


def layer_weights(model: CausalLM) -> LayerWeights | None:
    """The per-layer tensors ``decoder_layers`` takes, or None when this model needs the Python path."""
    c = model.config
    if c.qkv_bias or c.o_bias or c.mlp_bias or c.qk_norm:
        return None
    lw: list[torch.Tensor | None] = []
    lw2: list[torch.Tensor | None] = []
    ranges: set[tuple[int, int]] = set()
    backends: set[str] = set()
    norm_fasts = set()
    packs: list[PackedLinear] = []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if attn.qkv is None or mlp.gate_up is None:
            return None
        row = [layer.input_layernorm.weight, attn.qkv[0], None, attn.o_proj.weight, None,
               layer.post_attention_layernorm.weight, mlp.gate_up, None]
        down = [mlp.down_proj.weight, None]
        for key, fast, slot in (("qkv", attn.fast, (row, 2)), ("o", attn.fast, (row, 4)),
                                ("gate_up", mlp.fast, (row, 7)), ("down", mlp.fast, (down, 1))):
            f = fast.get(key)
            packed, rng = _packed(f)
            if f is not None and packed is None:
                return None  # some other fast path: only Python knows how to call it
            if rng is not None:
                ranges.add(rng)
                backends.add(f.backend)
                packs.append(f)
                if f.backend == "onednn-bf16" and f.stream is not None:  # one row streams the bf16 copy
                    slot[0][slot[1] - 1] = f.stream.t()
            slot[0][slot[1]] = _NONE if packed is None else packed
        norm_fasts.update((layer.input_layernorm.fast, layer.post_attention_layernorm.fast))
        lw += row
        lw2 += down
    if (len(ranges) > 1 or len(backends) > 1 or not norm_fasts <= {None, cpu_attention.rms_norm}
            or len(norm_fasts) > 1):
        return None
    lo, hi = ranges.pop() if ranges else (1 << 62, 0)
    streamed = any(p.stream is not None for p in packs)
    if streamed and any(p.stream is None and p.weight.numel() >= linear.STREAM_MIN_ELEMENTS for p in packs):
        return None  # a mix the one threshold cannot express: only Python knows
    return LayerWeights(lw, lw2, lo, hi, norm_kernel=norm_fasts == {cpu_attention.rms_norm},
                        onednn=backends in ({"onednn"}, {"onednn-bf16"}), packs=packs,
                        stream_min=linear.STREAM_MIN_ELEMENTS if streamed else 1 << 62,
                        invariant=backends in ({"invariant"}, {"invariant-bf16"}))


def signature(model: CausalLM) -> tuple:
    """What ``layer_weights`` depends on that can change after it ran: which fast paths are installed
    (``linear.generation``) and whether a packed weight was modified in place since it was packed."""
    return model, linear.generation(), model.model.layers[0].input_layernorm.fast


def serves(attn: PagedAttention) -> bool:
    """Whether ``decoder_layers`` mirrors this forward's attention: built for the CPU kernels (their
    decode rows and small trees, and SDPA groups beside kernel-served decode rows)."""
    return attn.use_kernel and not (attn.all_decode and attn.decode is None)


def _meta(attn: PagedAttention) -> tuple[int, list[torch.Tensor]]:
    """``decoder_layers``' attention mode and tensors for this forward."""
    if attn.multi is not None:
        return 1, list(attn.multi)
    if attn.decode is not None and attn.decode[0] is None:
        return 0, [attn.decode[1], attn.decode[2]]
    meta = list(attn.decode) if attn.decode is not None else [_NO_ROWS] * 3
    for g in attn.groups:
        meta += [g.rows, g.valid, g.flat_valid_rows, g.blocks, g.mask]
    return 2, meta


def forward(model: CausalLM, weights: LayerWeights, input_ids: torch.Tensor, positions: torch.Tensor,
            attn: PagedAttention, taps: Sequence[int] = ()) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """``CausalLM.forward`` for a forward that ``serves`` accepts, with the layer loop in C++."""
    c, w = model.config, weights
    x = torch.embedding(model.model.embed_tokens.weight, input_ids)  # nn.Embedding's lookup, its call skipped
    cos, sin = model.rope.table(positions)
    mode, meta = _meta(attn)
    layer_taps = sorted(t for t in set(taps) if t < c.num_hidden_layers)
    kernel = cpu_attention.kernel()
    out = kernel.decoder_layers(
        x, w.lw, w.lw2, attn.cache.k, attn.cache.v, cos, sin, attn.slots, mode, meta, layer_taps,
        c.num_attention_heads, c.num_key_value_heads, c.head_dim, model.model.norm.eps, c.head_dim ** -0.5,
        w.lo, w.hi, w.norm_kernel, w.onednn, w.stream_min, w.invariant)
    tapped = dict(zip(layer_taps, out[1:], strict=True))
    fn = model.model.norm
    aten_norm = getattr(kernel, "aten_rms_norm", None)  # (an older build in A/Bs: none)
    x = aten_norm(out[0], fn.weight, fn.eps) if fn.fast is None and aten_norm else fn(out[0])
    if c.num_hidden_layers in taps:
        tapped[c.num_hidden_layers] = x
    return x, tapped
