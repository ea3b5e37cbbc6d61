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

from gambit.engine import cpu_attention
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
    fresh: bool = True  # corrected token: the best one not among the node's offered children (else: merge)
    # which rows to reconsider: "confidence" = the m with the lowest top-1 probability (the paper);
    # "miss" = the m most likely to be on the accepted path with the target's token outside their offers
    # (the highest path probability x probability mass outside the row's top-k)
    select: str = "confidence"

    def __post_init__(self) -> None:
        for name in ("gamma", "budget", "grow_width", "offer_width"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if not isinstance(self.reconsider, int) or self.reconsider < 0:
            raise ValueError(f"reconsider must be an integer >= 0, got {self.reconsider!r}")
        if self.select not in ("confidence", "miss"):
            raise ValueError(f"select must be 'confidence' or 'miss', got {self.select!r}")
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
    # per tree position (root = 0, nodes 1..B), for the analyses (None unless asked for): the row
    # forwarded for that node
    conf: torch.Tensor | None = None  # [S, B+1] drafter top-1 probability at the node (NaN: never forwarded)
    top1: torch.Tensor | None = None  # [S, B+1] drafter top-1 child token (-1: never forwarded)
    recon: torch.Tensor | None = None  # [S, B+1] corrected token of the node's reconsideration (-1: none)
    # the whole candidate pool, for ``cycle_ends`` (None unless asked for): PoolRecord
    pool: PoolRecord | None = None


@dataclass
class PoolRecord:
    """Every candidate the tree offered, kept or not, and the log-probs of every forwarded row: what
    ``speculative.cycle_ends`` needs to say why a cycle stopped where it did."""

    tok: torch.Tensor  # [S, P + 1] target ids (the last entry is a sink)
    par: torch.Tensor  # [S, P + 1] pool index of the parent (-1: the root)
    depth: torch.Tensor  # [S, P + 1] depth below the root (1 = the root's children)
    row_of: torch.Tensor  # [S, P + 1] row that forwarded the candidate (-1: never forwarded)
    kept: torch.Tensor  # [S, B] pool index of tree node i + 1
    row_lp: torch.Tensor  # [S, rows + 1, Vd] draft log-probs of each forwarded row (row 0: the root)
    max_depth: int  # the deepest a candidate can be (gamma + 1)


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
        self.total = total_rows
        self.buf: torch.Tensor | None = None  # [S, R, L + rows] additive mask, context part filled once
        self.start = 0
        self.mask: torch.Tensor | None = None

    def set_rows(self, start: int, vis: torch.Tensor) -> None:
        """Next call writes rows start..start+R-1; vis [S, R, start+R] over tree rows."""
        S, R, n = vis.shape
        if self.buf is None or self.buf.shape[1] != R:
            self.buf = torch.zeros(S, R, self.L + self.total, device=vis.device)
            self.buf[:, :, :self.L].masked_fill_(~self.ctx_ok[:, None, :], NEG)
        self.start = start
        b = self.L + n
        self.buf[:, :, self.L:b] = torch.where(vis, 0.0, NEG)  # one additive mask for every layer
        self.mask = self.buf[:, None, :, :b]

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        R = q.shape[1]
        a, b = self.L + self.start, self.L + self.start + R
        self.k[layer][:, :, a:b] = k.transpose(1, 2)
        self.v[layer][:, :, a:b] = v.transpose(1, 2)
        if (q.device.type == "cpu" and q.dtype == torch.float32 and not q.requires_grad
                and cpu_attention.kernel() is not None):
            # the tiled kernel the C++ tree steps call: the same floats, so both build the same tree
            return cpu_attention.dense_attention(q, self.k[layer], self.v[layer], b, self.mask,
                                                 q.shape[-1] ** -0.5)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), self.k[layer][:, :, :b],
                                             self.v[layer][:, :, :b], attn_mask=self.mask,
                                             enable_gqa=q.shape[2] != k.shape[2])
        return out.transpose(1, 2)


