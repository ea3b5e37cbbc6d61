"""A forked child whose drafter has rows left to read below its fork point writes them into the full
blocks it shares with its parent (its context pass). That is not copy-on-write, and it need not be: the
rows are a function of the same tokens, features and positions, so the parent's already-read rows are
rewritten with the same floats (checked bit for bit, with the child drafting after its parent)."""

from __future__ import annotations

import pytest
import torch

from gambit.engine import Engine, EngineConfig, SamplingParams
from gambit.engine.config import SpecConfig
from gambit.speculative import random_drafter

B = 4


@pytest.mark.parametrize("cpu_kernel", [False, True])
def test_a_childs_context_pass_leaves_the_shared_drafter_rows_as_they_were(tiny, cpu_kernel):
    model, tok = tiny
    eng = Engine(model, tok, EngineConfig(
        device="cpu", dtype="float32", num_blocks=64, block_size=4, max_num_batched_tokens=2 + B,
        cpu_kernel=cpu_kernel, cpu_linear="transposed" if cpu_kernel else "plain",
        spec=SpecConfig(gamma=2, budget=B, grow_width=1, offer_width=2, reconsider=1, max_batch=0)))
    eng.register_drafter("pr", random_drafter(eng.model, seed=3, method="pr"))
    cache = eng.speculator().caches["pr"]
    pid = eng.add(list(range(3, 12)), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True,
                                                     decoding="pr"))
    eng.step(), eng.step()  # the prompt in two chunks (6 + 3 rows); no draft yet
    (cid,) = eng.fork(pid, 1)
    parent, child = eng.get(pid), eng.get(cid)
    shared = torch.tensor(parent.block_table[:parent.num_cached // 4])
    assert len(shared) == 2 and child.block_table[:2] == shared.tolist()
    eng.step()  # one tree fits the step: the parent's (first in rank), its context pass rows 0..8
    assert parent.draft.drafter_len == 9 and (child.draft is None or child.draft.drafter_len == 0)
    before = cache.k[0][:, shared].clone(), cache.v[0][:, shared].clone()
    eng.set_priority(cid, 10.0)
    eng.step()  # now the child's tree: its context pass rewrites rows 0..9, 0..7 in the shared blocks
    assert child.draft.drafter_len == 10 and parent.draft.drafter_len == 9
    assert torch.equal(cache.k[0][:, shared], before[0]) and torch.equal(cache.v[0][:, shared], before[1])
