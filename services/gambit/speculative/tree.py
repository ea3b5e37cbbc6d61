"""Tree drafting with Parallel Reconsideration, batched over sequences (each its own tree).

Rows and candidates. Row 0 is the root (the drafter's last context row; its keys live in the context).
Each draft step forwards ``R`` rows per sequence in one batched call: ``Bw`` frontier rows (the best
candidates offered by the previous step, by cumulative log-probability) and ``m`` reconsider rows (the
previous step's ``m`` least-confident rows, run again on their own output feature with self-query).
A frontier row offers its top-``k`` children; a reconsider row offers one corrected token, a sibling of
its node's own children, whose input feature for growing is the reconsidered one. Regular rows see the
context, their ancestors' rows and themselves; a reconsider row sees what its node saw plus itself;
nobody sees a reconsider row. At the end every candidate ever offered competes for the budget ``B``.
``m = 0`` is EAGLE-3.1 tree drafting (with grow width ``Bw`` decoupled from offer width ``k``).

Scores never rise along a path (log-probabilities are <= 0), and parents always sit at lower pool
indices than their children, so a stable descending sort selects an ancestor-closed tree.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gambit.speculative.drafter import Drafter

NEG = float("-inf")


@dataclass
class TreeConfig:
    gamma: int = 8  # draft steps after the context pass
    budget: int = 48  # B: draft nodes verified per cycle (reconsidered ones included)
    grow_width: int = 6  # Bw: frontier rows per step
    offer_width: int = 6  # k: children offered per frontier row
    reconsider: int = 0  # m: extra rows per step
    extra: str = "reconsider"  # what the m rows do: "reconsider" (PR) | "advance" (Table 4 control)
    self_query: bool = True  # reconsider rows take their query from the feature

    def __post_init__(self) -> None:
        for name in ("gamma", "budget", "grow_width", "offer_width"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if not isinstance(self.reconsider, int) or self.reconsider < 0:
            raise ValueError(f"reconsider must be an integer >= 0, got {self.reconsider!r}")
        if self.extra not in ("reconsider", "advance"):
            raise ValueError(f"extra must be 'reconsider' or 'advance', got {self.extra!r}")
        if self.budget > self.pool_size:
            raise ValueError(f"budget {self.budget} exceeds the {self.pool_size} candidates the tree offers")

    @property
    def rows(self) -> int:
        return self.grow_width + self.reconsider

    @property
    def pool_size(self) -> int:
        reg = self.grow_width + (self.reconsider if self.extra == "advance" else 0)
        rec = self.reconsider if self.extra == "reconsider" else 0
        return self.offer_width + self.gamma * (reg * self.offer_width + rec)


@dataclass
class DraftTree:
    """Per sequence: B nodes in pool order (parents first); index 0 of parent/mask is the root."""

    tokens: torch.Tensor  # [S, B] target ids
    parent: torch.Tensor  # [S, B] tree index of the parent (0 = root, nodes are 1..B)
    depth: torch.Tensor  # [S, B] >= 1
    valid: torch.Tensor  # [S, B] bool (False only when fewer candidates than B exist)
    mask: torch.Tensor  # [S, B+1, B+1] bool: row i sees its ancestors and itself
    reconsidered: torch.Tensor  # [S, B] bool: created by a reconsider row
    score: torch.Tensor  # [S, B] cumulative draft log-probability
    # per tree position (root = 0, nodes 1..B), for the analyses: the row forwarded for that node
    conf: torch.Tensor  # [S, B+1] drafter top-1 probability at the node (NaN: never forwarded)
    top1: torch.Tensor  # [S, B+1] drafter top-1 child token (-1: never forwarded)
    recon: torch.Tensor  # [S, B+1] corrected token of the node's reconsideration (-1: none)


class TreeAttention:
    """Drafter attention over the gathered context plus the tree rows forwarded so far."""

    def __init__(self, ctx_k: list[torch.Tensor], ctx_v: list[torch.Tensor], ctx_len: torch.Tensor,
                 total_rows: int) -> None:
        S, Hkv, L, D = ctx_k[0].shape
        pad = (0, 0, 0, total_rows)
        self.k = [F.pad(k, pad) for k in ctx_k]  # [S, Hkv, L + rows, D]
        self.v = [F.pad(v, pad) for v in ctx_v]
        self.L = L
        self.ctx_ok = torch.arange(L, device=ctx_len.device)[None, :] < ctx_len[:, None]  # [S, L]
        self.start = 0
        self.mask: torch.Tensor | None = None

    def set_rows(self, start: int, vis: torch.Tensor) -> None:
        """Next call writes rows start..start+R-1; vis [S, R, start+R] over tree rows."""
        S, R, _ = vis.shape
        self.start = start
        self.mask = torch.cat([self.ctx_ok[:, None, :].expand(S, R, self.L), vis], dim=2)[:, None]

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        R = q.shape[1]
        a, b = self.L + self.start, self.L + self.start + R
        self.k[layer][:, :, a:b] = k.transpose(1, 2)
        self.v[layer][:, :, a:b] = v.transpose(1, 2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), self.k[layer][:, :, :b],
                                             self.v[layer][:, :, :b], attn_mask=self.mask,
                                             enable_gqa=q.shape[2] != k.shape[2])
        return out.transpose(1, 2)


def _take(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x [S, N, ...] gathered at idx [S, M] → [S, M, ...]."""
    if x.dim() == 2:
        return x.gather(1, idx)
    return x.gather(1, idx.reshape(*idx.shape, *([1] * (x.dim() - 2))).expand(*idx.shape, *x.shape[2:]))


