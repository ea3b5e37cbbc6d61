"""The training-time test's masks equal explicit chain drafting (and reconsideration) from each row."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "speculative"))
from spec_util import tiny_target  # noqa: E402

from gambit.model.llama import causal_attention  # noqa: E402
from gambit.speculative.drafter import random_drafter  # noqa: E402
from gambit.train.ttt import TTTAttention, unroll  # noqa: E402


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    target, tok = tiny_target(seed=1)
    drafter = random_drafter(target, seed=2, std=0.1)
    B, T = 2, 9
    H = target.config.hidden_size
    batch = {"ids": torch.randint(3, 90, (B, T)), "taps": torch.randn(B, T, 3 * H),
             "logits": torch.randn(B, T, target.config.vocab_size),
             "length": torch.tensor([T, T - 2]), "prompt_len": torch.tensor([2, 3])}
    return drafter, batch, tok.pad_id


def chain(drafter, batch, b, j, i, reconsider=False):
    """Logits of depth-i chain drafting from context row j, by causal attention over explicit rows."""
    ids, feat0 = batch["ids"][b], drafter.fuse(batch["taps"][b])
    tok = [int(ids[r + 1]) for r in range(j + 1)]
    feats = [feat0[r] for r in range(j + 1)]
    pos = list(range(j + 1))
    sq = [False] * (j + 1)
    for k in range(i + 1 + int(reconsider)):
        x = torch.tensor(tok)[None]
        logits, nxt = drafter(x, torch.stack(feats)[None], torch.tensor(pos)[None],
                              attention=causal_attention, self_query=torch.tensor(sq)[None])
        if k == i + int(reconsider):
            return logits[0, -1]
        if k < i:  # next chain row
            tok.append(int(ids[j + 2 + k]))
            feats.append(nxt[0, -1])
            pos.append(j + 1 + k)
            sq.append(False)
        else:  # the reconsider row: same token and position, its row's own output feature
            tok.append(tok[-1])
            feats.append(nxt[0, -1])
            pos.append(pos[-1])
            sq.append(True)


@torch.no_grad()
def test_unrolled_steps_match_chain_drafting(setup):
    drafter, batch, pad = setup
    steps = list(unroll(drafter, batch, 3, pad))
    for i, logits, _, _, _ in steps:
        for b, j in [(0, 0), (0, 3), (1, 2), (1, 8 - 3 - i)]:
            torch.testing.assert_close(logits[b, j], chain(drafter, batch, b, j, i), atol=1e-5, rtol=1e-4)


@torch.no_grad()
def test_reconsider_rows_see_their_rows_view_and_stay_invisible(setup):
    drafter, batch, pad = setup
    rows = (torch.tensor([0, 1, 0]), torch.tensor([4, 1, 0]))
    plain = [s[1] for s in unroll(drafter, batch, 3, pad)]
    got = list(unroll(drafter, batch, 3, pad, reconsider=lambda i, lg, v: (*rows, True)))
    for i, logits, _, _, (b, r, rl) in got:
        torch.testing.assert_close(logits, plain[i])  # regular rows never see reconsider rows
        for n in range(b.numel()):
            ref = chain(drafter, batch, int(b[n]), int(r[n]), i, reconsider=True)
            torch.testing.assert_close(rl[n], ref, atol=1e-5, rtol=1e-4)


def test_step0_is_causal_attention():
    q, k, v = (torch.randn(2, 5, 4, 8) for _ in range(3))
    torch.testing.assert_close(TTTAttention()(0, q, k, v), causal_attention(0, q, k, v), atol=1e-5, rtol=1e-5)
