"""The Coordinator's reads and writes of run records (no Ray: its methods on a stand-in ``self``)."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest

from gambit.deployments.coordinator import Coordinator, RPCError
from gambit.serving.tree_view import RedisTreeView, StoreUnavailable


@pytest.fixture
def view():
    v = RedisTreeView(prefix=f"test-coord-{uuid.uuid4().hex[:8]}:")
    yield v
    keys = list(v.r.scan_iter(f"{v.prefix}*"))
    if keys:
        v.r.delete(*keys)


def _known_run(view, run_id: str):
    me = type("C", (), {"tree": view, "_check": lambda self, ctx: None})()
    req = type("R", (), {"run_id": run_id})()
    return asyncio.run(Coordinator.func_or_class._known_run(me, req, None))


def test_a_record_redis_holds_that_is_not_json_is_internal_naming_the_run(view):
    """GetRun of such a record answered INVALID_ARGUMENT "Expecting value: line 1 column 1 (char 0)":
    not the caller's argument, and neither the run nor the field named."""
    view.put_run("ok", status="done")
    assert _known_run(view, "ok")[1]["status"] == "done"
    view.r.hset(view._k("run", "ok"), "progress", "not json")
    with pytest.raises(RPCError) as e:
        _known_run(view, "ok")
    assert e.value.code == grpc.StatusCode.INTERNAL
    assert "run 'ok'" in e.value.message and "'progress'" in e.value.message
    with pytest.raises(ValueError, match="run_id"):  # a bad id is still the caller's
        _known_run(view, "bad:id")


class _Metrics:
    def set(self, *a, **k) -> None: ...
    def inc(self, *a, **k) -> None: ...
    def observe(self, *a, **k) -> None: ...


class _Context:
    def __init__(self) -> None:
        self.code = None

    def invocation_metadata(self):
        return ()

    def set_code(self, code) -> None:
        self.code = code

    def set_details(self, details) -> None:
        self.details = details


def _coordinator(view, target=None):
    """A Coordinator without Ray: its methods on an instance whose ``__init__`` did not run."""
    from gambit.serving.protos import load

    me = object.__new__(Coordinator.func_or_class)
    me.pb2, _ = load("reasoning")
    me.tree, me.token, me.metrics, me.waiting, me.target = view, "", _Metrics(), 0, target
    return me


def _get(me, run_id: str):
    return asyncio.run(me.GetRun(type("R", (), {"run_id": run_id})(), _Context()))


def test_every_run_the_coordinator_ends_has_a_result_in_get_run(view):
    """RunInfo.result is "set once the run has ended", but a run the Coordinator ended itself (its client
    left while Serve queued it; its Target lost) had only a status: a backend polling GetRun for the
    result waited until the record expired, and the reason (the message) reached no client."""
    from gambit.deployments.takeover import TargetLost

    me = _coordinator(view)
    view.claim_run("q1", status="queued")
    me._flag_cancel("q1", True)
    info = _get(me, "q1")
    assert info.status == "cancelled" and info.HasField("result")
    assert info.result.status == "cancelled" and "before a Target admitted it" in info.result.message
    assert info.result.solution_trace == -1 and not info.result.traces
    view.claim_run("l1", status="queued")
    view.put_run("l1", status="running", replica="r0")
    err = asyncio.run(me._target_lost("l1", TargetLost("target lost mid-run (RayActorError) 3 times")))
    info = _get(me, "l1")
    assert info.result.status == "failed" and info.result.message == err.message
    assert "3 times" in info.result.message
    view.put_run("old", status="failed", message="target error: boom")  # a record from before stop 66
    info = _get(me, "old")
    assert (info.result.status, info.result.message) == ("failed", "target error: boom")
    view.put_run("live", status="running")
    assert not _get(me, "live").HasField("result")  # in flight: no result yet


def test_total_s_runs_from_the_request_not_from_the_targets_admission(view):
    """After 34 s in Serve's queue a run's Result said total_s 0.49 beside first_event_s 33.78: total_s
    was the Target's clock, started at admission (and again on a replica that took the run over)."""
    import time

    from gambit.deployments.coordinator import Call

    me = _coordinator(view)
    target_result = {"kind": "result", "run_id": "t1", "status": "done", "answer": "7",
                     "majority_answer": "7", "weighted_answer": "", "majority_votes": {"7": 1.0},
                     "weighted_votes": {}, "traces": [], "generated_tokens": 9, "prompt_tokens": 3,
                     "rounds": 0, "total_s": 0.49}
    view.put_run("t1", status="done", result=target_result)
    call = Call(time.perf_counter() - 34.5, first=33.78, got_result=True)

    async def result():
        return me._result({**view.get_run("t1")["result"]}, call, "sc")

    got = asyncio.run(result()).result  # asyncio.run waits for the record's write (its executor)
    assert got.timings.total_s >= 34.5 and got.timings.total_s >= got.timings.first_event_s == 33.78
    info = _get(me, "t1")
    assert info.result.timings.total_s == pytest.approx(got.timings.total_s)
    assert view.get_run("t1")["result"]["total_s"] == 0.49  # the Target's own record is left as it was


