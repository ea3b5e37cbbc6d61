"""The API's promise (``SolveRequest.seed``): the same request and seed give the same traces, whatever
other runs share the engine's batches and the scorer's calls. Batch-invariant arithmetic in the engine
(``EngineConfig.batch_invariant``) and in the scorer (``scoring/invariant.py``) makes that exact: the
same tokens, scores, tree and answer to the bit."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gambit.scoring.spec import load_scorer_spec
from gambit.search.config import SearchConfig
from gambit.search.driver import SearchDriver
from gambit.tasks.arithmetic import TaskConfig, generate


def _solve(engine, scorer, others: int, **cfg) -> tuple[dict, dict]:
    problems = generate("test", 1 + others, 3, TaskConfig(6, 8))
    drv = SearchDriver(engine, scorer)
    drv.submit(problems[0], SearchConfig(seed=5, **cfg), run_id="p")
    for i in range(1, others + 1):  # other problems and seeds: the step's boundaries score together
        drv.submit(problems[i], SearchConfig(seed=i, **cfg), run_id=f"o{i}")
    res = drv.run_until_done()["p"]
    out = {k: v for k, v in dataclasses.asdict(res).items() if k not in ("wall_s", "timings")}
    nodes = drv.store.load("p")["nodes"]  # engine ids depend on the other runs' traces
    return out, {k: {f: v for f, v in n.items() if f != "engine_id"} for k, n in nodes.items()}


@pytest.fixture
def two_threads():
    """Two threads split the scorer's and the engine's products by batch size (the fixture of
    conftest.py restores the count)."""
    torch.set_num_threads(2)


def test_a_seeded_run_is_the_same_alone_and_beside_other_runs(make_engine, two_threads):
    cfg = dict(capacity=8, swap=2, max_tokens=200)
    alone = _solve(make_engine(batch_invariant=True), load_scorer_spec("process", 192), 0, **cfg)
    crowd = _solve(make_engine(batch_invariant=True), load_scorer_spec("process", 192), 5, **cfg)
    assert alone[0]["branched"] > 0 and alone[0]["pruned"] > 0  # the tournament acted on the scores
    assert crowd[0] == alone[0]  # answer, votes, every trace's parent, state, tokens and score
    assert crowd[1] == alone[1]  # the tree view: every node's tokens, scores and fate


def test_on_the_real_checkpoint_too(smollm2_folder, two_threads):
    """SmolLM2-135M with bfloat16 weights and KV and a scorer of its width: there a batched scorer's rows
    round apart often enough that the run alone and beside three others part at their first rounds
    (``tools/seeded_runs.py``); with invariant products they do not."""
    from gambit.engine import Engine, EngineConfig
    from gambit.scoring import random_scorer

    ecfg = EngineConfig(model=str(smollm2_folder), preemption="evict", num_blocks=400, batch_invariant=True,
                        cpu_weights="bfloat16", kv_dtype="bfloat16")
    first = Engine.from_pretrained(str(smollm2_folder), ecfg)
    cfg = dict(capacity=4, swap=2, warmup=8, interval=5, max_tokens=48)
    alone = _solve(first, random_scorer("mlp", 576), 0, **cfg)
    crowd = _solve(Engine(first.model, first.tokenizer, ecfg), random_scorer("mlp", 576), 3, **cfg)
    assert alone[0]["rounds"] > 0
    assert crowd == alone
