"""Bad input is a ValueError that names the reason and leaves the engine exactly as it was."""

from __future__ import annotations

import math

import pytest
import torch
from engine_util import drain, make_engine

from gambit.engine import EngineConfig, EvictedEvent, FinishedEvent, SamplingParams

GOOD = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)


def _assert_pristine(eng) -> None:
    """No trace, no queued work, no block used, no id consumed; then a normal add runs normally."""
    assert eng.traces == {} and not eng.has_unfinished()
    assert not eng.scheduler.waiting and not eng.scheduler.running
    assert eng.blocks.num_free == eng.num_blocks and eng.kv_usage() == 0.0
    assert eng.stats.steps == 0 and eng.stats.forks == 0
    tid = eng.add("Compute 1+2.\nSolution:\n", GOOD)
    assert tid == 0, "a rejected add consumed a trace id"
    fin = [e for e in drain(eng) if isinstance(e, FinishedEvent)]
    assert [(e.trace_id, e.reason, len(e.output_ids)) for e in fin] == [(0, "length", 5)]
    ref = make_engine((eng.model, eng.tokenizer), num_blocks=64).generate(["Compute 1+2.\nSolution:\n"], GOOD)
    assert list(fin[0].output_ids) == ref[0]
    assert eng.blocks.num_free == eng.num_blocks


@pytest.fixture
def eng(tiny):
    return make_engine(tiny, block_size=4, num_blocks=64)


@pytest.mark.parametrize("prompt, match", [
    ("", "empty"),
    ([], "empty"),
    ((), "empty"),
    ([-1], r"token ids"),
    ([5, 3, 10**6], r"token ids"),
    ([3, 4.0], r"token ids"),
    (["a"], r"token ids"),
    ([3, None], r"token ids"),
], ids=["empty-str", "empty-list", "empty-tuple", "negative-id", "id-too-large", "float-id", "str-id",
        "none-id"])
def test_bad_prompts(eng, prompt, match):
    with pytest.raises(ValueError, match=match):
        eng.add(prompt, GOOD)
    _assert_pristine(eng)


def test_vocab_boundary_ids(eng):
    vocab = eng.model.config.vocab_size
    with pytest.raises(ValueError, match=str(vocab)):
        eng.add([3, vocab], GOOD)
    _assert_pristine(eng)
    tid = eng.add([3, vocab - 1], GOOD)  # the last id is fine
    assert tid == 1


def test_prompt_longer_than_context(tiny):
    eng = make_engine(tiny, block_size=8, num_blocks=64)
    ctx = eng.model.config.max_position_embeddings
    for n in (ctx, ctx + 1, 3 * ctx):
        with pytest.raises(ValueError, match="context"):
            eng.add([5] * n, GOOD)
        with pytest.raises(ValueError, match="context"):
            eng.add("x" * n, GOOD)
    _assert_pristine(eng)


def test_prompt_at_context_limit_stops_with_length(tiny):
    eng = make_engine(tiny, block_size=8, num_blocks=64)
    ctx = eng.model.config.max_position_embeddings
    tid = eng.add([5] * (ctx - 3), SamplingParams(max_tokens=100, ignore_eos=True))
    fin = [e for e in drain(eng) if isinstance(e, FinishedEvent)]
    assert [(e.trace_id, e.reason) for e in fin] == [(tid, "length")]
    assert len(fin[0].output_ids) == 3  # the context is full: ctx tokens in all
    assert eng.blocks.num_free == 64


def test_prompt_larger_than_kv_cache(tiny):
    eng = make_engine(tiny, block_size=4, num_blocks=8)  # 32 slots
    with pytest.raises(ValueError, match="KV blocks"):
        eng.add([5] * 32, GOOD)  # needs 33 slots with its first generated token
    _assert_pristine(eng)
    eng2 = make_engine(tiny, block_size=4, num_blocks=8)
    eng2.add([5] * 31, GOOD)  # fits


@pytest.mark.parametrize("kwargs, match", [
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": math.nan}, "temperature"),
    ({"temperature": math.inf}, "temperature"),
    ({"temperature": "1"}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.0001}, "top_p"),
    ({"top_p": -0.5}, "top_p"),
    ({"top_p": math.nan}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"top_k": 2.5}, "top_k"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": -3}, "max_tokens"),
    ({"max_tokens": 1.5}, "max_tokens"),
    ({"logprobs": 21}, "logprobs"),
    ({"logprobs": -1}, "logprobs"),
    ({"seed": -1}, "seed"),
    ({"seed": 1.5}, "seed"),
    ({"seed": "7"}, "seed"),
    ({"stop": ("",)}, "stop"),
    ({"stop": (3,)}, "stop"),
    # a wrong type names its field (these were bare TypeErrors, or passed)
    ({"top_p": "0.5"}, "^top_p must be a number"),
    ({"top_p": None}, "^top_p must be a number"),
    ({"stop": ""}, "^stop must hold non-empty strings"),
    ({"stop": 5}, "^stop must be a string or a list of strings, got int$"),
    ({"stop": b"ab"}, "^stop must be a string or a list of strings, got bytes$"),
    ({"stop": ["a", None]}, "^stop must hold non-empty strings"),
    ({"ignore_eos": "no"}, "^ignore_eos must be true or false"),
    ({"max_tokens": True}, "^max_tokens must be an integer"),
    ({"top_k": True}, "^top_k must be an integer"),
    ({"logprobs": True}, "^logprobs must be an integer"),
])
def test_invalid_sampling_params(eng, kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)
    _assert_pristine(eng)