def test_cancel_run_of_a_queued_run_ends_it_at_once(view):
    """CancelRun of a run still in Serve's queue answered "cancelling" after its fast path's 2 s, GetRun
    kept saying "queued", and the run ended only once a Target admitted it (34 s later), after a step."""

    class NoTarget:
        class cancel:  # noqa: N801 — the handle's method
            @staticmethod
            def remote(run_id):
                raise AssertionError("no Target holds a queued run: nothing to ask")

    me = _coordinator(view, NoTarget())
    view.claim_run("q2", status="queued")
    got = asyncio.run(me.CancelRun(type("R", (), {"run_id": "q2"})(), _Context()))
    assert (got.cancelled, got.status) == (True, "cancelled")
    info = _get(me, "q2")
    assert info.status == "cancelled" and info.result.message == "cancelled by CancelRun (before a Target " \
                                                                  "admitted it)"
    assert view.cancel_requested(["q2"])  # a Target that gets it later refuses it (Target.run)


class _QueuedStream:
    """A Serve stream whose run waits in the queue: no event comes until it is cancelled."""

    def __init__(self) -> None:
        self.cancelled = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        await asyncio.Event().wait()

    def cancel(self) -> None:
        self.cancelled = True


def test_a_queued_solve_stream_ends_cancelled_once_its_flag_is_set(view, monkeypatch):
    """The relay waited for the run's first event however long Serve queued it, so its Solve stream
    ended "cancelled" only once a Target slot freed: it now reads the flag while no event has come."""
    import time

    from gambit.deployments import coordinator
    from gambit.deployments.coordinator import Call

    monkeypatch.setattr(coordinator, "QUEUED_POLL_S", 0.05, raising=False)
    stream = _QueuedStream()
    me = _coordinator(view)
    me.stream = type("H", (), {"run": type("M", (), {"remote": staticmethod(lambda *a, **k: stream)})()})()
    me.max_resumes, me.resume_wait_s, me.target_replicas = 2, 120.0, 1
    view.claim_run("q3", status="queued")
    call = Call(time.perf_counter())
    reads, read = [], view.cancel_requested

    def flaky(ids):  # a Redis that does not answer at first: the run waits on, its Solve unbroken
        reads.append(ids)
        if len(reads) == 1:
            raise StoreUnavailable("tree store (Redis at test) unreachable")
        return read(ids)

    monkeypatch.setattr(view, "cancel_requested", flaky)

    async def solve():
        async def cancel_soon():
            await asyncio.sleep(0.2)
            view.request_cancel("q3")
        task = asyncio.ensure_future(cancel_soon())
        events = [ev async for ev in me._relay(call, ("q3", "p", {}), "sc")]
        await task
        return events

    events = asyncio.run(asyncio.wait_for(solve(), 10.0))
    assert [ev.WhichOneof("event") for ev in events] == ["result"]
    assert events[0].result.status == "cancelled" and "before a Target admitted" in events[0].result.message
    assert stream.cancelled and call.got_result and call.first is None and len(reads) >= 2
    assert _get(me, "q3").result.status == "cancelled"


def test_a_target_refuses_a_run_cancelled_before_it_got_it(view):
    """A run cancelled in Serve's queue was admitted once a slot freed, prefilled and stepped before the
    flag poll stopped it: its TargetService now reads the flag at admission and refuses it
    (``CancelFlagged``, tests/serving/test_target_service.py); the Target ends its record and stream."""
    from concurrent.futures import Future

    from gambit.deployments.target import Target
    from gambit.serving.target_service import CancelFlagged

    class Svc:
        tree, scorer = view, None

        def submit_run(self, run_id, *a, **k):  # what admission answers for a flagged run
            fut = Future()
            fut.set_exception(CancelFlagged(view.cancel_requested([run_id])[run_id]))
            return fut

    me = type("T", (), {"svc": Svc(), "loop": None, "replica": "r0"})()
    view.claim_run("q4", status="queued")
    view.request_cancel("q4")

    async def run():
        return [d async for d in Target.func_or_class.run(me, "q4", "p", {})]

    got = asyncio.run(run())
    assert [(d["kind"], d["status"]) for d in got] == [("result", "cancelled")]
    assert got[0]["message"] == "cancelled by CancelRun (before a Target admitted it)"
    rec = view.get_run("q4")
    assert rec["status"] == "cancelled" and rec["result"]["status"] == "cancelled"
    assert view.cancel_requested(["q4"]) == {}  # its flag has done its work


