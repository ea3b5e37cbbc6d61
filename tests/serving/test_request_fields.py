"""Request fields added for backends: ``answer_rule`` (how a served run reads its traces' answers: a chat
model on GSM8K writes the number without a box, where the default rule finds no answer) and
``max_total_tokens`` (a token budget for the whole run)."""

from __future__ import annotations

import pytest

from gambit.serving.client import ClientConfig
from gambit.serving.embedded import Embedded, EmbeddedConfig
from gambit.serving.protos import load
from gambit.serving.solve_config import SolveConfig, from_request
from gambit.tasks.arithmetic import TaskConfig, generate


def test_the_rule_comes_from_the_request_and_a_bad_one_names_the_field():
    pb2 = load("reasoning")[0]
    assert from_request(pb2.SolveRequest(problem="x"))[1].answer_rule == "boxed"
    assert from_request(pb2.SolveRequest(problem="x", answer_rule="gsm8k"))[1].answer_rule == "gsm8k"
    with pytest.raises(ValueError, match="answer_rule: unknown rule 'words'"):
        from_request(pb2.SolveRequest(problem="x", answer_rule="words"))


def test_a_served_run_reads_answers_by_its_rule():
    """Traces cut before their box: no answer under "boxed", the last number under "gsm8k"; the same
    tokens either way (the rule only reads)."""
    p = generate("test", 1, 0, TaskConfig(4, 4))[0].prompt
    cfg = dict(capacity=4, swap=1, round_interval=8, warmup=4, max_tokens=14, seed=1)
    e = Embedded(EmbeddedConfig(num_blocks=300))
    try:
        runs = {rule: list(e.solve(p, SolveConfig(**cfg, answer_rule=rule)))[-1]
                for rule in ("boxed", "gsm8k")}
    finally:
        e.close()
    boxed, gsm8k = runs["boxed"]["traces"], runs["gsm8k"]["traces"]
    assert [t["tokens"] for t in boxed] == [t["tokens"] for t in gsm8k]
    assert not any(t["answer"] for t in boxed) and runs["boxed"]["answer"] in ("", None)
    finished = [t for t in gsm8k if t["finish_reason"] == "finished"]
    assert finished and all(t["answer"] and t["answer"].lstrip("-").isdigit() for t in finished)
    assert runs["gsm8k"]["answer"] not in ("", None)


def test_a_run_stops_at_its_token_budget():
    """``max_total_tokens``: the run ends with status "limit" at the budget exactly, where the same run
    without one goes on. Checked after each step alone, every resident trace added the token of the step
    that crossed it (a budget of 1 at C = 64 generated 64), and a speculative step up to γ + 1 each."""
    pb2 = load("reasoning")[0]
    assert from_request(pb2.SolveRequest(problem="x", max_total_tokens=90))[1].max_total_tokens == 90
    with pytest.raises(ValueError, match="max_total_tokens: must be in"):
        ClientConfig(max_total_tokens=-1)
    p = generate("test", 1, 0, TaskConfig(6, 6))[0].prompt
    cfg = dict(capacity=4, swap=1, round_interval=8, warmup=4, max_tokens=200, seed=3)
    e = Embedded(EmbeddedConfig(num_blocks=300))
    try:
        free = list(e.solve(p, SolveConfig(**cfg)))[-1]
        capped = list(e.solve(p, SolveConfig(**cfg, max_total_tokens=90)))[-1]
        tiny = list(e.solve(p, SolveConfig(**cfg, max_total_tokens=3)))[-1]  # below C: 3 traces get one
        spec = list(e.solve(p, SolveConfig(**cfg, decoding="pr", max_total_tokens=61)))[-1]
        # every trace gets a share of at least 1 (100 < 8 × (γ + 1)): none is stopped by the budget
        # itself, all at their caps; this ended "done" with no message
        q = "Compute ((17+8)*3-29)*(4+5)-61."
        wide = [list(e.solve(q, SolveConfig(capacity=8, seed=5, temperature=1.0, decoding=d,
                                             max_total_tokens=100)))[-1] for d in ("pr", "eagle3.1")]
    finally:
        e.close()
    assert free["status"] == "done" and free["generated_tokens"] > 200
    for res, budget in ((capped, 90), (tiny, 3), (spec, 61), *((w, 100) for w in wide)):
        assert res["status"] == "limit" and res["generated_tokens"] == budget, (budget, res["message"])
        assert res["message"].startswith(f"max_total_tokens {budget} reached ({budget} tokens")
        assert sum(t["tokens"] for t in res["traces"]) == budget
        stopped = [t for t in res["traces"] if t["end_reason"] == "limit"]
        assert stopped and all(t["finish_reason"] == "stopped" for t in stopped)
    assert sorted(t["tokens"] for t in tiny["traces"]) == [0, 1, 1, 1]
