"""Held-out acceptance of a drafter on greedy target traces (no engine needed).

On a greedy trace every token is the target's argmax, so the unrolled steps of the training-time
test are exactly greedy chain drafting from each context position: step ``i`` of row ``j`` is accepted
when its argmax equals the target's at ``j+1+i`` and every earlier step was accepted. ``tau_chain``
is 1 + the mean accepted run over all start positions (tokens per target forward for a chain of
``n`` drafts); ``top1`` the step-0 agreement; ``recovered`` (PR) the share of the reconsidered rows
whose one-pass top-1 was wrong and whose reconsidered top-1 is right.
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
            match = logits.argmax(-1) == tl.argmax(-1)
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
                rec_ok += int((wrong & (rl.argmax(-1) == tl[b, r].argmax(-1))).sum())
    drafter.train(was)
    step_acc = [round(h / max(c, 1), 4) for h, c in zip(hits, counts, strict=True)]
    out = {"top1": step_acc[0], "step_acc": step_acc, "tau_chain": round(1 + run_sum / max(starts, 1), 4),
           "positions": starts}
    if self_query is not None:
        out["recovered"] = round(rec_ok / max(rec_n, 1), 4)
    return out