def test_the_contract_says_not_found_may_be_the_proxys_missing_application_metadata():
    """Ray's proxy answers NOT_FOUND when the `application` metadata is missing or wrong: a backend that
    read NOT_FOUND as "run expired", as the contract listed it, hid a configuration error."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    header = (root / "protos/gambit/v1/reasoning.proto").read_text().split("syntax =")[0]
    not_found = header[header.index("NOT_FOUND"):header.index("ALREADY_EXISTS")]
    assert "`application`" in not_found and "Application metadata not set" in not_found
    readme = (root / "README.md").read_text()
    assert "`application`" in readme[readme.index("* `NOT_FOUND`"):readme.index("* `ALREADY_EXISTS`")]


def test_get_run_ends_a_run_whose_target_replica_stopped_beating(view):
    """A run whose Target replica died while the Coordinator relaying it died too (or its client left)
    said "running" for the whole retention: nobody was left to end it, and its id stayed in flight."""
    import time

    me = _coordinator(view)
    view.lease_s = 0.2
    progress = {"run_id": "gone", "round": 3, "active": 2, "ghost": 0, "pruned": 0, "branched": 0,
                "finished": 0, "tokens": 40, "kv_usage": 0.1, "elapsed_s": 1.0}
    view.put_run("gone", status="running", replica="r-dead", progress=progress)
    view.put_run("live", status="running", replica="r-live")
    view.put_run("old", status="running", replica="r-old")  # a replica of a version that never beat
    view.beat("r-dead")
    time.sleep(0.3)
    view.beat("r-live")
    info = _get(me, "gone")
    assert info.status == "failed" and info.result.status == "failed"
    assert info.result.message.startswith("lost: its Target replica r-dead stopped answering at ")
    assert "UTC (no heartbeat for over 15 s)" in info.result.message and info.last_progress.round == 3
    rec = view.get_run("gone")
    assert rec["status"] == "failed" and rec["result"]["lost"] and rec["replica"] == "r-dead"
    view.beat("r-live")  # again: the reads above may outlast a 0.2 s lease on a loaded machine
    assert _get(me, "live").status == "running" and _get(me, "old").status == "running"
    view.put_run("gone2", status="running", replica="r-dead")
    got = asyncio.run(me.CancelRun(type("R", (), {"run_id": "gone2"})(), _Context()))
    assert (got.cancelled, got.status) == (False, "failed")


def test_a_run_taken_over_after_its_lease_ran_out_runs_again_with_no_result(view):
    """A takeover renews the record (its new replica's status): the lost result left in it is no
    result of a running run."""
    import time

    from gambit.deployments.run_records import end_if_lost

    me = _coordinator(view)
    view.lease_s = 0.1
    view.put_run("t", status="running", replica="r0")
    view.beat("r0")
    time.sleep(0.2)
    assert end_if_lost(view, "t", view.get_run("t"))["status"] == "failed"
    view.put_run("t", status="running", replica="r1")  # the Coordinator's write at a takeover
    info = _get(me, "t")
    assert info.status == "running" and not info.HasField("result") and info.replica == "r1"


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_a_client_leaving_after_a_takeover_wrote_running_leaves_the_new_replicas_record(view, kind):
    """Replica r-new took the lost run over and wrote "running", but its started event had not reached the
    Coordinator when the client left: the lost-run cancel checked only the status and marked cancelled a
    run r-new held. It ends only while the lost replica still holds it."""
    from gambit.serving.tree_view import MemoryTreeView

    tree = view if kind == "redis" else MemoryTreeView()
    me = _coordinator(tree)
    tree.put_run("gap", status="running", replica="r-dead")
    tree.put_run("gap", status="running", replica="r-new")  # the takeover's own record
    me._flag_cancel("gap", False, 1.0, "r-dead")
    rec = tree.get_run("gap")
    assert (rec["status"], rec["replica"]) == ("running", "r-new") and "result" not in rec
    assert tree.cancel_requested(["gap"])  # r-new reads the flag and stops the run itself
    for held in ("running", "queued"):  # still on the dead replica (queued: held for batch slots)
        tree.put_run(held, status=held, replica="r-dead")
        me._flag_cancel(held, False, 1.0, "r-dead")
        rec = tree.get_run(held)
        assert rec["status"] == "cancelled" and rec["result"]["message"].startswith("stream closed")
    with pytest.raises(TypeError, match="lost"):  # the replica's id, not a flag
        me._flag_cancel("gap", False, 1.0, True)


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_an_unstarted_cancel_leaves_a_run_a_replica_holds_for_batch_slots(view, kind):
    """A replica that admitted the run and holds it for batch slots writes "queued" with its id: the
    unstarted cancel (end_queued) ended that record as cancelled-unstarted while the replica held it.
    It ends only a "queued" record with no replica; the replica reads the flag and ends the run itself."""
    from gambit.deployments.run_records import cancel_queued, flag_cancel
    from gambit.serving.tree_view import MemoryTreeView

    tree = view if kind == "redis" else MemoryTreeView()
    for end in (lambda r: flag_cancel(tree, r, unstarted=True), lambda r: cancel_queued(tree, r)):
        tree.delete_run("held")
        tree.delete_run("free")
        tree.put_run("held", status="queued", replica="r1")
        tree.put_run("free", status="queued")
        end("held")
        end("free")
        rec = tree.get_run("held")
        assert (rec["status"], rec["replica"]) == ("queued", "r1") and "result" not in rec
        assert tree.get_run("free")["status"] == "cancelled"
        assert tree.get_run("free")["result"]["message"].endswith("(before a Target admitted it)")
    flag_cancel(tree, "held", unstarted=True)
    assert tree.cancel_requested(["held"])  # the holding replica stops the run on its flag
