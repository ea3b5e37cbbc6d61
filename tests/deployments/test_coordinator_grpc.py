"""The Coordinator's gRPC API without Ray: its real methods and a real Target's on a grpc.aio server on
127.0.0.1 (the tiny target, one torch thread, the in-memory tree view). The Serve handles are stand-ins
that call the Target's methods in this process, as Ray's would on its replica."""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc
import pytest
import torch

from gambit.deployments.coordinator import Coordinator
from gambit.deployments.target import Target
from gambit.serving.protos import load
from gambit.serving.solve_config import server_defaults

pb2, pb2_grpc = load("reasoning")
PROBLEM = "Compute 2+3."
SHORT = dict(capacity=2, swap=1, round_interval=4, max_tokens=8)
LONG = dict(capacity=4, swap=1, round_interval=1, max_tokens=700, temperature=1.5)


class _Metrics:
    def set(self, *a, **k) -> None: ...
    def inc(self, *a, **k) -> None: ...
    def observe(self, *a, **k) -> None: ...


class _Stream:
    """A Serve streaming response: iterate it, ``cancel()`` it."""

    def __init__(self, gen) -> None:
        self.gen = gen

    def __aiter__(self):
        return self

    async def __anext__(self):
        return await self.gen.__anext__()

    def cancel(self) -> None:
        asyncio.ensure_future(self.gen.aclose())


class _Method:
    def __init__(self, fn) -> None:
        self.remote = fn


class Handle:
    """A Target deployment handle: ``run`` streams ``run_fn(*a, **k)``'s dicts, ``cancel`` calls
    ``cancel_fn`` in a thread (it waits for an engine step)."""

    def __init__(self, run_fn, cancel_fn=lambda run_id: False) -> None:
        self.calls: list[dict] = []

        def run(*a, **k):
            self.calls.append(k)
            return _Stream(run_fn(*a, **{n: v for n, v in k.items() if n != "avoid"}))

        async def cancel(run_id):
            return await asyncio.to_thread(cancel_fn, run_id)

        self.run, self.cancel = _Method(run), _Method(cancel)

    def options(self, **k):
        return self


def coordinator(tree, handle, **kw):
    """A Coordinator whose ``__init__`` (Ray, Redis, metrics) did not run."""
    me = object.__new__(Coordinator.func_or_class)
    me.pb2, me.tree, me.token, me.metrics, me.waiting = pb2, tree, "", _Metrics(), 0
    me.target = me.stream = handle
    me.defaults = server_defaults({})
    me.max_resumes, me.resume_wait_s, me.target_replicas = kw.get("max_resumes", 0), 1.0, 1
    return me


class _Servicer(pb2_grpc.ReasoningServiceServicer):
    """What Serve's proxy does with a Coordinator's answer: the code its ``_fail`` set, with its details."""

    def __init__(self, co) -> None:
        self.co = co

    async def Solve(self, request, context):  # noqa: N802
        try:
            async for ev in self.co.Solve(request, context):
                yield ev
        except RuntimeError:
            await context.abort(context.code(), context.details())

    async def GetRun(self, request, context):  # noqa: N802
        try:
            return await self.co.GetRun(request, context)
        except RuntimeError:
            await context.abort(context.code(), context.details())

    async def CancelRun(self, request, context):  # noqa: N802
        try:
            return await self.co.CancelRun(request, context)
        except RuntimeError:
            await context.abort(context.code(), context.details())


