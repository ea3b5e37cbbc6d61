"""A cycle's whole draft tree in one C++ call (the CPU kernels' extension), identical to ``draft_tree``.

Each draft step of ``tree.draft_tree`` is ~60 small tensor ops (top-k, gathers, scatters, masks) around
the drafter's forward; over the few rows of one tree their dispatch, not the arithmetic, is the cost.
Here ``tree_draft`` gathers the context into ``TreeAttention``'s buffers, allocates the pool, runs the
steps as plain loops over it and selects the budget (``tree_select``, ``_select``'s stable sort). The
ATen calls whose floats or order matter are kept as they are (``topk`` on the same tensors for the
frontier, the least-confident rows and the offered children, ``log_softmax``, ``exp`` of the top-1
log-probabilities, the drafter's forward through ``cpu_drafter``), so the tree is the one the Python
loop builds (tested). It serves the common configuration (``extra="reconsider"``, ``fresh``, no
analysis, a full draft vocabulary, one drafter layer); anything else keeps the Python loop.
"""

from __future__ import annotations

import torch

from gambit.engine import cpu_attention

_NONE = torch.empty(0, dtype=torch.long)

SOURCE = r"""
// tree.draft_tree's loop for extra = "reconsider", fresh, no analysis, identity draft vocabulary.
// Pool tensors (filled in place, contiguous): tok, par, score, depth [S, P + 1] (depth read-only when
// m = 0), vis_row [S, P + 1], feat [S, rows + 1, Hd], vis [S, rows + 1, rows + 1] bool; feat_row [P + 1].
// cfg: k, Bw, m, gamma, self_query. mbuf [S, R, L + rows] additive mask (context part filled), kbuf/vbuf
// TreeAttention's layer-0 buffers. The drafter: w (see drafter_forward), embw, cos_t/sin_t tables,
// dims: H, Hkv, D, lo, hi.
void tree_steps(torch::Tensor tok, torch::Tensor par, torch::Tensor score, torch::Tensor depth,
                torch::Tensor vis_row, torch::Tensor feat, torch::Tensor vis, torch::Tensor feat_row,
                torch::Tensor root_pos, torch::Tensor root_tok, torch::Tensor root_logits,
                std::vector<int64_t> cfg, torch::Tensor mbuf, torch::Tensor kbuf, torch::Tensor vbuf,
                int64_t L, std::vector<torch::Tensor> w, torch::Tensor embw, torch::Tensor cos_t,
                torch::Tensor sin_t, std::vector<int64_t> dims, double eps, bool norm_kernel,
                bool norm_output, torch::Tensor d2t, bool onednn) {
  const int64_t k = cfg[0], Bw = cfg[1], m = cfg[2], G = cfg[3];
  const bool self_query = cfg[4] != 0;
  const int64_t S = tok.size(0), P1 = tok.size(1), P = P1 - 1, R = Bw + m, RW = vis.size(1);
  const int64_t Hd = feat.size(2), V = root_logits.size(-1), MW = mbuf.size(2);
  const int64_t H = dims[0], Hkv = dims[1], D = dims[2], lo = dims[3], hi = dims[4];
  const float NEG = -std::numeric_limits<float>::infinity(), INF = std::numeric_limits<float>::infinity();
  int64_t *tk = tok.data_ptr<int64_t>(), *pr = par.data_ptr<int64_t>(), *dp = depth.data_ptr<int64_t>();
  int64_t* vr = vis_row.data_ptr<int64_t>();
  float *sc = score.data_ptr<float>(), *ft = feat.data_ptr<float>(), *mb = mbuf.data_ptr<float>();
  bool* vs = vis.data_ptr<bool>();
  const int64_t* fr = feat_row.data_ptr<int64_t>();
  const int64_t* rp = root_pos.data_ptr<int64_t>();
  const int64_t* rt = root_tok.data_ptr<int64_t>();
  // a reduced draft vocabulary: target id = draft id + d2t[draft id] (empty d2t: the ids are the same)
  TORCH_CHECK(d2t.numel() == 0 || (d2t.is_contiguous() && d2t.numel() == root_logits.size(-1)), "d2t [Vd]");
  const int64_t* d2 = d2t.numel() ? d2t.data_ptr<int64_t>() : nullptr;
  auto lng = tok.options();

  // offer(): the top-k children of n rows (log-probs lp [S, n, V]) into the pool at `at`
  auto offer = [&](const at::Tensor& lp, const std::vector<float>& ns, const std::vector<int64_t>& nd,
                   int64_t n, int64_t at) {
    auto t = at::topk(lp, k, -1);
    auto vals = std::get<0>(t), ids = std::get<1>(t).contiguous();
    auto vc = vals.contiguous();
    const float* vp = vc.data_ptr<float>();
    const int64_t* ip = ids.data_ptr<int64_t>();
    for (int64_t s = 0; s < S; ++s)
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < k; ++c) {
          const int64_t i = s * P1 + at + r * k + c, j = (s * n + r) * k + c;
          const float v = vp[j];
          tk[i] = d2 ? ip[j] + d2[ip[j]] : ip[j];
          sc[i] = ns[s * n + r] + (v > 0.f ? 0.f : v);  // node score + vals.clamp(max=0)
          if (m) dp[i] = nd[s * n + r] + 1;
        }
    std::vector<float> conf;  // each row's top log-probability: its confidence, for reconsideration
    if (m) {
      conf.resize(S * n);
      for (int64_t j = 0; j < S * n; ++j) conf[j] = vp[j * k];
    }
    return std::make_pair(std::move(conf), ids);
  };

  auto first = offer(at::log_softmax(root_logits.unsqueeze(1), -1), std::vector<float>(S, 0.f),
                     std::vector<int64_t>(S, 0), 1, 0);
  std::vector<float> prev_conf = std::move(first.first);  // [S, n_prev]
  at::Tensor prev_did = first.second;                      // [S, n_prev, k]
  int64_t n_prev = 1, prev_base = 0, b0 = 0, b1 = k, at = k;
  std::vector<int64_t> prev_info(S * 4);  // [S, n_prev, 4]: token, position, node, depth
  for (int64_t s = 0; s < S; ++s) {
    prev_info[s * 4] = rt[s];
    prev_info[s * 4 + 1] = rp[s];
    prev_info[s * 4 + 2] = -1;
    prev_info[s * 4 + 3] = 0;
  }
  std::vector<float> prev_score(S, 0.f), node_score(S * Bw);
  std::vector<char> prev_ok(S, 1), sel_ok(S * Bw), lo_ok(S * m);
  std::vector<int64_t> sel(S * Bw), sel_depth(S * Bw), li(S * m);
  std::vector<float> row(V);
  auto ids_t = at::empty({S, R}, lng), pos_t = at::empty({S, R}, lng);
  int64_t *ip = ids_t.data_ptr<int64_t>(), *pp = pos_t.data_ptr<int64_t>();
  for (int64_t st = 1; st <= G; ++st) {
    const int64_t base = 1 + (st - 1) * R, nxt_at = at + Bw * k + m;
    // frontier: the best Bw candidates the previous step offered
    const int64_t nsel = std::min(Bw, b1 - b0);
    auto top = at::topk(score.slice(1, b0, b1), nsel, 1);
    auto tv = std::get<0>(top).contiguous(), ti = std::get<1>(top).contiguous();
    for (int64_t s = 0; s < S; ++s)
      for (int64_t j = 0; j < Bw; ++j) {
        const bool ok = j < nsel && tv.data_ptr<float>()[s * nsel + j] > NEG;
        sel_ok[s * Bw + j] = ok;
        sel[s * Bw + j] = ok ? ti.data_ptr<int64_t>()[s * nsel + j] + b0 : P;
      }
    int64_t mm = 0;
    if (m) {  // the m least-confident rows of the previous step (a stable ascending sort, as tree.py)
      mm = std::min(m, n_prev);
      std::vector<float> cm(n_prev);
      std::vector<int64_t> order(n_prev);
      for (int64_t s = 0; s < S; ++s) {
        for (int64_t i = 0; i < n_prev; ++i) {
          cm[i] = prev_ok[s * n_prev + i] ? prev_conf[s * n_prev + i] : INF;
          order[i] = i;
        }
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return cm[a] < cm[b]; });
        for (int64_t j = 0; j < m; ++j) {
          li[s * m + j] = j < mm ? order[j] : 0;
          lo_ok[s * m + j] = j < mm && cm[order[j]] < INF;
        }
      }
    }
    // the rows' inputs: regular rows read their node, reconsider rows their previous row
    auto fin = at::empty({S, R, Hd}, feat.options());
    float* fp = fin.data_ptr<float>();
    for (int64_t s = 0; s < S; ++s) {
      for (int64_t r = 0; r < R; ++r) {
        int64_t src, vsrc;
        if (r < Bw) {
          const int64_t node = sel[s * Bw + r];
          sel_depth[s * Bw + r] = dp[s * P1 + node];
          ip[s * R + r] = tk[s * P1 + node];
          pp[s * R + r] = rp[s] + sel_depth[s * Bw + r];
          src = fr[node];
          vsrc = vr[s * P1 + node];
        } else {
          const int64_t* info = prev_info.data() + (s * n_prev + li[s * m + r - Bw]) * 4;
          ip[s * R + r] = info[0];
          pp[s * R + r] = info[1];
          src = vsrc = prev_base + li[s * m + r - Bw];
        }
        std::copy(ft + (s * RW + src) * Hd, ft + (s * RW + src + 1) * Hd, fp + (s * R + r) * Hd);
        bool* vrow = vs + (s * RW + base + r) * RW;
        std::copy(vs + (s * RW + vsrc) * RW, vs + (s * RW + vsrc + 1) * RW, vrow);
        for (int64_t j = 0; j < R; ++j) vrow[base + j] = j == r;
        float* mrow = mb + (s * R + r) * MW + L;
        for (int64_t c = 0; c < base + R; ++c) mrow[c] = vrow[c] ? 0.f : NEG;
      }
    }
    auto mask = mbuf.unsqueeze(1).slice(3, 0, L + base + R);
    auto out = drafter_forward(fin, ids_t, pos_t, embw, w, cos_t, sin_t, (m && self_query) ? m : 0, 3,
                               {kbuf, vbuf, mask}, at::Tensor(), at::Tensor(), at::Tensor(), L + base, H, Hkv,
                               D, eps, 1.0 / std::sqrt((double)D), lo, hi, norm_kernel, norm_output, onednn);
    feat.slice(1, base, base + R).copy_(out[1]);
    for (int64_t s = 0; s < S; ++s)
      for (int64_t r = 0; r < Bw; ++r) node_score[s * Bw + r] = sc[s * P1 + sel[s * Bw + r]];
    auto lp = at::log_softmax(out[0], -1);
    auto offered = offer(lp.slice(1, 0, Bw), node_score, sel_depth, Bw, at);
    if (m) {  // corrected tokens: the best token each reconsidered node did not already offer
      auto lpc = lp.contiguous();
      const float* lpp = lpc.data_ptr<float>();
      const int64_t* did = prev_did.data_ptr<int64_t>();
      for (int64_t s = 0; s < S; ++s)
        for (int64_t j = 0; j < m; ++j) {
          const int64_t l = li[s * m + j];
          std::copy(lpp + (s * R + Bw + j) * V, lpp + (s * R + Bw + j + 1) * V, row.begin());
          for (int64_t c = 0; c < k; ++c) row[did[(s * n_prev + l) * k + c]] = NEG;
          float best = row[0];
          int64_t bid = 0;
          for (int64_t v = 0; v < V; ++v)  // max(-1): the first maximum (NaN wins), as ATen's CPU max
            if (!(row[v] <= best)) {
              best = row[v];
              bid = v;
              if (std::isnan(row[v])) break;
            }
          float s_new = prev_score[s * n_prev + l] + (best > 0.f ? 0.f : best);
          if (mm < m && !lo_ok[s * m + j]) s_new = NEG;
          const int64_t* info = prev_info.data() + (s * n_prev + l) * 4;
          const int64_t i = s * P1 + nxt_at - m + j;
          tk[i] = d2 ? bid + d2[bid] : bid;
          sc[i] = s_new;
          pr[i] = info[2];
          vr[i] = prev_base + l;
          dp[i] = info[3] + 1;
        }
      prev_info.assign(S * Bw * 4, 0);
      for (int64_t s = 0; s < S; ++s)
        for (int64_t r = 0; r < Bw; ++r) {
          int64_t* info = prev_info.data() + (s * Bw + r) * 4;
          info[0] = ip[s * R + r];
          info[1] = pp[s * R + r];
          info[2] = sel[s * Bw + r];
          info[3] = sel_depth[s * Bw + r];
        }
    }
    for (int64_t s = 0; s < S; ++s)  // parents of this step's regular children
      for (int64_t r = 0; r < Bw; ++r)
        for (int64_t c = 0; c < k; ++c) pr[s * P1 + at + r * k + c] = sel[s * Bw + r];
    prev_ok.assign(sel_ok.begin(), sel_ok.end());
    prev_conf = std::move(offered.first);
    prev_did = offered.second;
    prev_score.assign(node_score.begin(), node_score.end());
    n_prev = Bw;
    prev_base = base;
    b0 = at;
    b1 = nxt_at;
    at = nxt_at;
  }
}

// tree._select: the budget's best candidates (a stable descending sort by score), in pool order, with
// tree parents and the ancestor mask (G hops). tok, par, score, depth, is_rec [S, P + 1] (last: the sink).
// Returns tokens, parent, depth, valid, mask, reconsidered, score.
std::vector<torch::Tensor> tree_select(torch::Tensor tok, torch::Tensor par, torch::Tensor score,
                                       torch::Tensor depth, torch::Tensor is_rec, int64_t B, int64_t G) {
  const int64_t S = score.size(0), P1 = score.size(1), P = P1 - 1;
  const float NEG = -std::numeric_limits<float>::infinity();
  auto lng = tok.options();
  auto o_tok = at::empty({S, B}, lng), o_par = at::empty({S, B}, lng), o_dep = at::empty({S, B}, lng);
  auto o_valid = at::empty({S, B}, lng.dtype(at::kBool)), o_rec = at::empty({S, B}, lng.dtype(at::kBool));
  auto o_score = at::empty({S, B}, score.options());
  auto mask = at::zeros({S, B + 1, B + 1}, lng.dtype(at::kBool));
  const int64_t *tk = tok.data_ptr<int64_t>(), *pr = par.data_ptr<int64_t>(), *dp = depth.data_ptr<int64_t>();
  const float* sc = score.data_ptr<float>();
  const bool* rc = is_rec.data_ptr<bool>();
  int64_t *ot = o_tok.data_ptr<int64_t>(), *op = o_par.data_ptr<int64_t>(), *od = o_dep.data_ptr<int64_t>();
  bool *ov = o_valid.data_ptr<bool>(), *orc = o_rec.data_ptr<bool>(), *mk = mask.data_ptr<bool>();
  float* os = o_score.data_ptr<float>();
  std::vector<int64_t> order(P), inv(P1), full(B + 1);
  for (int64_t s = 0; s < S; ++s) {
    const float* scs = sc + s * P1;
    for (int64_t i = 0; i < P; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return scs[a] > scs[b]; });
    std::sort(order.begin(), order.begin() + B);
    std::fill(inv.begin(), inv.end(), -1);
    for (int64_t j = 0; j < B; ++j) inv[order[j]] = j + 1;
    full[0] = 0;
    for (int64_t j = 0; j < B; ++j) {
      const int64_t i = order[j], o = s * B + j, p = pr[s * P1 + i];
      int64_t parent = p >= 0 ? inv[p] : 0;
      const bool valid = scs[i] > NEG && parent >= 0;
      parent = valid ? parent : 0;
      ot[o] = tk[s * P1 + i];
      od[o] = dp[s * P1 + i];
      orc[o] = rc[s * P1 + i];
      os[o] = scs[i];
      ov[o] = valid;
      op[o] = parent;
      full[j + 1] = parent;
    }
    bool* m = mk + s * (B + 1) * (B + 1);
    m[0] = true;
    for (int64_t j = 1; j <= B; ++j) {
      bool* row = m + j * (B + 1);
      row[j] = row[0] = true;
      int64_t a = full[j];
      row[a] = true;
      for (int64_t h = 1; h < G; ++h) {
        a = full[a];
        row[a] = true;
      }
    }
  }
  return {o_tok, o_par, o_dep, o_valid, mask, o_rec, o_score};
}

// The whole tree of one cycle: TreeAttention's buffers (the drafter context gathered from its blocks,
// zero padding for the tree rows, the context part of the additive mask), the pool as draft_tree
// allocates it, tree_steps, tree_select. kc, vc [Hkv, NB, bs, D] (the drafter's layer 0); tables [S, nb];
// ctx_len [S]; feat_row, lay_depth, is_rec [P + 1] (tree._layout); cfg: k, Bw, m, gamma, self_query, budget.
std::vector<torch::Tensor> tree_draft(
    torch::Tensor kc, torch::Tensor vc, torch::Tensor tables, torch::Tensor ctx_len, torch::Tensor feat_row,
    torch::Tensor lay_depth, torch::Tensor is_rec, torch::Tensor root_pos, torch::Tensor root_tok,
    torch::Tensor root_feature, torch::Tensor root_logits, std::vector<int64_t> cfg,
    std::vector<torch::Tensor> w, torch::Tensor embw, torch::Tensor cos_t, torch::Tensor sin_t,
    std::vector<int64_t> dims, double eps, bool norm_kernel, bool norm_output, torch::Tensor d2t,
    bool onednn) {
  NoGil no_gil;
  TORCH_CHECK(kc.is_contiguous() && vc.is_contiguous() && tables.is_contiguous(), "contiguous caches");
  const int64_t k = cfg[0], Bw = cfg[1], m = cfg[2], G = cfg[3], R = Bw + m, rows = 1 + G * R;
  const int64_t S = tables.size(0), nb = tables.size(1), Hkv = kc.size(0), NB = kc.size(1), bs = kc.size(2);
  const int64_t D = kc.size(3), L = nb * bs, W = L + rows, P1 = feat_row.size(0), Hd = root_feature.size(-1);
  const float NEG = -std::numeric_limits<float>::infinity();
  auto kbuf = at::zeros({S, Hkv, W, D}, kc.options()), vbuf = at::zeros({S, Hkv, W, D}, vc.options());
  const int64_t* tb = tables.data_ptr<int64_t>();
  const float *kp = kc.data_ptr<float>(), *vp = vc.data_ptr<float>();
  float *kb = kbuf.data_ptr<float>(), *vb = vbuf.data_ptr<float>();
  for (int64_t s = 0; s < S; ++s)
    for (int64_t h = 0; h < Hkv; ++h)
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t src = (h * NB + tb[s * nb + b]) * bs * D, dst = ((s * Hkv + h) * W + b * bs) * D;
        std::copy(kp + src, kp + src + bs * D, kb + dst);
        std::copy(vp + src, vp + src + bs * D, vb + dst);
      }
  auto mbuf = at::zeros({S, R, W}, root_feature.options());
  const int64_t* cl = ctx_len.data_ptr<int64_t>();
  for (int64_t s = 0; s < S; ++s)
    for (int64_t r = 0; r < R; ++r) {
      float* mr = mbuf.data_ptr<float>() + (s * R + r) * W;
      for (int64_t c = cl[s]; c < L; ++c) mr[c] = NEG;
    }
  auto lng = root_tok.options();
  auto tok = at::zeros({S, P1}, lng), par = at::full({S, P1}, -1, lng);
  auto score = at::full({S, P1}, NEG, root_feature.options());
  // vis_row is written (corrected tokens' rows): a copy, never a view of the cached layout. At S = 1
  // expand().contiguous() would return feat_row itself, and every later tree would read the writes.
  auto vis_row = feat_row.expand({S, P1}).clone(at::MemoryFormat::Contiguous);
  auto depth = m ? at::zeros({S, P1}, lng) : lay_depth.expand({S, P1}).contiguous();  // read-only
  auto feat = at::zeros({S, rows + 1, Hd}, root_feature.options());
  feat.select(1, 0).copy_(root_feature);
  auto vis = at::zeros({S, rows + 1, rows + 1}, lng.dtype(at::kBool));
  tree_steps(tok, par, score, depth, vis_row, feat, vis, feat_row, root_pos.contiguous(),
             root_tok.contiguous(), root_logits.contiguous(), {k, Bw, m, G, cfg[4]}, mbuf, kbuf, vbuf, L, w,
             embw, cos_t, sin_t, dims, eps, norm_kernel, norm_output, d2t, onednn);
  return tree_select(tok, par, score, depth, is_rec.expand({S, P1}).contiguous(), cfg[5], G);
}
"""


