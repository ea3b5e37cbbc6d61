"""``min_macs_per_thread``: a CPU step's forward gets rows x weights / min threads, between 1 and torch's
setting, and the tokens do not depend on it."""

from __future__ import annotations

import pytest
import torch
from engine_util import make_engine

from gambit.cpu_info import MIN_MACS_PER_THREAD, default_min_macs_per_thread
from gambit.engine import EngineConfig, FinishedEvent, SamplingParams
from gambit.engine.step_threads import StepThreads, macs_per_row
from gambit.model.config import ModelConfig


@pytest.fixture
def two_threads():
    n = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(n)


def test_policy_counts_and_follows_the_callers_setting(two_threads):
    p = StepThreads(1_000_000, 6_000_000)
    assert [p.apply(r) for r in (1, 5, 6, 11)] == [1, 1, 1, 1]
    assert torch.get_num_threads() == 1
    assert p.apply(12) == 2 and p.apply(500) == 2 and p.full == 2  # never above the setting
    assert p.apply(None) == 2  # a step that must run on all of them (trees)
    p.apply(3)
    torch.set_num_threads(3)  # the caller raises its setting while the policy had lowered it
    assert p.apply(18) == 3 and p.full == 3
    assert StepThreads(1, 0).apply(1) == 3 and StepThreads(1, 6, enabled=False).apply(1) == 3


def test_a_second_policy_on_the_thread_keeps_the_callers_setting(two_threads):
    first, second = StepThreads(1_000_000, 6_000_000), StepThreads(1_000_000, 6_000_000)
    assert first.apply(1) == 1  # the first engine's last step was small: one thread is set
    assert second.apply(500) == 2 and second.full == 2  # a new engine's big step still gets both
    assert first.apply(3) == 1 and second.apply(500) == 2 and first.apply(500) == 2
    torch.set_num_threads(1)  # the caller lowers its setting: every policy follows
    assert second.apply(500) == 1 and first.apply(500) == 1


def test_a_new_engine_after_a_small_run_steps_on_every_thread(target, two_threads):
    """The engine benchmark's shape: batch 1 on one engine, then a big batch on a fresh one."""
    _, small = _decode(target, MIN_MACS_PER_THREAD, 4)
    assert small[-1] == 1
    _, big = _decode(target, MIN_MACS_PER_THREAD, 16)
    assert big[-1] == 2  # it failed when each engine kept its own record: 1, the first one's last


def test_work_per_row_and_the_default_split():
    tiny = ModelConfig(vocab_size=100, hidden_size=192, intermediate_size=512, num_hidden_layers=6,
                       num_attention_heads=4, head_dim=48)
    smol = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                       num_attention_heads=9, num_key_value_heads=3)
    assert macs_per_row(tiny) == 6 * (4 * 192 * 192 + 3 * 192 * 512) + 100 * 192
    assert macs_per_row(smol) == 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536) + 49152 * 576
    default = MIN_MACS_PER_THREAD  # AMD's (and any vendor not measured otherwise)
    tiny_p, smol_p = StepThreads(macs_per_row(tiny), default), StepThreads(macs_per_row(smol), default)
    assert [tiny_p.count(r, 2) for r in (1, 8, 11, 12, 96)] == [1, 1, 1, 2, 2]
    assert smol_p.count(1, 2) == 2  # a real checkpoint's single row is worth both threads


def test_min_macs_per_thread_is_validated():
    with pytest.raises(ValueError, match="min_macs_per_thread"):
        EngineConfig(min_macs_per_thread=-1)


def _decode(target, macs: int, batch: int) -> tuple[list[list[int]], list[int]]:
    engine = make_engine(target, min_macs_per_thread=macs)
    ids = [engine.add("Compute 12*3+4.\nSolution:\n", SamplingParams(temperature=0.0 if i % 2 else 1.0,
                                                                    seed=i, max_tokens=24, ignore_eos=True))
           for i in range(batch)]
    counts, out = [], {}
    while engine.has_unfinished():
        out.update((e.trace_id, e.output_ids) for e in engine.step() if isinstance(e, FinishedEvent))
        counts.append(torch.get_num_threads())
    return [out[i] for i in ids], counts


@pytest.mark.parametrize("batch", [4, 16])
def test_engine_steps_on_fewer_threads_with_the_same_tokens(target, two_threads, batch):
    fixed, fixed_counts = _decode(target, 0, batch)
    policy, counts = _decode(target, MIN_MACS_PER_THREAD, batch)
    assert set(fixed_counts) == {2}
    # decode steps of 4 rows run on one thread; of 16, on both (the prompt's prefill: rows = its tokens)
    assert counts[-1] == (1 if batch == 4 else 2)
    assert policy == fixed  # greedy and seeded sampling alike


def test_the_default_follows_the_vendor_measurement():
    """Two threads won at every batch on an Intel Xeon (one lost 1.14-1.41x), one was a wash at 1-8 rows
    on AMD EPYCs: the default floor is per vendor, and an explicit one still wins."""
    assert EngineConfig().min_macs_per_thread == default_min_macs_per_thread()
    intel = StepThreads(2_673_408, default_min_macs_per_thread("GenuineIntel"))
    amd = StepThreads(2_673_408, default_min_macs_per_thread("AuthenticAMD"))
    assert [intel.count(r, 2) for r in (1, 8)] == [2, 2] and [amd.count(r, 2) for r in (1, 8)] == [1, 1]
    assert EngineConfig(min_macs_per_thread=5).min_macs_per_thread == 5