@contextlib.asynccontextmanager
async def served(co):
    server = grpc.aio.server()
    pb2_grpc.add_ReasoningServiceServicer_to_server(_Servicer(co), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield pb2_grpc.ReasoningServiceStub(channel)
    finally:
        await server.stop(0)


@pytest.fixture(scope="module")
def target():
    """A Target replica's methods on the tiny target (its ``__init__`` needs Serve's replica context)."""
    from gambit.serving.embedded import EmbeddedConfig, build_target

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    svc = build_target(EmbeddedConfig(num_blocks=200), None)
    me = object.__new__(Target.func_or_class)
    me.svc, me.replica, me.loop = svc, "r0", None
    try:
        yield me
    finally:
        svc.close()
        torch.set_num_threads(threads)


@pytest.fixture
def co(target):
    return coordinator(target.svc.tree, Handle(target.run, target.cancel))


async def _code(rpc) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        got = rpc()
        if hasattr(got, "__aiter__"):
            [ev async for ev in got]
        else:
            await got
    return e.value.code(), e.value.details()


def _run(coro, timeout_s: float = 20.0):
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


def test_bad_input_is_invalid_argument_naming_the_field(co):
    async def go():
        async with served(co) as stub:
            for req, field in [(dict(problem=""), "problem"), (dict(problem=PROBLEM, method="x"), "method"),
                               (dict(problem=PROBLEM, capacity=0), "capacity"),
                               (dict(problem=PROBLEM, top_p=float("inf")), "top_p"),
                               (dict(problem=PROBLEM, run_id="bad id"), "run_id")]:
                code, details = await _code(lambda r=req: stub.Solve(pb2.SolveRequest(**r), timeout=10))
                assert (code, details.split(":")[0]) == (grpc.StatusCode.INVALID_ARGUMENT, field), details
            for rpc, msg in [(stub.GetRun, pb2.GetRunRequest), (stub.CancelRun, pb2.CancelRunRequest)]:
                for run_id in ["", "a b", "x" * 65]:
                    code, details = await _code(lambda r=rpc, m=msg, i=run_id: r(m(run_id=i), timeout=5))
                    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("run_id:")
        assert co.tree.get_run("bad id") is None

    _run(go())


def test_an_unknown_run_is_not_found(co):
    async def go():
        async with served(co) as stub:
            for rpc, msg in [(stub.GetRun, pb2.GetRunRequest), (stub.CancelRun, pb2.CancelRunRequest)]:
                code, details = await _code(lambda r=rpc, m=msg: r(m(run_id="no-such-run"), timeout=5))
                assert code == grpc.StatusCode.NOT_FOUND and "'no-such-run'" in details

    _run(go())


def test_a_run_id_taken_is_already_exists_and_the_first_run_is_kept(co):
    async def go():
        async with served(co) as stub:
            req = pb2.SolveRequest(problem=PROBLEM, run_id="grpc-dup", **SHORT)
            first = [ev async for ev in stub.Solve(req, timeout=10)]
            assert first[-1].result.status == "done"
            code, details = await _code(lambda: stub.Solve(req, timeout=10))
            assert code == grpc.StatusCode.ALREADY_EXISTS and "'grpc-dup'" in details and "ended" in details
            info = await stub.GetRun(pb2.GetRunRequest(run_id="grpc-dup"), timeout=5)
            assert info.status == "done" and info.result.status == "done"

    _run(go())


def test_a_target_lost_mid_run_is_unavailable_and_the_run_recorded_failed(target):
    """Serve's stream raises RuntimeError when the replica holding the run shuts down (not a Ray actor
    error: no takeover): the client gets UNAVAILABLE and GetRun the run as failed, with the same why."""

    async def shutting_down(run_id, problem, cfg, resume=False):
        yield {"kind": "started", "run_id": run_id, "replica": "r9", "resumed": False, "restored": False}
        raise RuntimeError("replica r9 is shutting down")

    from gambit.serving.tree_view import MemoryTreeView

    co = coordinator(MemoryTreeView(), Handle(shutting_down))

    async def go():
        async with served(co) as stub:
            req = pb2.SolveRequest(problem=PROBLEM, run_id="grpc-lost", **SHORT)
            code, details = await _code(lambda: stub.Solve(req, timeout=10))
            assert code == grpc.StatusCode.UNAVAILABLE and "target lost mid-run (RuntimeError)" in details
            info = await stub.GetRun(pb2.GetRunRequest(run_id="grpc-lost"), timeout=5)
            assert info.status == "failed" and info.result.message == details
            got = await stub.CancelRun(pb2.CancelRunRequest(run_id="grpc-lost"), timeout=5)
            assert (got.cancelled, got.status) == (False, "failed")

    _run(go())


def test_a_client_that_leaves_mid_stream_cancels_its_run_and_frees_its_kv(co, target):
    async def go():
        async with served(co) as stub:
            call = stub.Solve(pb2.SolveRequest(problem=PROBLEM, run_id="grpc-left", **LONG), timeout=20)
            async for ev in call:
                if ev.WhichOneof("event") == "progress":
                    break
            assert target.svc.load()["runs"] == 1
            call.cancel()
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline:
                info = await stub.GetRun(pb2.GetRunRequest(run_id="grpc-left"), timeout=5)
                load = target.svc.load()
                if info.status == "cancelled" and load["runs"] == 0:
                    break
                await asyncio.sleep(0.05)
            assert info.status == "cancelled" and "stream closed" in info.result.message
            assert (load["runs"], load["reserved_blocks"]) == (0, 0)

    _run(go())


def test_a_takeover_refused_for_its_kv_is_resent_as_a_takeover():
    """The replica taking a lost run over refused it for its KV and the run was sent on to the next one
    without ``resume``: that replica started it afresh under its id (its rounds again from the prompt,
    its tree overwritten) after its client had seen them."""
    from ray.exceptions import RayActorError

    from gambit.deployments.run_records import ended_result
    from gambit.serving.tree_view import MemoryTreeView

    def started(run_id, replica, resumed):
        return {"kind": "started", "run_id": run_id, "replica": replica, "resumed": resumed,
                "restored": resumed}

    async def replicas(run_id, problem, cfg, resume=False):
        tries = len(handle.calls)
        if tries == 1:  # r0 runs it and dies
            yield started(run_id, "r0", False)
            raise RayActorError()
        if tries == 2:  # r1 has no room for it
            yield {"kind": "error", "code": "RESOURCE_EXHAUSTED", "message": "no room", "replica": "r1"}
            return
        yield started(run_id, "r2", resume)
        yield ended_result(run_id, "done", "")

    handle = Handle(replicas)
    tree = MemoryTreeView()
    co = coordinator(tree, handle, max_resumes=1)
    co.target_replicas = 3

    async def go():
        async with served(co) as stub:
            req = pb2.SolveRequest(problem=PROBLEM, run_id="grpc-kv-takeover", **SHORT)
            return [ev async for ev in stub.Solve(req, timeout=10)]

    events = _run(go())
    assert [k.get("resume", False) for k in handle.calls] == [False, True, True]
    assert [k.get("avoid", ()) for k in handle.calls] == [(), (), ("r1",)]
    assert events[-1].result.status == "done" and events[1].started.resumed
    rec = tree.get_run("grpc-kv-takeover")
    assert (rec["replica"], rec["resumes"]) == ("r2", 1)


def test_a_solve_that_ends_before_a_target_was_asked_leaves_no_queued_record():
    """A client whose deadline passed while Redis wrote its run's claim, or a handle that raised: the
    record said "queued" for the whole retention (GetRun never saw it end, its run_id stayed taken),
    and the waiting gauge kept the run as waiting."""
    from gambit.serving.tree_view import MemoryTreeView

    class SlowClaims(MemoryTreeView):
        def claim_run(self, run_id, **fields):
            time.sleep(0.3)
            return super().claim_run(run_id, **fields)

    def broken(*a, **k):
        raise RuntimeError("deployment handle is shut down")

    tree = SlowClaims()
    never = Handle(lambda *a, **k: pytest.fail("no Target is asked for a Solve that ended"))
    co = coordinator(tree, never)

    async def go():
        async with served(co) as stub:
            req = pb2.SolveRequest(problem=PROBLEM, run_id="grpc-slow-claim", **SHORT)
            code, _ = await _code(lambda: stub.Solve(req, timeout=0.1))
            assert code == grpc.StatusCode.DEADLINE_EXCEEDED
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline and (tree.get_run("grpc-slow-claim") or {}).get(
                    "status", "queued") == "queued":
                await asyncio.sleep(0.05)
            info = await stub.GetRun(pb2.GetRunRequest(run_id="grpc-slow-claim"), timeout=5)
            assert info.status == "cancelled" and "before a Target admitted it" in info.result.message
            co.stream = Handle(broken)
            req = pb2.SolveRequest(problem=PROBLEM, run_id="grpc-no-handle", **SHORT)
            code, details = await _code(lambda: stub.Solve(req, timeout=5))
            assert code == grpc.StatusCode.INTERNAL and "deployment handle is shut down" in details
            info = await stub.GetRun(pb2.GetRunRequest(run_id="grpc-no-handle"), timeout=5)
            assert info.status == "failed" and info.result.message == details
            assert co.waiting == 0

    _run(go())


@pytest.mark.parametrize("held", ["running", "queued"])  # queued: the dead replica held it for batch slots
def test_a_client_that_leaves_while_its_run_waits_for_a_takeover_ends_its_record(held):
    """Its replica was lost and the takeover waited for a live one when the client left: the record said
    "running" on the dead replica for the whole retention (no Target held the run to end it); a run held
    there for batch slots stayed "queued" until its lease ended it as failed, though its client cancelled."""
    from ray.exceptions import RayActorError

    from gambit.serving.tree_view import MemoryTreeView

    async def replicas(run_id, problem, cfg, resume=False):
        if not resume:
            tree.put_run(run_id, status=held, replica="r0")
            yield {"kind": "started", "run_id": run_id, "replica": "r0", "resumed": False, "restored": False}
            await asyncio.sleep(0.05)
            raise RayActorError()
        await asyncio.Event().wait()  # Serve waits for a live replica

    tree = MemoryTreeView()
    co = coordinator(tree, Handle(replicas), max_resumes=1)

    async def go():
        async with served(co) as stub:
            call = stub.Solve(pb2.SolveRequest(problem=PROBLEM, run_id="grpc-left-lost", **SHORT), timeout=10)
            async for ev in call:
                assert ev.WhichOneof("event") == "started"
                break
            await asyncio.sleep(0.3)  # lost, and a takeover asked for
            call.cancel()
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline and tree.get_run("grpc-left-lost")["status"] == held:
                await asyncio.sleep(0.05)

    _run(go())
    rec = tree.get_run("grpc-left-lost")
    assert rec["status"] == "cancelled" and rec["result"]["message"].startswith("stream closed")
    assert tree.cancel_requested(["grpc-left-lost"])  # a replica that takes it over later refuses it


def test_a_takeover_goes_on_when_a_get_run_ended_the_run_for_its_lease():
    """While this Coordinator waited to hand a lost run on, another one's GetRun ended it for its dead
    replica's lease: the takeover took that "lost" result for the run's own end and gave it up."""
    from ray.exceptions import RayActorError

    from gambit.deployments.run_records import end_if_lost, ended_result
    from gambit.serving.tree_view import MemoryTreeView

    async def replicas(run_id, problem, cfg, resume=False):
        if not resume:
            tree.put_run(run_id, status="running", replica="r0")
            tree.beat("r0")
            yield {"kind": "started", "run_id": run_id, "replica": "r0", "resumed": False, "restored": False}
            await asyncio.sleep(0.15)  # r0 dies; its lease runs out and a GetRun elsewhere ends the run
            assert end_if_lost(tree, run_id, tree.get_run(run_id))["result"]["lost"]
            raise RayActorError()
        yield {"kind": "started", "run_id": run_id, "replica": "r1", "resumed": True, "restored": True}
        tree.put_run(run_id, status="done", result=ended_result(run_id, "done", ""), replica="r1")
        yield ended_result(run_id, "done", "")

    tree = MemoryTreeView()
    tree.lease_s = 0.1
    co = coordinator(tree, Handle(replicas), max_resumes=1)

    async def go():
        async with served(co) as stub:
            req = pb2.SolveRequest(problem=PROBLEM, run_id="grpc-lease-takeover", **SHORT)
            events = [ev async for ev in stub.Solve(req, timeout=10)]
            assert events[-1].result.status == "done" and events[1].started.resumed
            info = await stub.GetRun(pb2.GetRunRequest(run_id="grpc-lease-takeover"), timeout=5)
            assert (info.status, info.result.status, info.replica) == ("done", "done", "r1")

    _run(go())


def test_a_run_id_held_by_a_lost_replica_is_said_ended_and_get_run_says_why():
    """Both the run's replica and its Coordinator gone: a Solve with its id heard it was "in flight
    (running)" and GetRun said "running" for the whole retention."""
    from gambit.serving.tree_view import MemoryTreeView

    tree = MemoryTreeView()
    tree.lease_s = 0.1
    co = coordinator(tree, Handle(lambda *a, **k: pytest.fail("the id is taken: no Target is asked")))
    tree.put_run("grpc-orphan", status="running", replica="r-dead")
    tree.beat("r-dead")
    time.sleep(0.2)

    async def go():
        async with served(co) as stub:
            req = pb2.SolveRequest(problem=PROBLEM, run_id="grpc-orphan", **SHORT)
            code, details = await _code(lambda: stub.Solve(req, timeout=5))
            assert code == grpc.StatusCode.ALREADY_EXISTS and "ended (failed)" in details
            info = await stub.GetRun(pb2.GetRunRequest(run_id="grpc-orphan"), timeout=5)
            assert info.status == "failed" and "replica r-dead stopped answering" in info.result.message

    _run(go())


def _left_after_loss(replicas, run_id: str, wait_started: bool):
    """A Solve whose client leaves 0.3 s after its replica was lost; its record once the cancel is done."""
    from gambit.serving.tree_view import MemoryTreeView

    tree = MemoryTreeView()
    co = coordinator(tree, Handle(lambda *a, **k: replicas(tree, *a, **k)), max_resumes=1)

    async def go():
        async with served(co) as stub:
            call = stub.Solve(pb2.SolveRequest(problem=PROBLEM, run_id=run_id, **SHORT), timeout=10)
            if wait_started:  # else no event comes before the loss (the call is sent all the same)
                async for ev in call:
                    assert ev.WhichOneof("event") == "started"
                    break
            await asyncio.sleep(0.4)  # lost, and (maybe) a takeover asked for
            call.cancel()
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline and not tree.cancel_requested([run_id]):
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)  # the cancel's record write, if any, comes right after the flag

    _run(go())
    assert tree.cancel_requested([run_id])
    return tree.get_run(run_id)


