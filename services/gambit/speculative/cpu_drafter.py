"""The drafter's forward in one C++ call (the CPU kernels' extension), bit-identical to ``Drafter``.

A speculative cycle runs the drafter γ + 1 times (its context pass, then one pass per draft step), each
~45 eager ops and ~100 Python calls over a handful of rows: at the shipped 2.7M target that overhead,
not the arithmetic, was most of the drafting time. Like ``engine.cpu_decoder`` for the target, this
computes the same floats as the Python forward (tested): with ATen's norm (``rms_norm``) it issues the
same ATen calls with the same shapes, only from C++; with the compiled norm kernel (what ``pack_drafter``
installs) it also writes norms, RoPE, the tree's k / v rows, the residual adds and ``silu(gate) * up``
straight into a few buffers (``drafter_forward_fused``: a B = 48 PR cycle 0.94x the time with this
alone, ``tools/kernel_ab.py``), keeping MKL's packed linears and the attention kernels. Its
``silu * up`` reproduces ATen's AVX512 kernel (Sleef's vector exp, ATen's 32-value blocks) and is used
only after a probe in the process matched ATen's result bit for bit, else ATen's ``silu`` and ``mul``
run. So drafts, and τ, do not change.
It serves fused fp32 CPU drafters with one layer, served by ``TreeAttention`` (draft steps) or a
``PagedAttention`` that ``cpu_decoder.serves`` (the context pass); everything else keeps the Python path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gambit.engine import cpu_attention, cpu_decoder
from gambit.engine.attention import PagedAttention
from gambit.engine.linear import PackedLinear

SOURCE = r"""
// The drafter's midlayer, final norm and head (Drafter.forward with one fused first layer, EAGLE-3 layout).
// h (feature) [B, T, Hd]; w: hidden_norm, input_norm, qkv, qkv packed, q packed, o, o packed, post norm,
// gate_up, gate_up packed, down, down packed, final norm, head, head packed (empty packed: none).
// Products through packed_project: never the target's streamed one-row path, which reads [in, out]
// stream copies (a drafter's weights are plain [out, in]; a one-row call at SmolLM2's width reached it).
// n_tail: the last n rows take their query from [input_norm(h), hidden_norm(h)]; those query rows are
// appended to qkv's own matmul, so "q packed" (w[4]) is not read here (the Python per-row path uses it).
// attn 0/1/2: paged modes as in decoder_layers (B = 1; meta, slots, cache kc/vc [Hkv, NB, bs, D]);
// attn 3: tree (TreeAttention): meta = {k buffer, v buffer, additive mask}, rows written at `at`.
// Returns {logits, next feature}.
// Every index in [0, rows): a RoPE position past the drafter's table (SpecDecoder.register sizes it for
// the context) or a bad token id raises, as PyTorch's indexing does, instead of reading past the table.
static void check_rows(const at::Tensor& idx, int64_t rows, const char* what) {
  const auto ix = idx.contiguous();
  const int64_t* p = ix.data_ptr<int64_t>();
  for (int64_t i = 0, n = ix.numel(); i < n; ++i)
    TORCH_CHECK(p[i] >= 0 && p[i] < rows, "drafter ", what, " ", p[i], " outside its table of ", rows,
                " rows");
}

// Rows of table [n, width] at idx [N] into a new [N, width] tensor (what embedding/index_select copy);
// drafter_forward has checked the indices (check_rows).
static at::Tensor take_rows(const at::Tensor& table, const at::Tensor& idx) {
  TORCH_CHECK(table.is_contiguous() && idx.is_contiguous(), "contiguous tables and indices");
  const int64_t N = idx.numel(), W = table.size(1);
  auto out = at::empty({N, W}, table.options());
  const float* t = table.data_ptr<float>();
  const int64_t* ix = idx.data_ptr<int64_t>();
  float* o = out.data_ptr<float>();
  for (int64_t n = 0; n < N; ++n) std::copy(t + ix[n] * W, t + (ix[n] + 1) * W, o + n * W);
  return out;
}

