"""A wedged Target replica is replaced, not only avoided: Serve's ``check_health`` fails while its engine is
stuck past ``run_lease.STUCK_S`` or its thread died (never for a long legit step, never waiting for the
engine), ``close()`` gives up on a wedged step, and a stream whose client left never blocks the event loop
on a step. No Ray: the deployment's real methods on a real ``TargetService``."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from gambit.deployments.target import Target
from gambit.serving import target_service
from gambit.serving.embedded import EmbeddedConfig, build_target
from gambit.serving.run_lease import STUCK_S, Progress

PROBLEM = "Compute 2+3."
SHORT = dict(capacity=2, swap=1, round_interval=4, max_tokens=8)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one intra-op thread, restored


@pytest.fixture
def svc():
    s = build_target(EmbeddedConfig(num_blocks=120), None, replica="r-h")
    yield s
    s.close()


def _target(svc) -> Target:
    me = object.__new__(Target.func_or_class)
    me.svc, me.replica, me.loop = svc, svc.replica, None
    return me


def _hold(svc, seconds: float) -> tuple[threading.Event, object]:
    """The engine thread runs one piece of work (holding its lock) until released or ``seconds``."""
    release, inside = threading.Event(), threading.Event()
    held = svc.call(lambda: inside.set() or release.wait(seconds))
    assert inside.wait(5)
    return release, held


def test_check_health_fails_only_while_the_engine_is_stuck_and_never_waits_for_it(svc):
    """No check_health: Serve kept a wedged replica (heartbeat withheld, every run refused) for ever."""
    me = _target(svc)
    me.check_health()  # idle
    now = [0.0]
    svc.progress = Progress(stuck_s=STUCK_S, clock=lambda: now[0])
    release, held = _hold(svc, 10)
    try:
        svc.progress.busy()
        now[0] = STUCK_S - 1  # a long step, still legit: healthy
        t0 = time.perf_counter()
        me.check_health()
        assert me.record_routing_stats()["stuck"] is False
        now[0] = STUCK_S + 5  # wedged: Serve replaces it
        with pytest.raises(RuntimeError, match="r-h.*wedged"):
            me.check_health()
        assert me.record_routing_stats()["stuck"] is True
        assert time.perf_counter() - t0 < 0.5  # the engine's lock was held all along: never waited for
    finally:
        release.set()
    held.result(timeout=5)
    now[0] += 1
    svc.progress.idle()
    me.check_health()  # moving again


def test_check_health_fails_once_the_engine_thread_died(svc):
    me = _target(svc)

    def die():
        raise SystemExit  # not an Exception: it ends the engine thread (a bug outside the step's guard)

    svc.call(die)
    svc._thread.join(5)
    with pytest.raises(RuntimeError, match="stopped"):
        me.check_health()


def test_close_gives_up_on_a_wedged_step(svc, monkeypatch):
    """The engine thread holds its lock through a step: close() waited for it (``with self._cv``) for ever,
    so the replica's ``__del__`` and Serve's shutdown of a wedged replica hung."""
    monkeypatch.setattr(target_service, "CLOSE_WAIT_S", 0.3, raising=False)  # old code: none
    release, held = _hold(svc, 3)  # old code: close() returned only once this ended (3 s)
    ended = []
    threading.Timer(3, release.set).start()
    t0 = time.perf_counter()
    svc.close()
    ended.append(time.perf_counter() - t0)
    release.set()
    assert ended[0] < 1.5, ended
    held.result(timeout=5)
    svc._thread.join(5)
    assert not svc._thread.is_alive()  # it saw _stop once its step ended


def test_a_client_leaving_as_its_run_is_admitted_never_blocks_the_event_loop(svc):
    """The caller left just as admission ended: the done-callback ran on the event loop at once and its
    ``svc.cancel`` waited there for the engine's step (up to a whole step; for ever if it wedged)."""
    me = _target(svc)
    submit, holds = svc.submit_run, []

    def admitted_then_busy(*a, **k):  # admission ends, then the engine starts a long step
        fut = submit(*a, **k)
        fut.result(timeout=5)
        holds.append(_hold(svc, 5))
        threading.Timer(2, holds[0][0].set).start()  # old code: the loop was blocked until here
        return fut

    svc.submit_run = admitted_then_busy

    async def go():
        gen = me.run("left", PROBLEM, dict(SHORT))
        task = asyncio.ensure_future(gen.__anext__())
        await asyncio.sleep(0)  # it awaits the (done) admission
        task.cancel()
        t0 = time.perf_counter()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.perf_counter() - t0

    try:
        took = asyncio.run(asyncio.wait_for(go(), 10))
        assert took < 0.5, took
    finally:
        holds[0][0].set()
    holds[0][1].result(timeout=5)
    deadline = time.monotonic() + 5
    while "left" in svc._sinks and time.monotonic() < deadline:  # stopped between two steps
        time.sleep(0.02)
    assert "left" not in svc._sinks and svc.tree.get_run("left")["status"] == "cancelled"