@torch.inference_mode()
def draft_tree(drafter: Drafter, cfg: TreeConfig, root_token: torch.Tensor, root_pos: torch.Tensor,
               root_feature: torch.Tensor, root_logits: torch.Tensor, attn: TreeAttention) -> DraftTree:
    """Grow one tree per sequence from its root row (token, drafter position, output feature, logits)."""
    S, dev = root_token.shape[0], root_token.device
    k, Bw, m, G = cfg.offer_width, cfg.grow_width, cfg.reconsider, cfg.gamma
    advance = cfg.extra == "advance"
    n_reg = Bw + (m if advance else 0)
    n_rec = 0 if advance else m
    R = n_reg + n_rec
    # index P of the pool and index `rows` of the rows are sinks: padded (invalid) entries point
    # there, so scatters never write twice to a real entry
    P, rows = cfg.pool_size, 1 + G * R
    # candidate pool
    tok = torch.zeros(S, P + 1, dtype=torch.long, device=dev)
    par = torch.full((S, P + 1), -1, dtype=torch.long, device=dev)  # pool index of the parent, -1 root
    score = torch.full((S, P + 1), NEG, device=dev)
    depth = torch.zeros(S, P + 1, dtype=torch.long, device=dev)
    feat_row = torch.zeros(S, P + 1, dtype=torch.long, device=dev)  # row whose output feeds this node
    vis_row = torch.zeros(S, P + 1, dtype=torch.long, device=dev)  # regular row of the parent (0 = root)
    row_of = torch.full((S, P + 1), -1, dtype=torch.long, device=dev)  # row that forwarded this node
    is_rec = torch.zeros(S, P + 1, dtype=torch.bool, device=dev)
    # rows
    H = root_feature.shape[-1]
    feat = root_feature.new_zeros(S, rows + 1, H)
    feat[:, 0] = root_feature
    vis = torch.zeros(S, rows + 1, rows + 1, dtype=torch.bool, device=dev)
    r_tok = torch.zeros(S, rows + 1, dtype=torch.long, device=dev)
    r_tok[:, 0] = root_token
    r_pos = torch.zeros(S, rows + 1, dtype=torch.long, device=dev)
    r_pos[:, 0] = root_pos
    r_node = torch.full((S, rows + 1), -1, dtype=torch.long, device=dev)  # pool index, -1 root/reconsider
    r_conf = torch.full((S, rows + 1), float("nan"), device=dev)
    r_top1 = torch.full((S, rows + 1), -1, dtype=torch.long, device=dev)
    r_recon = torch.full((S, rows + 1), -1, dtype=torch.long, device=dev)
    r_child = torch.zeros(S, rows + 1, dtype=torch.long, device=dev)  # pool index of the first child

    def offer(row_ids, node_score, node_depth, logits, at):
        """Top-k children of rows ``row_ids`` [S, n] into the pool at ``at``; returns conf."""
        lp = torch.log_softmax(logits.float(), dim=-1)
        vals, ids = lp.topk(k, dim=-1)  # [S, n, k]
        n = row_ids.shape[1]
        sl = slice(at, at + n * k)
        tok[:, sl] = drafter.to_target(ids).reshape(S, -1)
        score[:, sl] = (node_score[..., None] + vals.clamp(max=0)).reshape(S, -1)
        depth[:, sl] = (node_depth[..., None] + 1).expand(S, n, k).reshape(S, -1)
        feat_row[:, sl] = row_ids[..., None].expand(S, n, k).reshape(S, -1)
        vis_row[:, sl] = feat_row[:, sl]
        r_child.scatter_(1, row_ids, (at + torch.arange(n, device=dev) * k)[None].expand(S, n))
        r_top1.scatter_(1, row_ids, tok[:, sl].view(S, n, k)[..., 0])
        conf = vals[..., 0].exp()
        r_conf.scatter_(1, row_ids, conf)
        return conf

    zero = torch.zeros(S, 1, device=dev)
    prev_conf = offer(torch.zeros(S, 1, dtype=torch.long, device=dev), zero,
                      torch.zeros(S, 1, dtype=torch.long, device=dev), root_logits[:, None], 0)
    prev_rows = torch.zeros(S, 1, dtype=torch.long, device=dev)
    prev_ok = torch.ones(S, 1, dtype=torch.bool, device=dev)
    b0, b1 = 0, k  # the previous step's block of the pool
    for s in range(1, G + 1):
        # frontier: the best Bw candidates the previous step offered
        nsel = min(Bw, b1 - b0)
        top = score[:, b0:b1].topk(nsel, dim=1)
        sel_ok = top.values > NEG
        sel = torch.where(sel_ok, top.indices + b0, P)
        if nsel < Bw:
            padn = Bw - nsel
            sel = torch.cat([sel, sel.new_full((S, padn), P)], 1)
            sel_ok = torch.cat([sel_ok, sel_ok.new_zeros(S, padn)], 1)
        # the m least-confident rows of the previous step
        mm = min(m, prev_rows.shape[1])
        low = prev_conf.masked_fill(~prev_ok, float("inf")).topk(mm, dim=1, largest=False)
        lo_ok = low.values < float("inf")
        lo_rows = torch.where(lo_ok, _take(prev_rows, low.indices), rows)
        if mm < m:
            lo_rows = torch.cat([lo_rows, lo_rows.new_full((S, m - mm), rows)], 1)
            lo_ok = torch.cat([lo_ok, lo_ok.new_zeros(S, m - mm)], 1)
        if advance and m:  # each least-confident row's best child not already in the frontier
            kids = _take(r_child, lo_rows)[..., None] + torch.arange(k, device=dev)  # [S, m, k]
            ks = _take(score, kids.reshape(S, -1)).view(S, m, k)
            taken = (kids.reshape(S, -1, 1) == sel[:, None, :]).any(-1).view(S, m, k)
            ks = ks.masked_fill(taken | ~lo_ok[..., None], NEG)
            best = ks.max(-1)
            ok = best.values > NEG
            sel = torch.cat([sel, torch.where(ok, kids.gather(2, best.indices[..., None]).squeeze(-1), P)], 1)
            sel_ok = torch.cat([sel_ok, ok], 1)
        base = 1 + (s - 1) * R
        reg_rows = base + torch.arange(n_reg, device=dev)[None].expand(S, n_reg)
        # inputs of the regular rows
        ids = _take(tok, sel)
        f_in = _take(feat, _take(feat_row, sel))
        pos = root_pos[:, None] + _take(depth, sel)
        pvis = _take(vis, _take(vis_row, sel))  # [S, n_reg, rows]
        if n_rec:
            rec_rows = base + n_reg + torch.arange(n_rec, device=dev)[None].expand(S, n_rec)
            ids = torch.cat([ids, _take(r_tok, lo_rows)], 1)
            f_in = torch.cat([f_in, _take(feat, lo_rows)], 1)
            pos = torch.cat([pos, _take(r_pos, lo_rows)], 1)
            pvis = torch.cat([pvis, _take(vis, lo_rows)], 1)
        new_rows = base + torch.arange(R, device=dev)
        pvis[:, :, new_rows] = torch.eye(R, dtype=torch.bool, device=dev)
        vis[:, base:base + R] = pvis
        attn.set_rows(base, pvis[:, :, :base + R])
        sq = None
        if n_rec and cfg.self_query:
            sq = torch.zeros(S, R, dtype=torch.bool, device=dev)
            sq[:, n_reg:] = True
        logits, nxt = drafter(ids, f_in, pos, attention=attn, self_query=sq)
        feat[:, base:base + R] = nxt
        r_tok[:, base:base + R] = ids
        r_pos[:, base:base + R] = pos
        r_node[:, base:base + n_reg] = sel
        row_of.scatter_(1, sel, torch.where(sel_ok, reg_rows, _take(row_of, sel)))
        at = b1
        node_score = _take(score, sel).masked_fill(~sel_ok, NEG)
        conf = offer(reg_rows, node_score, _take(depth, sel), logits[:, :n_reg], at)
        at += n_reg * k
        if n_rec:
            # corrected token: a new child of the reconsidered node, fed by the reconsidered feature
            lp = torch.log_softmax(logits[:, n_reg:].float(), dim=-1)
            best, bid = lp.max(-1)
            x = drafter.to_target(bid)
            node = _take(r_node, lo_rows)  # pool index of the node (-1: root)
            nscore = torch.where(node >= 0, _take(score, node.clamp(min=0)), 0.0)
            ndepth = torch.where(node >= 0, _take(depth, node.clamp(min=0)), 0)
            s_new = (nscore + best.clamp(max=0)).masked_fill(~lo_ok, NEG)
            # a duplicate of one of the node's own offered children: merge instead of adding
            kids = _take(r_child, lo_rows)[..., None] + torch.arange(k, device=dev)  # [S, m, k]
            dup = (_take(tok, kids.reshape(S, -1)).view(S, m, k) == x[..., None]) & lo_ok[..., None]
            has = dup.any(-1)
            j = torch.where(has, kids.gather(2, dup.float().argmax(-1, keepdim=True)).squeeze(-1), P)
            j_score = _take(score, j)
            j_fwd = _take(row_of, j) >= 0
            boost = has & j_fwd  # already growing: keep it, raise its score
            score.scatter_(1, j, torch.where(boost, torch.maximum(j_score, s_new), j_score))
            moved = has & ~j_fwd  # not forwarded: the corrected copy replaces it
            s_new = torch.where(moved, torch.maximum(s_new, j_score), s_new).masked_fill(boost, NEG)
            score.scatter_(1, j, torch.where(moved, NEG, _take(score, j)))
            sl = slice(at, at + m)
            tok[:, sl], score[:, sl], par[:, sl] = x, s_new, node
            depth[:, sl], feat_row[:, sl], vis_row[:, sl] = ndepth + 1, rec_rows, lo_rows
            is_rec[:, sl] = True
            r_recon.scatter_(1, lo_rows, torch.where(lo_ok, x, _take(r_recon, lo_rows)))
            at += m
        # parents of this step's regular children
        par[:, b1:b1 + n_reg * k] = sel[..., None].expand(S, n_reg, k).reshape(S, -1)
        prev_rows, prev_ok, prev_conf = reg_rows, sel_ok, conf
        b0, b1 = b1, at
    return _select(cfg.budget, tok, par, score, depth, is_rec, row_of, r_conf, r_top1, r_recon)


