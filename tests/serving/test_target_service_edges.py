"""Edge input at the Target and the embedded API: a closed service, a duplicate run id under a full KV,
a problem or config Python can build but gRPC cannot carry (real engine, the shipped target)."""

from __future__ import annotations

import re
import threading

import pytest
from serving_util import second_of_two_runs, until

from gambit.serving.embedded import Embedded, EmbeddedConfig, build_target
from gambit.serving.solve_config import SolveConfig, check_problem
from gambit.serving.target_service import Overcommitted
from gambit.tasks.arithmetic import TaskConfig, generate

PROBLEM = generate("test", 1, 0, TaskConfig(3, 4))[0].prompt


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one intra-op thread, restored


def _in_thread(fn, wait_s: float = 10.0):
    """``fn()``'s result or exception, or "hang" when it has not returned after ``wait_s``."""
    out: list = []

    def go() -> None:
        try:
            out.append(fn())
        except Exception as e:  # noqa: BLE001 — the test reads it
            out.append(e)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(wait_s)
    return "hang" if t.is_alive() else out[0]


def test_a_closed_service_refuses_runs_and_calls_at_once():
    """``submit_run`` after ``close()`` queued the run for an engine thread that had exited: its future
    never ended, so ``Embedded.solve`` (and a Target replica being torn down) waited forever."""
    e = Embedded(EmbeddedConfig(num_blocks=100))
    e.close()
    got = _in_thread(lambda: list(e.solve(PROBLEM, SolveConfig(capacity=2, max_tokens=8, seed=1))))
    assert isinstance(got, RuntimeError) and "closed" in str(got), got
    own = _in_thread(lambda: list(e.solve(PROBLEM, SolveConfig(capacity=2, max_tokens=8), run_id="mine")))
    assert isinstance(own, RuntimeError)
    assert e.target.tree.get_run("mine") is None  # refused before it started: the id stays free
    assert isinstance(_in_thread(lambda: e.target.call(lambda: 1).exception(timeout=5)), RuntimeError)
    assert e.target.cancel("mine") is False


def test_a_duplicate_run_id_is_a_request_error_even_when_the_kv_is_full():
    """The duplicate-id check came after the KV check: a second run under an id in flight, where the
    first left too little KV, got Overcommitted (RESOURCE_EXHAUSTED: "retry later", which never helps)."""
    svc = build_target(EmbeddedConfig(num_blocks=120), None)
    try:
        cfg = SolveConfig(capacity=4, swap=1, max_tokens=400, seed=1)
        need = svc.blocks_needed(svc.format_problem(PROBLEM), cfg)
        assert need <= svc.engine.num_blocks < 2 * need  # one fits, two do not
        err = second_of_two_runs(svc, cfg, ("dup", PROBLEM), ("dup", PROBLEM))
        assert not isinstance(err, Overcommitted), err
        assert isinstance(err, ValueError) and str(err).startswith("run_id: 'dup' is already running"), err
    finally:
        svc.cancel("dup")
        svc.close()


@pytest.mark.parametrize("problem, message", [
    ("x\ud800y", r"problem: not valid UTF-8 text: '\\ud800' at character 1"),
    (42, "problem: must be a string, got int"),
    (None, "problem: must be a string, got NoneType"),
    (" \n\t", "problem: empty"),
])
def test_a_problem_gRPC_could_not_carry_is_refused_naming_the_field(problem, message):  # noqa: N802
    """A lone surrogate passed the check and raised TypeError in the tokenizer at admission; a
    number was called "empty"."""
    with pytest.raises(ValueError, match=message):
        check_problem(problem)


def test_embedded_solve_refuses_a_config_that_is_not_a_solve_config():
    """A dict of fields raised AttributeError ('dict' object has no attribute 'raw_prompt') at
    admission, and its values were never checked."""
    e = Embedded(EmbeddedConfig(num_blocks=100))
    try:
        with pytest.raises(ValueError, match="cfg: must be a SolveConfig"):
            next(e.solve(PROBLEM, {"capacity": 2}))
        with pytest.raises(ValueError, match="problem: not valid UTF-8"):
            next(e.solve("2+\udfff", SolveConfig(capacity=2, max_tokens=4)))
    finally:
        e.close()


@pytest.mark.parametrize("problem, message", [
    ("\x00 + 1", r"problem: characters the model's vocabulary cannot represent: '\\x00'"),
    ("1 2 " * 700, "problem: prompt has [0-9]+ tokens; the context holds 1024"),
])
def test_a_problem_no_run_can_take_is_a_request_error_even_beside_busy_runs(problem, message):
    """Its characters and length were checked at submission, after the KV check: with the KV held by
    another run it was Overcommitted (RESOURCE_EXHAUSTED, "retry later", which never helps)."""
    svc = build_target(EmbeddedConfig(num_blocks=120), None)
    try:
        cfg = SolveConfig(capacity=4, swap=1, max_tokens=400, seed=1)
        err = second_of_two_runs(svc, cfg, ("busy", PROBLEM), ("bad", problem))
        assert isinstance(err, ValueError) and not isinstance(err, Overcommitted), err
        assert re.match(message, str(err)), err
    finally:
        svc.cancel("busy")
        svc.close()


def test_a_cancel_waiting_for_an_engine_thread_that_dies_returns():
    """A cancel queued for the engine thread waited on its future with no bound: a thread that died
    before it read the queue left that caller (a Serve thread per CancelRun) waiting for ever."""
    svc = build_target(EmbeddedConfig(num_blocks=200), None)
    got: list = []
    release = threading.Event()

    def die() -> None:  # the engine thread ends here (a BaseException: nothing catches it)
        release.wait(10)
        raise SystemExit

    try:
        svc.start_run("r1", PROBLEM, SolveConfig(capacity=2, max_tokens=400, seed=1), got.append)
        held = svc.call(die)
        assert until(held.running, 10)
        threading.Timer(0.3, release.set).start()  # it dies once the cancel below is queued
        assert _in_thread(lambda: svc.cancel("r1"), wait_s=10) is True
        assert got[-1]["kind"] == "result" and got[-1]["status"] == "cancelled"
        assert svc.load()["runs"] == 0 and not svc._thread.is_alive()
    finally:
        release.set()
        svc.close()
