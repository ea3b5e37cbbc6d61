"""The load test's problems: the task's by size, or a graded benchmark's questions with its answer rule."""

from __future__ import annotations

import pytest

from gambit.ops.loadtest import LoadTestConfig, locust_command, problem_pool
from gambit.tasks.graded import datasets_dir

SIZES = [(2, 3), (2, 3), (4, 6), (7, 8)]


def test_the_task_pool_is_seeded_by_size():
    pool = problem_pool(SIZES, 0)
    assert sorted(pool) == [(2, 3), (4, 6), (7, 8)]
    assert all(len(v) == 40 and all(rule == "" for _, rule, _ in v) for v in pool.values())
    assert pool == problem_pool(SIZES, 0) and pool != problem_pool(SIZES, 1)
    # sent bare, as a backend sends a problem (the Target adds the task's cue, or a chat model's template)
    assert all(p.startswith("Compute ") and p.endswith(".") for p, _, _ in pool[(4, 6)])
    # the gold a right run answers: the problem's value
    from gambit.tasks.arithmetic import TaskConfig, generate

    first = generate("test", 40, 0, TaskConfig(4, 6))[0]
    assert pool[(4, 6)][0] == (first.question, "", str(first.answer))


@pytest.mark.skipif(not datasets_dir().is_dir(), reason="no shared datasets")
def test_a_benchmark_pool_sends_its_questions_with_their_rule():
    pool = problem_pool(SIZES, 0, "gsm8k")
    assert len(pool[(2, 3)]) == 1319 and pool[(2, 3)] is pool[(7, 8)]
    assert {rule for _, rule, _ in pool[(2, 3)]} == {"gsm8k"}
    assert pool[(2, 3)][0][2] == "18"  # GSM8K's first test answer (Janet's ducks), as its rule keys it
    gpqa = problem_pool(SIZES, 0, "gpqa")[(4, 6)]
    assert {rule for _, rule, _ in gpqa} == {"choice"} and {g for _, _, g in gpqa} <= set("ABCD")


def test_the_benchmark_reaches_locust_and_bad_ones_are_refused_before_ray(tmp_path):
    cmd = locust_command(LoadTestConfig(benchmark="aime25"), "127.0.0.1:9000")
    assert cmd[cmd.index("--benchmark") + 1] == "aime25"
    with pytest.raises(ValueError, match="benchmark: unknown 'gsm9k'"):
        LoadTestConfig(benchmark="gsm9k")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LoadTestConfig(benchmark="gsm8k", data=str(tmp_path / "none.jsonl"))


def test_a_dead_or_impossible_address_is_said_at_once(monkeypatch, capsys):
    """Against an address nothing answers at, the load test ran its whole time of failed calls."""
    from gambit.deployments import local
    from gambit.ops import loadtest

    with pytest.raises(ValueError, match="address: port 99999 is not a TCP port"):
        LoadTestConfig(address="127.0.0.1:99999")
    asked = []

    def not_ready(address, wait_s, token, scorer=True):
        asked.append((address, wait_s, scorer))
        raise TimeoutError("services not ready after 10.0 s: StatusCode.UNAVAILABLE")

    monkeypatch.setattr(local, "wait_ready", not_ready)
    monkeypatch.setattr(loadtest, "stream", lambda *a: pytest.fail("locust ran against a dead address"))
    assert loadtest.main(LoadTestConfig(address="127.0.0.1:1", run_time_s=60)) == 2
    assert asked == [("127.0.0.1:1", 10.0, None)]  # None: a server with an outside Scorer has no scorer app
    assert "no ReasoningService answers at 127.0.0.1:1" in capsys.readouterr().err
