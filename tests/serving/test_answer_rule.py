"""``SolveRequest.answer_rule``: how a served run reads its traces' answers (a chat model on GSM8K
writes the number without a box; the default rule would find no answer)."""

from __future__ import annotations

import pytest

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