def test_valid_sampling_edges():
    SamplingParams(temperature=0, top_p=1.0, top_k=0, max_tokens=1, logprobs=20, seed=0, stop=["\n\n"])
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b")
    assert SamplingParams(top_p=1).top_p == 1


def test_one_stop_string_is_one_stop_and_none_is_none():
    """As in OpenAI's API and vLLM: ``stop="boxed"`` was five one-letter stops; ``stop=None`` a TypeError."""
    assert SamplingParams(stop="boxed").stop == ("boxed",)
    assert SamplingParams(stop="\n\n").stop == ("\n\n",)
    assert SamplingParams(stop=None).stop == ()
    assert SamplingParams(stop=("a",)).stop == ("a",)


def test_params_must_be_sampling_params(eng):
    with pytest.raises(ValueError, match="SamplingParams"):
        eng.add("hi", {"temperature": 0.0})
    _assert_pristine(eng)


@pytest.mark.parametrize("priority", [math.nan, "high"])
def test_bad_priority(eng, priority):
    """A NaN priority would make the scheduler's ordering undefined; reject NaN and non-numbers."""
    with pytest.raises(ValueError, match="priority"):
        eng.add("hi", GOOD, priority=priority)
    _assert_pristine(eng)
    tid = eng.add("hi", GOOD)
    with pytest.raises(ValueError, match="priority"):
        eng.set_priority(tid, priority)
    assert eng.get(tid).priority == 0.0


def _finished_and_evicted(tiny):
    """An engine holding one finished, one aborted and one evicted trace id, plus one live trace."""
    eng = make_engine(tiny, block_size=4, num_blocks=6, preemption="evict")
    done = eng.add([5, 6, 7], SamplingParams(max_tokens=1, ignore_eos=True))
    aborted = eng.add([5, 6, 7], GOOD)
    eng.abort(aborted)
    low = eng.add([5] * 10, SamplingParams(max_tokens=30, ignore_eos=True), priority=-1)
    high = eng.add([6] * 10, SamplingParams(max_tokens=30, ignore_eos=True), priority=1)
    evicted = None
    for _ in range(40):
        for e in eng.step():
            if isinstance(e, EvictedEvent):
                evicted = e.trace_id
        if evicted is not None:
            break
    assert evicted == low
    assert high in eng.traces
    return eng, {"finished": done, "aborted": aborted, "evicted": evicted}, high


@pytest.mark.parametrize("op", ["fork", "abort", "set_priority", "get"])
def test_dead_or_unknown_ids(tiny, op):
    eng, dead, live = _finished_and_evicted(tiny)
    calls = {"fork": lambda i: eng.fork(i, 1), "abort": eng.abort,
             "set_priority": lambda i: eng.set_priority(i, 2), "get": eng.get}
    forks, aborts, n_traces = eng.stats.forks, eng.stats.aborts, len(eng.traces)
    used = eng.blocks.num_used
    for name, tid in [*dead.items(), ("unknown", 999), ("negative", -1), ("next", eng._next_id)]:
        with pytest.raises(ValueError, match=str(tid)):
            calls[op](tid)
        assert (eng.stats.forks, eng.stats.aborts, len(eng.traces)) == (forks, aborts, n_traces), name
        assert eng.blocks.num_used == used
    calls[op](live)  # the live one still works
    drain(eng)
    assert eng.blocks.num_free == eng.num_blocks