def test_a_client_leaving_before_a_takeovers_started_event_leaves_its_record():
    """The replica taking a lost run over wrote "running" but its started event had not reached the
    Coordinator when the client left: the record was marked cancelled (its status alone was checked)
    while the new replica held the run. Only the lost replica's record ends here."""
    from ray.exceptions import RayActorError

    async def replicas(tree, run_id, problem, cfg, resume=False):
        if not resume:
            tree.put_run(run_id, status="running", replica="r0")
            yield {"kind": "started", "run_id": run_id, "replica": "r0", "resumed": False, "restored": False}
            await asyncio.sleep(0.05)
            raise RayActorError()
        tree.put_run(run_id, status="running", replica="r1")  # admitted: its started event still to come
        await asyncio.Event().wait()

    rec = _left_after_loss(replicas, "grpc-gap", wait_started=True)
    assert (rec["status"], rec["replica"]) == ("running", "r1") and "result" not in rec


def test_a_client_leaving_after_a_replica_lost_before_its_started_event_ends_its_record():
    """The lost replica wrote "running" but died before its started event came: its record names it."""
    from ray.exceptions import RayActorError

    async def replicas(tree, run_id, problem, cfg, resume=False):
        if not resume:
            tree.put_run(run_id, status="running", replica="r0")
            await asyncio.sleep(0.05)
            raise RayActorError()
            yield {}
        await asyncio.Event().wait()  # Serve waits for a live replica

    rec = _left_after_loss(replicas, "grpc-lost-early", wait_started=False)
    assert rec["status"] == "cancelled" and rec["result"]["message"].startswith("stream closed")