def _take(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x [S, N, ...] gathered at idx [S, M] → [S, M, ...]."""
    if x.dim() == 2:
        return x.gather(1, idx)
    return x.gather(1, idx.reshape(*idx.shape, *([1] * (x.dim() - 2))).expand(*idx.shape, *x.shape[2:]))


@dataclass
class _Layout:
    """What depends only on the configuration: pool depth, the row feeding each candidate, row ids."""

    depth: torch.Tensor  # [P + 1] pool depth without reconsideration (which can graft shallower nodes)
    feat_row: torch.Tensor  # [P + 1] row whose output feeds each candidate
    is_rec: torch.Tensor  # [P + 1] bool
    eye: torch.Tensor  # [R, R] bool
    steps: list  # per step: (base, reg_rows [n_reg], rec_rows [n_rec], new_rows [R], pool start, end)


_LAYOUTS: dict = {}


def _layout(cfg: TreeConfig, n_reg: int, n_rec: int, device: torch.device) -> _Layout:
    key = (cfg.gamma, cfg.offer_width, n_reg, n_rec, str(device))
    lay = _LAYOUTS.get(key)
    if lay is not None:
        return lay
    k, R, P = cfg.offer_width, n_reg + n_rec, cfg.pool_size
    depth, feat_row, is_rec = [1] * k, [0] * k, [False] * k
    steps = []
    at = k
    for s in range(1, cfg.gamma + 1):
        base = 1 + (s - 1) * R
        depth += [s + 1] * (n_reg * k + n_rec)
        feat_row += [base + r for r in range(n_reg) for _ in range(k)]
        feat_row += [base + n_reg + j for j in range(n_rec)]
        is_rec += [False] * (n_reg * k) + [True] * n_rec
        ar = torch.arange(R, device=device)
        steps.append((base, base + ar[:n_reg], base + ar[n_reg:], base + ar, at, at + n_reg * k + n_rec))
        at += n_reg * k + n_rec
    assert at == P
    t = lambda x, dt: torch.tensor(x + [0], dtype=dt, device=device)  # noqa: E731  (+ the sink)
    lay = _Layout(t(depth, torch.long), t(feat_row, torch.long), t(is_rec, torch.bool),
                  torch.eye(R, dtype=torch.bool, device=device), steps)
    _LAYOUTS[key] = lay
    return lay


@torch.inference_mode()
def draft_tree(drafter: Drafter, cfg: TreeConfig, root_token: torch.Tensor, root_pos: torch.Tensor,
               root_feature: torch.Tensor, root_logits: torch.Tensor, attn: TreeAttention,
               analysis: bool = False, reconsider_hook=None) -> DraftTree:
    """Grow one tree per sequence from its root row (token, drafter position, output feature, logits).

    ``analysis`` also records, per node, the drafter's confidence, top-1 child and corrected token.
    ``reconsider_hook(root_pos, tok, par, score, node, node_depth, x, x_score) -> (x, x_score)``, for
    analysis only (``tools/pr_oracle.py``): replaces the corrected tokens ``x`` [S, m] of the
    reconsidered pool nodes ``node`` (-1: the root), and their scores, before they join the pool.
    """
    S, dev = root_token.shape[0], root_token.device
    k, Bw, m, G = cfg.offer_width, cfg.grow_width, cfg.reconsider, cfg.gamma
    advance = cfg.extra == "advance"
    n_reg = Bw + (m if advance else 0)
    n_rec = 0 if advance else m
    R = n_reg + n_rec
    lay = _layout(cfg, n_reg, n_rec, dev)
    # index P of the pool and index `rows` of the rows are sinks: padded (invalid) entries point
    # there, so scatters never write twice to a real entry
    P, rows = cfg.pool_size, 1 + G * R
    # candidate pool
    tok = torch.zeros(S, P + 1, dtype=torch.long, device=dev)
    par = torch.full((S, P + 1), -1, dtype=torch.long, device=dev)  # pool index of the parent, -1 root
    score = torch.full((S, P + 1), NEG, device=dev)
    vis_row = lay.feat_row.expand(S, P + 1)  # row whose visibility a candidate inherits
    if n_rec:
        vis_row = vis_row.clone()  # a corrected token sees what its node's row saw
    merge = n_rec and not cfg.fresh  # a corrected token may duplicate an offered child
    row_of = torch.full((S, P + 1), -1, dtype=torch.long, device=dev) if (analysis or merge) else None
    # corrected tokens graft shallower nodes into a step's block: then depth is tracked
    depth = torch.zeros(S, P + 1, dtype=torch.long, device=dev) if n_rec else lay.depth.expand(S, P + 1)
    # rows
    H = root_feature.shape[-1]
    feat = root_feature.new_zeros(S, rows + 1, H)  # zeros: padded rows read finite inputs
    feat[:, 0] = root_feature
    vis = torch.zeros(S, rows + 1, rows + 1, dtype=torch.bool, device=dev)
    if analysis:
        r_conf = torch.full((S, rows + 1), float("nan"), device=dev)
        r_top1 = torch.full((S, rows + 1), -1, dtype=torch.long, device=dev)
        r_recon = torch.full((S, rows + 1), -1, dtype=torch.long, device=dev)
        r_lp = torch.full((S, rows + 1, root_logits.shape[-1]), float("nan"), device=dev)
    kk = torch.arange(k, device=dev)

    def offer(row_ids, node_score, node_depth, lp, at):
        """Top-k children of rows ``row_ids`` [n] (log-probs ``lp``) into the pool at ``at``."""
        vals, ids = lp.topk(k, dim=-1)  # [S, n, k]
        n = row_ids.shape[0]
        sl = slice(at, at + n * k)
        tok[:, sl] = drafter.to_target(ids).view(S, -1)
        score[:, sl] = (node_score[..., None] + vals.clamp(max=0)).view(S, -1)
        if n_rec:
            depth[:, sl] = (node_depth + 1).repeat_interleave(k, dim=1)
        conf = None  # rows are reconsidered lowest first
        if m and cfg.select == "miss":  # -log(path probability x mass outside the offers)
            outside = torch.log1p(-vals.exp().sum(-1).clamp(max=1 - 1e-7))
            conf = -(node_score + outside)
        elif m:
            conf = vals[..., 0]  # the top log-probability ranks rows by confidence
        if analysis:
            r_top1[:, row_ids] = tok[:, sl].view(S, n, k)[..., 0]
            r_conf[:, row_ids] = vals[..., 0].exp()
        return conf, ids

    zero = torch.zeros(S, 1, dtype=torch.long, device=dev)
    root_lp = torch.log_softmax(root_logits[:, None].float(), dim=-1)
    if analysis:
        r_lp[:, :1] = root_lp
    prev_conf, prev_did = offer(zero[0], torch.zeros(S, 1, device=dev), zero, root_lp, 0)
    prev_ok = torch.ones(S, 1, dtype=torch.bool, device=dev)
    # the previous step's rows, for reconsideration: (token, position, node, depth) and node score
    prev_info = torch.stack([root_token, root_pos, root_token.new_full((S,), -1), root_token.new_zeros(S)],
                            -1)[:, None]
    prev_score = torch.zeros(S, 1, device=dev)
    prev_base = 0  # row index of the previous step's first row
    b0, b1 = 0, k  # the previous step's block of the pool
    for s in range(1, G + 1):
        base, reg_rows, rec_rows, new_rows, at, nxt_at = lay.steps[s - 1]
        # frontier: the best Bw candidates the previous step offered
        nsel = min(Bw, b1 - b0)
        top = score[:, b0:b1].topk(nsel, dim=1)
        sel_ok = top.values > NEG
        sel = torch.where(sel_ok, top.indices + b0, P)
        if nsel < Bw:
            padn = Bw - nsel
            sel = torch.cat([sel, sel.new_full((S, padn), P)], 1)
            sel_ok = torch.cat([sel_ok, sel_ok.new_zeros(S, padn)], 1)
        if m:  # the m least-confident rows of the previous step (li: their index among its rows)
            mm = min(m, prev_conf.shape[1])
            # a stable sort: ties (two rows both sure, log-prob 0) go to the earlier row, as in cpu_tree
            low_v, li = prev_conf.masked_fill(~prev_ok, float("inf")).sort(dim=1, stable=True)
            low_v, li = low_v[:, :mm], li[:, :mm]
            if merge or advance or mm < m:
                lo_ok = low_v < float("inf")
            if mm < m:  # fewer rows than m (after the root): pads that can never be selected
                li = torch.cat([li, li.new_zeros(S, m - mm)], 1)
                lo_ok = torch.cat([lo_ok, lo_ok.new_zeros(S, m - mm)], 1)
            lo_rows = prev_base + li
            if merge or advance:  # [S, m, k] pool indices of the rows' offered children
                kids = (b0 + li * k)[..., None] + kk
        if advance and m:  # each least-confident row's best child not already in the frontier
            ks = _take(score, kids.reshape(S, -1)).view(S, m, k)
            taken = (kids.reshape(S, -1, 1) == sel[:, None, :]).any(-1).view(S, m, k)
            ks = ks.masked_fill(taken | ~lo_ok[..., None], NEG)
            best = ks.max(-1)
            ok = best.values > NEG
            sel = torch.cat([sel, torch.where(ok, kids.gather(2, best.indices[..., None]).squeeze(-1), P)], 1)
            sel_ok = torch.cat([sel_ok, ok], 1)
        # inputs of the regular rows, then of the reconsider rows (the row's own token, position and
        # visibility, fed its own output)
        ids = _take(tok, sel)
        f_row = lay.feat_row[sel]
        sel_depth = _take(depth, sel)
        pos = root_pos[:, None] + sel_depth
        if n_rec:
            info = _take(prev_info, li)  # [S, m, 4]
            ids = torch.cat([ids, info[..., 0]], 1)
            pos = torch.cat([pos, info[..., 1]], 1)
            f_in = _take(feat, torch.cat([f_row, lo_rows], 1))
            pvis = _take(vis, torch.cat([_take(vis_row, sel), lo_rows], 1))  # [S, R, rows]
        else:
            f_in, pvis = _take(feat, f_row), _take(vis, f_row)
        pvis[:, :, new_rows] = lay.eye
        vis[:, base:base + R] = pvis
        attn.set_rows(base, pvis[:, :, :base + R])
        logits, nxt = drafter(ids, f_in, pos, attention=attn,
                              self_query=n_rec if (n_rec and cfg.self_query) else None)
        feat[:, base:base + R] = nxt
        node_score = _take(score, sel)  # the sink's score is -inf
        if row_of is not None:
            row_of.scatter_(1, sel, reg_rows.expand(S, n_reg))  # padded rows write into the sink
        lp = torch.log_softmax(logits.float(), dim=-1)
        if analysis:
            r_lp[:, base:base + R] = lp
        conf, did = offer(reg_rows, node_score, sel_depth, lp[:, :n_reg], at)
        if n_rec:
            # corrected token: a new child of the reconsidered node, fed by the reconsidered feature
            lpr = lp[:, n_reg:]
            if cfg.fresh:  # never one of the node's offered children: always a new candidate
                lpr = lpr.scatter(-1, _take(prev_did, li), NEG)
            best, bid = lpr.max(-1)
            x = drafter.to_target(bid)
            s_new = _take(prev_score, li) + best.clamp(max=0)  # a padded frontier row's score: -inf
            if mm < m:
                s_new = s_new.masked_fill(~lo_ok, NEG)
            if reconsider_hook is not None:
                x, s_new = reconsider_hook(root_pos, tok, par, score, info[..., 2], info[..., 3], x, s_new)
            if merge:  # a duplicate of one of the node's own offered children: merge instead of adding
                dup = (_take(tok, kids.reshape(S, -1)).view(S, m, k) == x[..., None]) & lo_ok[..., None]
                has = dup.any(-1)
                j = torch.where(has, kids.gather(2, dup.float().argmax(-1, keepdim=True)).squeeze(-1), P)
                j_score = _take(score, j)
                fwd = _take(row_of, j) >= 0
                # already growing: keep it and raise its score; not forwarded: the corrected copy replaces it
                top = torch.maximum(j_score, s_new)
                score.scatter_(1, j, torch.where(has, torch.where(fwd, top, NEG), j_score))
                s_new = torch.where(has, torch.where(fwd, NEG, top), s_new)
            sl = slice(nxt_at - m, nxt_at)
            tok[:, sl], score[:, sl], par[:, sl], vis_row[:, sl] = x, s_new, info[..., 2], lo_rows
            depth[:, sl] = info[..., 3] + 1
            if analysis:
                r_recon.scatter_(1, lo_rows, x)
            prev_info = torch.stack([ids[:, :n_reg], pos[:, :n_reg], sel, sel_depth], -1)
        # parents of this step's regular children
        par[:, at:at + n_reg * k] = sel.repeat_interleave(k, dim=1)
        prev_ok, prev_conf, prev_did, prev_score, prev_base = sel_ok, conf, did, node_score, base
        b0, b1 = at, nxt_at
    extra = (row_of, r_conf, r_top1, r_recon, r_lp) if analysis else None
    return _select(cfg.budget, G, tok, par, score, depth, lay.is_rec.expand(S, P + 1), extra)


def _select(B, G, tok, par, score, depth, is_rec, extra) -> DraftTree:
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
    # ancestors: a node's row is its parent's row plus itself; parents come first, depth by depth
    full_parent = torch.cat([torch.zeros(S, 1, dtype=torch.long, device=dev), parent], 1)  # [S, B+1]
    mask = torch.eye(B + 1, dtype=torch.bool, device=dev).expand(S, B + 1, B + 1).clone()
    mask[:, 1:, 0] = True
    anc = full_parent
    mask[:, 1:] |= F.one_hot(parent, B + 1).bool()
    for _ in range(G - 1):  # depth <= G + 1: the parent and G - 1 further hops reach depth 1
        anc = _take(full_parent, anc)
        mask[:, 1:] |= F.one_hot(anc[:, 1:], B + 1).bool()
    tree = DraftTree(_take(tok, idx), parent, _take(depth, idx), valid, mask, _take(is_rec, idx),
                     _take(score, idx))
    if extra is not None:
        row_of, r_conf, r_top1, r_recon, r_lp = extra
        tree.pool = PoolRecord(tok, par, depth, row_of, idx, r_lp, G + 1)
        rows = torch.cat([torch.zeros(S, 1, dtype=torch.long, device=dev), _take(row_of, idx)], 1)
        has_row = rows >= 0
        rows = rows.clamp(min=0)
        tree.conf = _take(r_conf, rows).masked_fill(~has_row, float("nan"))
        tree.top1 = _take(r_top1, rows).masked_fill(~has_row, -1)
        tree.recon = _take(r_recon, rows).masked_fill(~has_row, -1)
    return tree
