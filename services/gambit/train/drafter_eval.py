"""Held-out acceptance of a drafter on greedy target traces (no engine needed).

On a greedy trace every token is the target's argmax, so the unrolled steps of the training-time
test are exactly greedy chain drafting from each context position: step ``i`` of row ``j`` is accepted
when its argmax equals the target's at ``j+1+i`` and every earlier step was accepted. ``tau_chain``
is 1 + the mean accepted run over all start positions (tokens per target forward for a chain of
``n`` drafts); ``top1`` the step-0 agreement; ``recovered`` (PR) the share of the reconsidered rows
whose one-pass top-1 was wrong and whose reconsidered top-1 is right.

With a reduced draft vocabulary the recorded logits cover the draft ids only, so their argmax is the
best draft id, not the target's token where that lies outside: there a draft is right when it is the
token the greedy trace holds (no draft id can be, so it counts as a miss, as at serving time).
"""

from __future__ import annotations

import torch

from gambit.speculative.drafter import Drafter
from gambit.train.drafter_data import TraceSet
from gambit.train.ttt import unroll


@torch.no_grad()
def heldout_acceptance(drafter: Drafter, data: TraceSet, pad_id: int, n_steps: int, frac: float,
                       self_query: bool | None, batch_size: int = 32) -> dict:
    """{"top1", "step_acc" (per unrolled step), "tau_chain", "recovered" (PR only), "positions"}."""
    was = drafter.training
    drafter.eval()
    hits = [0] * n_steps
    counts = [0] * n_steps
    run_sum, starts, rec_ok, rec_n = 0, 0, 0, 0

    def select(i, logits, valid):
        conf = logits.softmax(-1).amax(-1).masked_fill(~valid, float("inf"))
        n = int(int(valid.sum()) * frac)
        if n < 1:
            return None
        low = conf.flatten().topk(n, largest=False).indices
        return low // conf.shape[1], low % conf.shape[1], bool(self_query)

    for s in range(0, len(data), batch_size):
        batch = data.batch(list(range(s, min(len(data), s + batch_size))), pad_id)
        alive = None
        for i, logits, tl, valid, recon in unroll(drafter, batch, n_steps, pad_id,
                                                  select if self_query is not None else None):
            emitted = _emitted(batch["ids"], i) if data.draft_ids is not None else None
            right = _right(tl, emitted, data.draft_ids)
            match = right(logits, ...)
            hits[i] += int((match & valid).sum())
            counts[i] += int(valid.sum())
            if alive is None:
                alive = valid.clone()
                starts += int(valid.sum())
            alive &= match & valid
            run_sum += int(alive.sum())
            if recon is not None:
                b, r, rl = recon
                wrong = ~match[b, r]
                rec_n += int(wrong.sum())
                rec_ok += int((wrong & right(rl, (b, r))).sum())
    drafter.train(was)
    step_acc = [round(h / max(c, 1), 4) for h, c in zip(hits, counts, strict=True)]
    out = {"top1": step_acc[0], "step_acc": step_acc, "tau_chain": round(1 + run_sum / max(starts, 1), 4),
           "positions": starts}
    if self_query is not None:
        out["recovered"] = round(rec_ok / max(rec_n, 1), 4)
    return out


def _emitted(ids: torch.Tensor, i: int) -> torch.Tensor:
    """[B, R] the trace's token that row ``j`` of unrolled step ``i`` predicts (``x[j+2+i]``; -1 past
    the end, where no row is valid)."""
    B, T = ids.shape
    out = torch.full((B, T - 1), -1, dtype=torch.long)
    n = max(0, min(T - 1, T - 2 - i))
    out[:, :n] = ids[:, 2 + i:2 + i + n]
    return out


def _right(tl: torch.Tensor, emitted: torch.Tensor | None, draft_ids: torch.Tensor | None):
    """``right(logits, rows)``: whether each draft's top-1 is the target's greedy token at ``rows`` (an
    index into [B, R]): the target logits' argmax over the whole vocabulary, the trace's token over a
    reduced one."""
    def right(logits: torch.Tensor, rows) -> torch.Tensor:
        if draft_ids is None:
            return logits.argmax(-1) == tl[rows].argmax(-1)
        return draft_ids[logits.argmax(-1)] == emitted[rows]
    return right