@pytest.mark.parametrize("kwargs, match", [
    ({"n": 0}, "n must"),
    ({"n": -2}, "n must"),
    ({"n": 2, "seeds": [1]}, "seeds"),
    ({"n": 1, "seeds": [1, 2]}, "seeds"),
    ({"n": 2, "temperatures": [0.5]}, "temperatures"),
    ({"n": 2, "seeds": [1, -1]}, "seed"),
    ({"n": 2, "temperatures": [0.5, -1.0]}, "temperature"),
    ({"n": 1, "temperatures": [math.nan]}, "temperature"),
])
def test_bad_fork_arguments_change_nothing(tiny, kwargs, match):
    eng = make_engine(tiny, block_size=4, num_blocks=64)
    tid = eng.add([5, 6, 7, 8, 9, 10], SamplingParams(max_tokens=10, ignore_eos=True))
    for _ in range(3):
        eng.step()
    used, next_id = eng.blocks.num_used, eng._next_id
    refcount = list(eng.blocks.refcount)
    with pytest.raises(ValueError, match=match):
        eng.fork(tid, **kwargs)
    assert list(eng.traces) == [tid] and eng.stats.forks == 0
    assert eng.blocks.num_used == used and eng.blocks.refcount == refcount
    assert eng._next_id == next_id
    eng.blocks.check(list(eng.traces.values()))
    assert len(eng.fork(tid, 2)) == 2  # a good fork still works


@pytest.mark.parametrize("kwargs, match", [
    ({"block_size": 0}, "block_size"),
    ({"block_size": -4}, "block_size"),
    ({"block_size": 3}, "block_size"),
    ({"block_size": 12}, "block_size"),
    ({"kv_fraction": 0.0}, "kv_fraction"),
    ({"kv_fraction": 1.5}, "kv_fraction"),
    ({"kv_fraction": -0.1}, "kv_fraction"),
    ({"num_blocks": 0}, "num_blocks"),
    ({"num_blocks": -5}, "num_blocks"),
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
    ({"max_num_batched_tokens": -1}, "max_num_batched_tokens"),
    ({"preemption": "swap"}, "preemption"),
    ({"preemption": ""}, "preemption"),
    # a wrong type names its field (these were TypeErrors in BlockManager or passed to Engine creation)
    ({"num_blocks": 2.5}, "^num_blocks must be a positive integer"),
    ({"num_blocks": "8"}, "^num_blocks must be a positive integer"),
    ({"kv_memory_bytes": -5}, "^kv_memory_bytes must be a positive integer"),
    ({"kv_memory_bytes": 0}, "^kv_memory_bytes must be a positive integer"),
    ({"kv_memory_bytes": 1.5e9}, "^kv_memory_bytes must be a positive integer"),
    ({"block_size": 16.0}, "^block_size must be a positive power of two"),
    ({"block_size": "16"}, "^block_size must be a positive power of two"),
    ({"kv_fraction": "0.5"}, "^kv_fraction must be a number"),
    ({"max_num_seqs": 2.5}, "^max_num_seqs must be an integer"),
    ({"max_num_batched_tokens": "8"}, "^max_num_batched_tokens must be an integer"),
    ({"seed": "1"}, "^seed must be an integer"),
    ({"cpu_kernel": "yes"}, "^cpu_kernel must be true or false"),
    ({"eagle_taps": 1}, "^eagle_taps must be true or false"),
    ({"device": "gpu"}, "^device must be auto, cpu, cuda or cuda:N, got 'gpu'$"),
    ({"device": None}, "^device must be auto, cpu, cuda or cuda:N"),
])
def test_engine_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(**kwargs)


def test_engine_config_good_values_and_dtype():
    cfg = EngineConfig(block_size=1, num_blocks=1, kv_fraction=1.0, preemption="evict", device="cpu")
    assert cfg.torch_dtype().is_floating_point
    with pytest.raises(ValueError, match="dtype"):
        EngineConfig(dtype="int3", device="cpu").torch_dtype()


def _gpus(monkeypatch, n: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:1"])
def test_cuda_without_a_gpu_is_one_error_at_config_time(device, monkeypatch):
    """It was an AssertionError from torch.cuda._lazy_init, 11 frames into Engine creation."""
    _gpus(monkeypatch, 0)
    with pytest.raises(ValueError, match=rf"^device='{device}' but .*; use 'cpu' or 'auto'$"):
        EngineConfig(device=device)
    assert EngineConfig(device="auto").device == "auto" and EngineConfig(device="cpu").device == "cpu"


def test_cuda_n_must_be_a_device_this_host_has(monkeypatch):
    _gpus(monkeypatch, 2)
    assert EngineConfig(device="cuda").device == "cuda" and EngineConfig(device="cuda:1").device == "cuda:1"
    with pytest.raises(ValueError, match=r"^device='cuda:2' but this host has 2 CUDA devices"):
        EngineConfig(device="cuda:2")


def test_kv_budget_too_small(tiny):
    with pytest.raises(ValueError, match="KV budget"):
        make_engine(tiny, kv_memory_bytes=16)
    eng = make_engine(tiny, block_size=4, kv_memory_bytes=1 << 20, kv_fraction=0.5)
    assert eng.num_blocks >= 1 and eng.blocks.num_blocks == eng.num_blocks
