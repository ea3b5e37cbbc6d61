"""Decode steps over static buffers (``EngineConfig.decode_graphs``): what CUDA graphs replay.

On the CPU the "static" mode runs the captured step's arithmetic eagerly: padded batch and block
buckets, the sink block padded rows write to, one metadata copy. Its outputs must equal the engine's
own torch path (what CUDA runs eagerly), under memory pressure too."""

from __future__ import annotations

import pytest
import torch

from gambit.engine import Engine, EngineConfig, SamplingParams
from gambit.engine.decode_graphs import bucket
from gambit.tasks.arithmetic import TaskConfig, generate


def _engine(target, mode: str, **kw) -> Engine:
    model, tok = target
    kw.setdefault("num_blocks", 256)
    return Engine(model, tok, EngineConfig(device="cpu", dtype="float32", cpu_kernel=False,
                                           decode_graphs=mode, **kw))


def _prompts(tok, n: int) -> list[list[int]]:
    return [tok.encode(p.prompt) for p in generate("test", n, 5, TaskConfig(2, 8))]


@pytest.mark.parametrize("n", [1, 3, 5])  # batch buckets 1, 4 (one padded row), 8 (three)
def test_static_decode_equals_the_eager_path(target, n):
    _, tok = target
    prompts = _prompts(tok, n)
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    eager = _engine(target, "off").generate(prompts, params)
    eng = _engine(target, "static")
    assert eng.generate(prompts, params) == eager
    graphs = eng.runner.graphs
    assert graphs.replays >= 47  # every decode step after the prefill took the static path
    assert {b for b, _ in graphs.steps} == {bucket(n, 256)}
    assert len({nb for _, nb in graphs.steps}) >= 2  # the block bucket grew with the context
    assert eng.blocks.num_free == eng.num_blocks  # every block back; the sink was never the manager's
    assert eng.runner.cache.k.shape[2] == eng.num_blocks + 1 and graphs.sink == eng.num_blocks


def test_static_decode_sampled_and_under_preemption(target):
    """Temperature 0.8 with per-trace seeds and a cache small enough to preempt: the same tokens."""
    _, tok = target
    prompts = _prompts(tok, 6)
    params = [SamplingParams(temperature=0.8, max_tokens=64, seed=i, ignore_eos=True) for i in range(6)]
    runs = {}
    for mode in ("off", "static"):
        eng = _engine(target, mode, num_blocks=24)
        runs[mode] = eng.generate(prompts, params)
        runs[mode + " preemptions"] = eng.stats.preemptions
    assert runs["static preemptions"] > 0
    assert runs["static"] == runs["off"]


def test_static_decode_logits_match_eager(target):
    """The step's logits and hidden states themselves, not only the argmax."""
    model, tok = target
    prompts = _prompts(tok, 3)
    outs = {}
    for mode in ("off", "static"):
        eng = _engine(target, mode)
        for p in prompts:
            eng.add(p, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        eng.step()  # the prefill
        captured = []
        forward = eng.runner.forward

        def spy(items, rows, taps, forward=forward, captured=captured):
            out = forward(items, rows, taps)
            captured.append((out.logits.clone(), out.hidden.clone(), out.slots.clone()))
            return out

        eng.runner.forward = spy
        eng.step()
        outs[mode] = captured[0]
    for a, b in zip(outs["off"], outs["static"], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_static_decode_with_forks_aborts_and_priorities(target):
    """What a search does to the engine between decode steps: fork children that share the parent's
    blocks (a partial last block copied), abort some, reprioritise, under a cache that evicts."""
    _, tok = target
    prompts = _prompts(tok, 3)
    runs = {}
    for mode in ("off", "static"):
        eng = _engine(target, mode, num_blocks=24, preemption="evict")
        ids = [eng.add(p, SamplingParams(temperature=0.8, max_tokens=72, seed=i, ignore_eos=True))
               for i, p in enumerate(prompts)]
        out: dict[int, list[int]] = {}
        for step in range(400):
            if not eng.has_unfinished():
                break
            for ev in eng.step():
                if hasattr(ev, "token_id"):
                    out.setdefault(ev.trace_id, []).append(ev.token_id)
            live = [i for i in ids if i in eng.traces and not eng.traces[i].is_done]
            if step in (10, 25) and live:
                ids += eng.fork(live[0], 2, seeds=[100 + step, 200 + step])
            if step == 30 and len(live) > 2:
                eng.abort(live[-1])
                eng.set_priority(live[1], 3.0)
        runs[mode] = (out, eng.stats.forks, eng.stats.evictions, eng.blocks.num_used)
    assert runs["static"][0] == runs["off"][0] and len(runs["off"][0]) >= 5
    assert runs["static"][1:] == runs["off"][1:] and runs["off"][1] == 4
    assert runs["off"][2] > 0 and runs["off"][3] == 0  # evictions happened; every block came back


def test_decode_graphs_config_is_checked(target):
    with pytest.raises(ValueError, match="decode_graphs"):
        EngineConfig(decode_graphs="graphs")
    with pytest.raises(ValueError, match="graph_max_batch"):
        EngineConfig(graph_max_batch=0)
    with pytest.raises(ValueError, match="CUDA"):
        _engine(target, "cuda")


def test_batches_over_the_cap_take_the_eager_path(target):
    _, tok = target
    eng = _engine(target, "static", graph_max_batch=2)
    out = eng.generate(_prompts(tok, 3), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert eng.runner.graphs.replays == 0 and len(out) == 3


def test_bucket():
    assert [bucket(n, 256) for n in (1, 2, 3, 5, 8, 9, 200, 256)] == [1, 2, 4, 8, 8, 16, 256, 256]
    assert bucket(300, 300) == 300  # capped: the largest bucket is the cap itself


def test_static_decode_over_a_bfloat16_cache_equals_the_eager_path(target):
    """``kv_dtype="bfloat16"`` on the static path (what CUDA graphs replay): keys and values rounded as
    written, the gathered blocks cast to the queries' dtype; the eager torch path's tokens."""
    _, tok = target
    prompts = _prompts(tok, 3)
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    eager = _engine(target, "off", kv_dtype="bfloat16")
    eng = _engine(target, "static", kv_dtype="bfloat16")
    assert eng.runner.cache.k.dtype == eager.runner.cache.k.dtype == torch.bfloat16
    assert eng.generate(prompts, params) == eager.generate(prompts, params)
    assert eng.runner.graphs.replays >= 31