// The context pass's attention (paged modes as in decoder_layers) over q rows already in the cache.
static at::Tensor paged_rows(const at::Tensor& qf, const at::Tensor& kc, const at::Tensor& vc, int64_t attn,
                             const std::vector<torch::Tensor>& meta, int64_t H, int64_t Hkv, int64_t D,
                             double scale) {
  return attn == 0   ? paged_decode(qf, kc, vc, meta[0], meta[1], scale)
         : attn == 1 ? paged_attention(qf, kc, vc, meta[0], meta[1], meta[2], meta[3], meta[4], meta[5],
                                       scale)
                     : grouped_attention(qf, kc, vc, meta, H, Hkv, D, scale);
}

// drafter_forward with the compiled norm kernel: the same floats, written into few tensors. Each row of
// [input_norm(embedding), hidden_norm(feature)] (and the self-query rows) is normed in place in one
// buffer, RoPE writes q and a tree step's k / v rows straight to their places, the residual adds land
// in the products' outputs and silu(gate) * up in one pass: ~20 fewer ATen calls and allocations a
// draft step, which at a tree's few rows cost more than their arithmetic.
static std::vector<torch::Tensor> drafter_forward_fused(
    torch::Tensor h, const torch::Tensor& ids, const torch::Tensor& pos, const torch::Tensor& embw,
    const std::vector<torch::Tensor>& w, const torch::Tensor& cos_t, const torch::Tensor& sin_t,
    int64_t n_tail, int64_t attn, const std::vector<torch::Tensor>& meta, const torch::Tensor& slots,
    torch::Tensor& kc, torch::Tensor& vc, int64_t at, int64_t H, int64_t Hkv, int64_t D, double eps,
    double scale, int64_t lo, int64_t hi, bool norm_output) {
  h = h.contiguous();
  const int64_t B = h.size(0), T = h.size(1), Hd = h.size(2), TT = T + n_tail, Wq = (H + 2 * Hkv) * D;
  TORCH_CHECK(n_tail == 0 || attn == 3, "self-query rows in tree steps only");
  TORCH_CHECK(embw.is_contiguous() && embw.size(1) == Hd && ids.is_contiguous() && pos.is_contiguous() &&
              cos_t.is_contiguous() && sin_t.is_contiguous(), "contiguous tables, ids and positions");
  const float fe = static_cast<float>(eps);
  const float *hp = h.data_ptr<float>(), *ep = embw.data_ptr<float>();
  const float *w0 = w[0].data_ptr<float>(), *w1 = w[1].data_ptr<float>();
  const int64_t *idp = ids.data_ptr<int64_t>(), *pp = pos.data_ptr<int64_t>();
  auto x = at::empty({B, TT, 2 * Hd}, h.options());
  float* xp = x.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      float* xr = xp + (b * TT + t) * 2 * Hd;
      rms_norm_row(ep + idp[b * T + t] * Hd, w1, xr, Hd, fe);
      rms_norm_row(hp + (b * T + t) * Hd, w0, xr + Hd, Hd, fe);
    }
    for (int64_t j = 0; j < n_tail; ++j) {  // self-query rows: [input_norm(feature), hidden_norm(feature)]
      const int64_t t = T - n_tail + j;
      float* xr = xp + (b * TT + T + j) * 2 * Hd;
      rms_norm_row(hp + (b * T + t) * Hd, w1, xr, Hd, fe);
      std::copy(xp + (b * TT + t) * 2 * Hd + Hd, xp + (b * TT + t + 1) * 2 * Hd, xr + Hd);
    }
  }
  auto all = packed_project(x, w[2], w[3], lo, hi).contiguous();  // [B, TT, Wq]
  const float* ap = all.data_ptr<float>();
  at::Tensor o;
  if (attn == 3) {  // TreeAttention: k, v rows into its buffers at `at`, the query rows RoPE'd into q
    const auto &kb = meta[0], &vb = meta[1];
    TORCH_CHECK(kb.is_contiguous() && vb.is_contiguous() && kb.size(0) == B && at + T <= kb.size(2),
                "contiguous tree buffers with room for the rows");
    const int64_t Wk = kb.size(2);
    auto q = at::empty({B, T, H, D}, h.options());
    float *qp = q.data_ptr<float>(), *kp = kb.data_ptr<float>(), *vp = vb.data_ptr<float>();
    const float *cp = cos_t.data_ptr<float>(), *sp = sin_t.data_ptr<float>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const float* row = ap + (b * TT + t) * Wq;  // a self-query row's q comes from its tail row
        const float* qrow = t >= T - n_tail ? ap + (b * TT + T + t - (T - n_tail)) * Wq : row;
        const float *c = cp + pp[b * T + t] * D, *sn = sp + pp[b * T + t] * D;
        for (int64_t hh = 0; hh < H; ++hh) rope_row(qrow + hh * D, c, sn, qp + ((b * T + t) * H + hh) * D, D);
        for (int64_t hh = 0; hh < Hkv; ++hh) {
          const int64_t dst = ((b * Hkv + hh) * Wk + at + t) * D;
          rope_row(row + (H + hh) * D, c, sn, kp + dst, D);
          std::copy(row + (H + Hkv + hh) * D, row + (H + Hkv + hh + 1) * D, vp + dst);
        }
      }
    o = dense_attention(q, kb, vb, at + T, meta[2], scale);
  } else {
    auto cos = take_rows(cos_t, pos.reshape({-1})), sin = take_rows(sin_t, pos.reshape({-1}));
    auto qf = rope_and_write(all, cos, sin, slots, kc, vc, H, Hkv, D);
    o = paged_rows(qf, kc, vc, attn, meta, H, Hkv, D, scale).unsqueeze(0);
  }
  const int64_t n = B * T * Hd;
  auto h1 = packed_project(o.reshape({B, T, H * D}), w[5], w[6], lo, hi).contiguous();
  add_into(hp, h1.data_ptr<float>(), n);  // h + o_proj(attention)
  auto x2 = at::empty_like(h1);
  const float *h1p = h1.data_ptr<float>(), *w7 = w[7].data_ptr<float>(), *w12 = w[12].data_ptr<float>();
  for (int64_t r = 0; r < B * T; ++r) rms_norm_row(h1p + r * Hd, w7, x2.data_ptr<float>() + r * Hd, Hd, fe);
  auto gu = packed_project(x2, w[8], w[9], lo, hi).contiguous();
  auto h2 = packed_project(silu_mul(gu), w[10], w[11], lo, hi).contiguous();
  add_into(h1p, h2.data_ptr<float>(), n);  // h + down(silu(gate) * up)
  auto out = at::empty_like(h2);
  const float* h2p = h2.data_ptr<float>();
  for (int64_t r = 0; r < B * T; ++r) rms_norm_row(h2p + r * Hd, w12, out.data_ptr<float>() + r * Hd, Hd, fe);
  return {packed_project(out, w[13], w[14], lo, hi), norm_output ? out : h2};
}