def _select(B, tok, par, score, depth, is_rec, row_of, r_conf, r_top1, r_recon) -> DraftTree:
    """Re-rank the whole pool to the budget; nodes in pool order so parents precede children."""
    S, P = score.shape  # the last entry is the sink
    dev = score.device
    order = score[:, :-1].sort(dim=1, descending=True, stable=True).indices[:, :B]
    idx = order.sort(dim=1).values  # [S, B]
    valid = _take(score, idx) > NEG
    inv = torch.full((S, P), -1, dtype=torch.long, device=dev)
    inv.scatter_(1, idx, torch.arange(1, B + 1, device=dev)[None].expand(S, B))
    p = _take(par, idx)
    parent = torch.where(p >= 0, _take(inv, p.clamp(min=0)), 0)
    valid &= parent >= 0
    parent = parent.clamp(min=0).masked_fill(~valid, 0)
    # ancestors: propagate parent links (depth <= gamma + 1 iterations of one gather)
    full_parent = torch.cat([torch.zeros(S, 1, dtype=torch.long, device=dev), parent], 1)  # [S, B+1]
    eye = torch.eye(B + 1, dtype=torch.bool, device=dev).expand(S, B + 1, B + 1)
    mask = eye.clone()
    mask[:, 1:, 0] = True
    anc = full_parent
    dmax = int(depth.max()) if depth.numel() else 0
    for _ in range(dmax):
        mask |= F.one_hot(anc, B + 1).bool()
        anc = _take(full_parent, anc)
    rows = torch.cat([torch.zeros(S, 1, dtype=torch.long, device=dev), _take(row_of, idx)], 1)
    has_row = rows >= 0
    rows = rows.clamp(min=0)
    conf = _take(r_conf, rows).masked_fill(~has_row, float("nan"))
    top1 = _take(r_top1, rows).masked_fill(~has_row, -1)
    recon = _take(r_recon, rows).masked_fill(~has_row, -1)
    return DraftTree(_take(tok, idx), parent, _take(depth, idx), valid, mask, _take(is_rec, idx),
                     _take(score, idx), conf, top1, recon)