def serves(drafter, cfg, analysis: bool) -> bool:
    """Whether ``draft`` builds this tree (else ``tree.draft_tree``'s Python loop does)."""
    from gambit.speculative.cpu_drafter import _Forward

    ff = drafter.fast_forward
    return (isinstance(ff, _Forward) and ff.usable() and not analysis and cfg.extra == "reconsider"
            and (cfg.fresh or cfg.reconsider == 0) and cfg.select == "confidence"
            and drafter.config.num_layers == 1)


def draft(drafter, cfg, kc: torch.Tensor, vc: torch.Tensor, tables: torch.Tensor, ctx_len: torch.Tensor,
          root_token: torch.Tensor, root_pos: torch.Tensor, root_feature: torch.Tensor,
          root_logits: torch.Tensor):
    """``tree.draft_tree`` over a ``TreeAttention(kc/vc gathered at tables, ctx_len)`` in one call:
    the same tree (``serves`` says when)."""
    from gambit.speculative.tree import DraftTree, _layout

    ff = drafter.fast_forward
    w, (H, Hkv, D) = ff.w, ff.shape
    lay = _layout(cfg, cfg.grow_width, cfg.reconsider, root_token.device)
    out = cpu_attention.kernel().tree_draft(
        kc, vc, tables.contiguous(), ctx_len.contiguous(), lay.feat_row, lay.depth, lay.is_rec, root_pos,
        root_token, root_feature, root_logits,
        [cfg.offer_width, cfg.grow_width, cfg.reconsider, cfg.gamma, int(cfg.self_query), cfg.budget],
        w.w, drafter.embed_tokens.weight, drafter.rope.cos, drafter.rope.sin, [H, Hkv, D, w.lo, w.hi],
        drafter.norm.eps, w.norm_kernel, drafter.config.norm_output,
        _NONE if drafter.identity_vocab else drafter.d2t.contiguous(), w.onednn)
    return DraftTree(*out)