// ids, pos [B, T]: token ids (rows of the embedding table embw) and RoPE positions (rows of cos_t, sin_t).
std::vector<torch::Tensor> drafter_forward(
    torch::Tensor h, torch::Tensor ids, torch::Tensor pos, torch::Tensor embw, std::vector<torch::Tensor> w,
    torch::Tensor cos_t, torch::Tensor sin_t, int64_t n_tail, int64_t attn, std::vector<torch::Tensor> meta,
    torch::Tensor slots, torch::Tensor kc, torch::Tensor vc, int64_t at, int64_t H, int64_t Hkv, int64_t D,
    double eps, double scale, int64_t lo, int64_t hi, bool norm_kernel, bool norm_output, bool onednn) {
  NoGil no_gil;
  check_rows(pos, cos_t.size(0), "RoPE position");
  check_rows(ids, embw.size(0), "token id");
  g_invariant = false;  // the drafter packs MKL / oneDNN weights (its floats never reach the output)
  g_onednn = onednn;  // the packed weights' kind (pack_drafter packs one kind for a whole drafter)
  if (norm_kernel)
    return drafter_forward_fused(h, ids, pos, embw, w, cos_t, sin_t, n_tail, attn, meta, slots, kc, vc, at, H,
                                 Hkv, D, eps, scale, lo, hi, norm_output);
  const int64_t B = h.size(0), T = h.size(1);
  auto emb = take_rows(embw, ids.reshape({-1})).view({B, T, -1});
  auto cos = take_rows(cos_t, pos.reshape({-1})), sin = take_rows(sin_t, pos.reshape({-1}));
  auto hn = norm(h, w[0], eps, norm_kernel);
  auto x = at::cat({norm(emb, w[1], eps, norm_kernel), hn}, -1);
  at::Tensor qkv;
  if (n_tail > 0) {  // DraftAttention's tail: its query rows ride in the same matmul, appended after x
    auto tail = at::cat({norm(h.slice(1, T - n_tail, T), w[1], eps, norm_kernel),
                         hn.slice(1, T - n_tail, T)}, -1);
    auto all =
        packed_project(at::cat({x, tail}, 1), w[2], w[3], lo, hi).view({B, T + n_tail, H + 2 * Hkv, D});
    all.slice(1, T - n_tail, T).slice(2, 0, H).copy_(all.slice(1, T, T + n_tail).slice(2, 0, H));
    qkv = all.slice(1, 0, T);
  } else {
    qkv = packed_project(x, w[2], w[3], lo, hi).view({B, T, H + 2 * Hkv, D});
  }
  qkv = qkv.contiguous();
  at::Tensor o;
  if (attn == 3) {
    // apply_rope(qk) [B, T, H + Hkv, D], then q, k split off it (same layout as the Python path)
    auto rot = at::empty({B, T, H + Hkv, D}, qkv.options());
    const int64_t W = (H + 2 * Hkv) * D;
    const float* xp = qkv.data_ptr<float>();
    const float* cp = cos.data_ptr<float>();
    const float* sp = sin.data_ptr<float>();
    float* rp = rot.data_ptr<float>();
    for (int64_t r = 0; r < B * T; ++r)
      for (int64_t hh = 0; hh < H + Hkv; ++hh)
        rope_row(xp + r * W + hh * D, cp + r * D, sp + r * D, rp + (r * (H + Hkv) + hh) * D, D);
    auto q = rot.narrow(2, 0, H), k = rot.narrow(2, H, Hkv), v = qkv.narrow(2, H + Hkv, Hkv);
    auto &kb = meta[0], &vb = meta[1];
    kb.slice(2, at, at + T).copy_(k.transpose(1, 2));
    vb.slice(2, at, at + T).copy_(v.transpose(1, 2));
    o = dense_attention(q.contiguous(), kb, vb, at + T, meta[2], scale);  // TreeAttention's kernel
  } else {
    auto qf = rope_and_write(qkv, cos, sin, slots, kc, vc, H, Hkv, D);
    o = paged_rows(qf, kc, vc, attn, meta, H, Hkv, D, scale).unsqueeze(0);
  }
  h = at::add(h, packed_project(o.reshape({B, T, H * D}), w[5], w[6], lo, hi));
  auto gu = packed_project(norm(h, w[7], eps, norm_kernel), w[8], w[9], lo, hi).chunk(2, -1);
  h = at::add(h, packed_project(at::mul(at::silu(gu[0]), gu[1]), w[10], w[11], lo, hi));
  auto out = norm(h, w[12], eps, norm_kernel);
  return {packed_project(out, w[13], w[14], lo, hi), norm_output ? out : h};
}
"""

_NONE = torch.empty(0)


@dataclass
class DrafterWeights:
    """What ``drafter_forward`` takes for a drafter, collected once (see ``install``)."""

    w: list[torch.Tensor]
    lo: int
    hi: int
    norm_kernel: bool
    packs: list[PackedLinear]
    onednn: bool = False  # the packs are oneDNN's (else MKL's)

    def stale(self) -> bool:
        return any(p.weight._version != p.version for p in self.packs)


def drafter_weights(drafter) -> DrafterWeights | None:
    """The tensors ``drafter_forward`` takes, or None when this drafter needs the Python path."""
    c = drafter.config
    if c.num_layers != 1 or cpu_attention.kernel() is None:
        return None
    m = drafter.midlayer
    attn, mlp = m.self_attn, m.mlp
    qkv = getattr(attn, "qkv", None)
    if qkv is None or mlp.gate_up is None or mlp.down_proj.bias is not None:
        return None
    if qkv.dtype != torch.float32 or qkv.device.type != "cpu":
        return None
    norms = (m.hidden_norm, m.input_layernorm, m.post_attention_layernorm, drafter.norm)
    kinds = {n.fast for n in norms}
    if len(kinds) > 1 or not kinds <= {None, cpu_attention.rms_norm} or len({n.eps for n in norms}) > 1:
        return None
    ranges, packs, backends = set(), [], set()

    def packed(fast) -> torch.Tensor | None:
        p, rng = cpu_decoder._packed(fast)
        if fast is not None and p is None:
            return None
        if fast is not None:
            backends.add(fast.backend)
        if rng is not None:
            ranges.add(rng)
            packs.append(fast)
        return _NONE if p is None else p

    pk = [packed(f) for f in (attn.fast.get("qkv"), attn.fast.get("q"), attn.fast.get("o"),
                              mlp.fast.get("gate_up"), mlp.fast.get("down"), drafter.fast.get("head"))]
    if any(p is None for p in pk) or len(ranges) > 1 or len(backends) > 1:
        return None
    if bool(pk[0].numel()) != bool(pk[1].numel()):  # q's pack must follow qkv's (one row range)
        return None
    lo, hi = ranges.pop() if ranges else (1 << 62, 0)
    w = [m.hidden_norm.weight, m.input_layernorm.weight, qkv, pk[0], pk[1], attn.o_proj.weight, pk[2],
         m.post_attention_layernorm.weight, mlp.gate_up, pk[3], mlp.down_proj.weight, pk[4],
         drafter.norm.weight, drafter.lm_head.weight, pk[5]]
    return DrafterWeights([t.detach() for t in w], lo, hi, kinds == {cpu_attention.rms_norm}, packs,
                          backends == {"onednn"})


def _signature(drafter) -> tuple:
    """The fast paths ``drafter_weights`` read: re-packing or clearing them retires the C++ path."""
    m = drafter.midlayer
    objs = (*m.self_attn.fast.values(), *m.mlp.fast.values(), *drafter.fast.values(), m.input_layernorm.fast,
            m.self_attn.qkv)
    return tuple(map(id, objs))


def install(drafter) -> bool:
    """Route ``drafter``'s inference forwards through C++ where served; returns whether installed."""
    weights = drafter_weights(drafter)
    drafter.fast_forward = None if weights is None else _Forward(drafter, weights)
    return weights is not None


