"""Training-time test (EAGLE-3): the drafter unrolled over its own features, with the serving masks.

Row ``j`` of step 0 reads the fused target feature of position ``j`` and token ``x[j+1]`` at position
``j`` and predicts ``x[j+2]``; row ``j`` of step ``i`` reads the feature row ``j`` produced at step
``i-1`` (standing in for the target's feature at ``j+i``), token ``x[j+1+i]`` at position ``j+i`` and
predicts ``x[j+2+i]``. Its query sees the step-0 keys of rows ``<= j`` (context the target wrote) and
only the diagonal of the later steps (its own drafted ancestors), exactly what a draft node at depth
``i`` sees when drafting from context position ``j``.

A reconsideration pass (PR) re-runs the block on the output feature of row ``(i, j)`` at the same
token and position; its query sees what row ``(i, j)`` saw plus its own key, and nobody sees it —
the tree drafter's reconsider-row mask.
"""

from __future__ import annotations

import math

import torch

from gambit.speculative.drafter import Drafter


def _expand_kv(k: torch.Tensor, n_heads: int) -> torch.Tensor:
    return k if k.shape[-2] == n_heads else k.repeat_interleave(n_heads // k.shape[-2], dim=-2)


class TTTAttention:
    """Mask-based attention for the unrolled steps; keeps each step's keys and values per layer."""

    def __init__(self) -> None:
        self.kv: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.rows: tuple[torch.Tensor, torch.Tensor] | None = None  # (batch idx, row idx): reconsider mode

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.rows is not None:
            return self._reconsider(layer, q, k, v)
        steps = self.kv.setdefault(layer, [])
        steps.append((k, v))
        H, D = q.shape[-2], q.shape[-1]
        scale = 1.0 / math.sqrt(D)
        k0, v0 = (_expand_kv(t, H) for t in steps[0])
        T = q.shape[1]
        s0 = torch.einsum("bthd,bshd->bhts", q, k0) * scale  # [B, H, T, T]
        causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        s0 = s0.masked_fill(~causal, float("-inf"))
        diag_k = [_expand_kv(kk, H) for kk, _ in steps[1:]]
        diag_v = [_expand_kv(vv, H) for _, vv in steps[1:]]
        if not diag_k:
            return torch.einsum("bhts,bshd->bthd", s0.softmax(-1), v0)
        sd = torch.stack([(q * kk).sum(-1) for kk in diag_k], dim=-1) * scale  # [B, T, H, i]
        p = torch.cat([s0, sd.permute(0, 2, 1, 3)], dim=-1).softmax(-1)
        out = torch.einsum("bhts,bshd->bthd", p[..., :T], v0)
        pd = p[..., T:].permute(0, 2, 1, 3)  # [B, T, H, i]
        return out + (pd.unsqueeze(-1) * torch.stack(diag_v, dim=-2)).sum(-2)

    def _reconsider(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q/k/v [M, 1, H, D]: reconsider rows (b, j) of the latest step; keys of row (i, j)'s view."""
        b, j = self.rows
        steps = self.kv[layer]
        H, D = q.shape[-2], q.shape[-1]
        scale = 1.0 / math.sqrt(D)
        q1 = q[:, 0]  # [M, H, D]
        k0, v0 = (_expand_kv(t, H) for t in steps[0])  # [B, T, H, D]
        T, m = k0.shape[1], torch.arange(b.numel(), device=q.device)
        # scores against every sequence's step-0 keys, then each row's own sequence: cheaper than
        # gathering [M, T, H, D] copies of the keys
        s0 = torch.einsum("mhd,bthd->mbht", q1, k0)[m, b] * scale  # [M, H, T]
        s0 = s0.masked_fill(torch.arange(T, device=q.device)[None, None, :] > j[:, None, None], float("-inf"))
        keys = [_expand_kv(kk, H)[b, j] for kk, _ in steps[1:]] + [_expand_kv(k, H)[:, 0]]
        vals = [_expand_kv(vv, H)[b, j] for _, vv in steps[1:]] + [_expand_kv(v, H)[:, 0]]
        sd = torch.stack([(q1 * kk).sum(-1) for kk in keys], dim=-1) * scale  # [M, H, n]
        p = torch.cat([s0, sd], dim=-1).softmax(-1)
        out = torch.einsum("mht,bthd->mbhd", p[..., :T], v0)[m, b]
        out = out + (p[..., T:].unsqueeze(-1) * torch.stack(vals, dim=-2)).sum(-2)
        return out[:, None]


def soft_ce(target_logits: torch.Tensor, draft_logits: torch.Tensor) -> torch.Tensor:
    """−Σ_v p(v) log q(v) per row (p = softmax of the target's logits)."""
    return -(target_logits.softmax(-1) * draft_logits.log_softmax(-1)).sum(-1)


def fresh_ce(target_logits: torch.Tensor, draft_logits: torch.Tensor, first_logits: torch.Tensor,
             k: int) -> torch.Tensor:
    """−Σ_{v ∉ O} p(v) log q̃(v) per row: O the top-k of ``first_logits`` (the tokens the node already
    offers), q̃ the draft distribution renormalised over the rest (what reconsideration picks from)."""
    top = first_logits.topk(k, -1).indices
    offered = torch.zeros_like(draft_logits, dtype=torch.bool).scatter_(-1, top, True)
    logq = draft_logits.masked_fill(offered, float("-inf")).log_softmax(-1)
    p = target_logits.softmax(-1).masked_fill(offered, 0.0)
    return -(p * logq.masked_fill(offered, 0.0)).sum(-1)


def topk_ce(target_logits: torch.Tensor, draft_logits: torch.Tensor, k: int) -> torch.Tensor:
    """HASS's top-k distillation: −Σ_{v ∈ top-k(p)} p(v) log q(v) per row."""
    p = target_logits.softmax(-1)
    top = p.topk(k, dim=-1)
    return -(top.values * draft_logits.log_softmax(-1).gather(-1, top.indices)).sum(-1)


def unroll(drafter: Drafter, batch: dict[str, torch.Tensor], n_steps: int, pad_id: int, reconsider=None):
    """Run ``n_steps`` unrolled steps; yields per step ``(i, logits, target_logits, valid, recon)``.

    ``valid`` [B, R] marks rows whose target position ``j+1+i`` lies in the generated part
    (``prompt_len <= t <= length-2``: the drafter drafts after the target's first emitted token, and
    the distribution after the final token is not a prediction). ``reconsider(i, logits, valid)``
    returns (batch idx, row idx, self_query) rows to reconsider after step ``i`` (or None); their
    logits come back as ``recon`` = (b, j, logits) else None.
    """
    ids, length, plen = batch["ids"], batch["length"], batch["prompt_len"]
    B, T = ids.shape
    R = T - 1  # rows 0..T-2
    feature = drafter.fuse(batch["taps"][:, :R])
    attn = TTTAttention()
    j = torch.arange(R)
    for i in range(n_steps):
        tok = torch.full((B, R), pad_id, dtype=torch.long)
        n = max(0, min(R, T - 1 - i))
        tok[:, :n] = ids[:, 1 + i:1 + i + n]
        pos = (j + i).expand(B, R)
        attn.rows = None
        logits, nxt = drafter(tok, feature, pos, attention=attn)
        t = j + 1 + i
        valid = (t[None] >= plen[:, None]) & (t[None] <= length[:, None] - 2)
        tl = torch.zeros(B, R, batch["logits"].shape[-1])
        tl[:, :n] = batch["logits"][:, 1 + i:1 + i + n]
        recon = None
        if reconsider is not None:
            sel = reconsider(i, logits, valid)
            if sel is not None:
                b, r, sq = sel
                attn.rows = (b, r)
                rl, _ = drafter(tok[b, r][:, None], nxt[b, r][:, None], pos[b, r][:, None], attention=attn,
                                self_query=torch.full((b.numel(), 1), sq))
                attn.rows = None
                recon = (b, r, rl[:, 0])
        yield i, logits, tl, valid, recon
        feature = nxt