class _Forward:
    """``Drafter.fast_forward``: the C++ forward, or None for a call it does not serve."""

    def __init__(self, drafter, weights: DrafterWeights) -> None:
        self.d, self.w = drafter, weights
        c = drafter.config
        self.shape = (c.num_attention_heads, c.num_key_value_heads, c.head_dim)
        self.sig = _signature(drafter)


    def usable(self) -> bool:
        """The weights it collected are still the drafter's (not modified, not re-packed)."""
        e = self.d.embed_tokens.weight
        return (not torch.is_grad_enabled() and not self.w.stale() and _signature(self.d) == self.sig
                and e.dtype == torch.float32 and e.is_contiguous() and self.d.rope.cos.is_contiguous())

    def __call__(self, input_ids: torch.Tensor, feature: torch.Tensor, positions: torch.Tensor, attention,
                 self_query) -> tuple[torch.Tensor, torch.Tensor] | None:
        from gambit.speculative.tree import TreeAttention

        if (self_query is not None and not isinstance(self_query, int)) or feature.dtype != torch.float32 \
                or not self.usable():
            return None
        d, w = self.d, self.w
        H, Hkv, D = self.shape
        B, T = input_ids.shape
        n_tail = self_query or 0
        if type(attention) is TreeAttention:  # subclasses (tests' recorders) keep Python
            mode, meta, slots, kc, vc, at = 3, [attention.k[0], attention.v[0], attention.mask], _NONE, \
                _NONE, _NONE, attention.L + attention.start
        elif type(attention) is PagedAttention and B == 1 and cpu_decoder.serves(attention) \
                and not n_tail:
            mode, meta = cpu_decoder._meta(attention)
            slots, kc, vc, at = attention.slots, attention.cache.k[0], attention.cache.v[0], 0
        else:
            return None
        logits, nxt = cpu_attention.kernel().drafter_forward(
            feature, input_ids.contiguous(), positions.contiguous(), d.embed_tokens.weight, w.w, d.rope.cos,
            d.rope.sin, n_tail, mode, meta, slots, kc, vc, at, H, Hkv, D,
            d.norm.eps, D ** -0.5, w.lo, w.hi, w.norm_kernel, d.config.norm_output, w.onednn)
        return logits, nxt
