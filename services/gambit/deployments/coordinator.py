"""``Coordinator`` deployment: the ReasoningService behind Ray Serve's gRPC proxy.

It validates requests, records runs in the tree view (Redis), starts each run on a Target replica
(the run stays pinned there: its KV lives there; the Target's request router, ``kv_router``, picks
the replica whose KV holds it with the most room left; a replica that cannot hold it refuses, as does
one whose engine is stuck, and the run is tried on the others before RESOURCE_EXHAUSTED or UNAVAILABLE)
and relays the run's events. If that
replica dies mid-run, or its stream goes silent and its lease lapses (``run_lease``: its engine
stopped), another one takes the run over from its tree in Redis (``takeover``). The
tournament itself runs inside the Target next to its engine (see README, "Architecture"), so a
Coordinator holds no run state: any replica serves GetRun/CancelRun. The records it writes itself
(runs that end with no Target's result), GetRun's reading and the sweep of lost runs are
``run_records``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import uuid
from dataclasses import asdict, dataclass

import grpc
from google.protobuf.json_format import MessageToDict
from ray import serve

from gambit.deployments.ray_metrics import ray_metrics
from gambit.deployments.run_records import (
    SWEEP_S,
    UNSTARTED,
    cancel_queued,
    end_failed,
    end_if_lost,
    end_lost,
    end_queued_quietly,
    ended_result,
    flag_cancel,
    flagged,
    held_by,
    lease_lapsed,
    put_fields,
    run_info,
    sweep_lost,
)
from gambit.deployments.takeover import LeaseLost, Lost, TargetLost, target_died
from gambit.serving.convert import SETTINGS, event_msg, result_msg, settings_msg
from gambit.serving.protos import load
from gambit.serving.run_lease import HEARTBEAT_S
from gambit.serving.security import check_token, read_token
from gambit.serving.solve_config import check_run_id, from_request, server_defaults
from gambit.serving.tree_view import ENDED, RETENTION_S, StoreUnavailable, open_tree_view, taken_message

QUEUED_POLL_S = 0.5  # while a Solve waits in Serve's queue, its cancel flag is read this often
LEASE_POLL_S = HEARTBEAT_S  # while a started run's stream is silent, its lease is read this often
# a Target's refusals (with its "replica") that another replica may not give: its KV, its engine stuck
REFUSALS = ("RESOURCE_EXHAUSTED", "UNAVAILABLE")
log = logging.getLogger(__name__)


@dataclass
class Call:
    """One Solve's state: the stream it relays, its first event's time, whether the result came,
    the replicas that refused it."""

    t0: float
    stream: object = None
    first: float | None = None
    got_result: bool = False
    refused: bool = False  # every replica refused the run before it started: nothing to cancel
    replica: str = ""  # the replica its last "started" event came from
    lost: str = ""  # the replica lost (its id) while no other has started the run: no Target ends its record
    avoid: tuple[str, ...] = ()

    def try_elsewhere(self, error: dict, replicas: int) -> bool:
        """A replica refused the run for its KV (RESOURCE_EXHAUSTED), or as its engine is stuck (UNAVAILABLE,
        ``target_service.EngineStuck``): True (and that replica avoided from now on) while some of the
        ``replicas`` have not refused it yet; False: no replica can hold it."""
        who = error.get("replica", "")
        if error.get("code") not in REFUSALS or not who or who in self.avoid:
            return False
        if len(self.avoid) + 1 >= replicas:
            return False
        self.avoid += (who,)
        return True


class RPCError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


@serve.deployment(max_ongoing_requests=256, ray_actor_options={"num_cpus": 0})
class Coordinator:
    def __init__(self, target, tree: str = "redis://127.0.0.1:6379/0", prefix: str = "gambit:",
                 defaults: dict | None = None, token_env: str = "GAMBIT_TOKEN", max_resumes: int = 2,
                 resume_wait_s: float = 120.0, target_replicas: int = 1,
                 retention_s: float = RETENTION_S) -> None:
        """``max_resumes``: times a run is taken over after its Target replica was lost;
        ``resume_wait_s``: how long each takeover may wait for a live replica; ``target_replicas``:
        how many replicas a run refused for its KV may be tried on."""
        self.pb2, _ = load("reasoning")
        # The handle's transport comes from the process that built the app (the driver of `gambit
        # serve` or a test), which may have imported Serve before SERVE_ENV was set: Ray actor calls
        # then, where this node asks for gRPC (RAY_SERVE_USE_GRPC_BY_DEFAULT). Follow this node:
        # over gRPC a one-run solve cost the Coordinator 5.2 ms of CPU instead of 10.1 on 2 cores.
        grpc_transport = os.environ.get("RAY_SERVE_USE_GRPC_BY_DEFAULT", "0") == "1"
        self.target = target.options(_by_reference=not grpc_transport)
        self.stream = self.target.options(stream=True)  # one handle for every run, not one per Solve
        self.tree = open_tree_view(tree, prefix, retention_s=retention_s)
        self.defaults = server_defaults(defaults)
        if max_resumes < 0 or resume_wait_s <= 0:
            raise ValueError(f"max_resumes must be >= 0 and resume_wait_s > 0, got {max_resumes}, "
                             f"{resume_wait_s}")
        self.max_resumes, self.resume_wait_s = max_resumes, resume_wait_s
        self.target_replicas = max(1, int(target_replicas))
        self.token = read_token(token_env)
        self.metrics = ray_metrics(("gambit_num_requests_waiting", "gambit_time_to_first_token_seconds",
                                    "gambit_e2e_request_latency_seconds", "gambit_request_errors_total"))
        self.waiting = 0
        self.metrics.set("gambit_num_requests_waiting", 0)
        # Ray drops a gauge that was not set for ~2 export intervals: keep it fresh while idle (ops).
        threading.Thread(target=self._refresh_gauges, name="gauges", daemon=True).start()
        threading.Thread(target=self._sweep, name="lost-runs", daemon=True).start()

    def _refresh_gauges(self) -> None:
        while True:
            time.sleep(5.0)
            self.metrics.set("gambit_num_requests_waiting", self.waiting)

    def _sweep(self, every_s: float = SWEEP_S, rounds: int | None = None) -> None:
        """End the runs of replicas whose lease lapsed, every ``every_s`` (``run_records.sweep_lost``):
        nobody else may ever read them. ``rounds``: stop after that many (tests)."""
        swept: dict[str, str] = {}
        while rounds is None or rounds > 0:
            time.sleep(every_s)
            rounds = None if rounds is None else rounds - 1
            try:
                ended = sweep_lost(self.tree, swept)
            except Exception as e:  # noqa: BLE001 — the next sweep may read
                log.warning("lost runs not swept: %s: %s", type(e).__name__, e)
                continue
            if ended:
                log.warning("ended %d run(s) whose Target replica stopped beating: %s", len(ended),
                            ", ".join(ended[:10]) + (" ..." if len(ended) > 10 else ""))

    # -- helpers -------------------------------------------------------------------------------
    def _check(self, grpc_context) -> None:
        if not check_token(grpc_context.invocation_metadata(), self.token):
            raise RPCError(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

    def _fail(self, grpc_context, e: Exception, rpc: str):
        if isinstance(e, StoreUnavailable):
            e = RPCError(grpc.StatusCode.UNAVAILABLE, str(e))
        elif isinstance(e, ValueError):
            e = RPCError(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        elif not isinstance(e, RPCError):
            e = RPCError(grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}")
        self.metrics.inc("gambit_request_errors_total", code=e.code.name, rpc=rpc)
        grpc_context.set_code(e.code)
        grpc_context.set_details(e.message)
        raise RuntimeError(e.message) from None  # plain and picklable: the proxy reads the code set above

    # -- RPCs ----------------------------------------------------------------------------------
    async def Solve(self, request, grpc_context):  # noqa: N802 — the RPC's name
        """The run's events, then its Result. A Target stream that breaks before the Result with anything
        but a Target's own error — a Ray actor error no replica took over (``TargetLost``), or the
        RuntimeError Serve raises once the replica holding the run shuts down — ends the run as failed
        in its record (``_target_lost``): the client gets UNAVAILABLE and GetRun that run, failed, with
        the same message. The record of a Solve that no Target was asked for never stays "queued"."""
        call = Call(time.perf_counter())
        run_id, claimed = "", False
        try:
            self._check(grpc_context)
            problem, cfg = from_request(request, self.defaults)
            run_id = check_run_id(request.run_id) if request.run_id else uuid.uuid4().hex[:16]
            # written before the run starts (a late "queued" must never overwrite the Target's status),
            # and only where no run holds the id: a finished run's record and tree stay what GetRun reads
            old = await self._claim(run_id, status="queued",
                                    request=MessageToDict(request, preserving_proto_field_name=True),
                                    settings={k: getattr(cfg, k) for k in SETTINGS})
            if old is not None:  # one held by a replica that stopped beating says it ended
                old = await asyncio.to_thread(end_if_lost, self.tree, run_id, old)
                raise RPCError(grpc.StatusCode.ALREADY_EXISTS, taken_message(run_id, old))
            claimed = True
            self.waiting += 1
            self.metrics.set("gambit_num_requests_waiting", self.waiting)
            async for ev in self._relay(call, (run_id, problem, asdict(cfg)), cfg.method):
                yield ev
        except Exception as e:  # noqa: BLE001 — every failure becomes a status code
            if isinstance(e, TargetLost) or (call.stream is not None and not call.got_result
                                             and not isinstance(e, RPCError)):
                e = await self._target_lost(run_id, e, time.perf_counter() - call.t0)
            elif claimed and call.stream is None:  # no Target was asked (the handle raised): end it here
                d = ended_result(run_id, "failed", f"{type(e).__name__}: {e}", time.perf_counter() - call.t0)
                await asyncio.to_thread(end_queued_quietly, self.tree, run_id, d)
            self._fail(grpc_context, e, "Solve")
        finally:
            if call.first is None and claimed:
                self.waiting -= 1
                self.metrics.set("gambit_num_requests_waiting", self.waiting)
            if call.stream is not None and not (call.got_result or call.refused):  # went away: free the KV
                call.stream.cancel()
                total_s = time.perf_counter() - call.t0
                asyncio.get_running_loop().run_in_executor(None, self._flag_cancel, run_id,
                                                           call.first is None, total_s, call.lost)

    async def _claim(self, run_id: str, **fields) -> dict | None:
        """``tree.claim_run`` off the loop. A Solve cancelled meanwhile (its client left, its deadline
        passed) has its claim written all the same by the thread: that record then ends cancelled, as a
        queued run's whose client left does (``flag_cancel``), not "queued" for the whole retention."""
        claim = asyncio.ensure_future(asyncio.to_thread(self.tree.claim_run, run_id, **fields))
        try:
            return await asyncio.shield(claim)
        except asyncio.CancelledError:
            loop = asyncio.get_running_loop()
            claim.add_done_callback(lambda f: f.cancelled() or f.exception() is not None
                                    or f.result() is not None
                                    or loop.run_in_executor(None, self._flag_cancel, run_id, True))
            raise

    async def _relay(self, call: Call, args: tuple, method: str):
        """The run's events from its Target as SolveEvents. A replica that refuses the run for its KV
        is avoided on the next try while others remain (``kv_router``); a replica that dies mid-run
        hands the run to another one (``takeover``)."""
        run_id = args[0]
        call.stream = self.stream.run.remote(*args)
        lost = Lost(self.max_resumes, self.resume_wait_s)
        resume = False  # once a replica was lost, every re-send rebuilds the run from its tree
        while not call.got_result:
            retry = False
            try:
                async for d in self._events(call, run_id, lost):
                    if d.get("unstarted"):  # cancelled while Serve queued it (``_events``)
                        call.got_result = True
                        yield self._result(d, call, method)
                        return
                    if d["kind"] == "error":
                        if call.try_elsewhere(d, self.target_replicas):
                            retry = True
                            break
                        if call.first is None:  # refused before it started: its id is free for a retry
                            call.refused = True  # (no cancel flag either: it would stop the retry)
                            await asyncio.to_thread(self.tree.delete_run, run_id)
                        else:
                            await asyncio.to_thread(end_failed, self.tree, run_id, d["message"],
                                                    time.perf_counter() - call.t0)
                        raise RPCError(getattr(grpc.StatusCode, d["code"]), d["message"])
                    if d["kind"] == "started":
                        call.replica = str(d.get("replica") or "")
                    if call.first is None:
                        call.first = self._first_event(call.t0, method)
                        asyncio.get_running_loop().run_in_executor(None, put_fields, self.tree, run_id,
                                                                   {"first_event_s": call.first})
                    if d["kind"] == "started" and d.get("resumed"):
                        lost.taken_over()
                        call.lost = ""
                        await asyncio.to_thread(self.tree.put_run, run_id, status="running",
                                                replica=d["replica"], resumes=lost.resumes)
                    if d["kind"] == "result":
                        call.got_result = True
                        yield self._result(d, call, method)
                    elif d["kind"] == "started":
                        ev = event_msg(self.pb2, d)
                        ev.started.settings.CopyFrom(settings_msg(self.pb2, args[2]))
                        yield ev
                    else:
                        yield event_msg(self.pb2, d)
                if retry:  # a takeover refused for its KV stays a takeover (else it restarted afresh)
                    call.stream = self.stream.run.remote(*args, avoid=call.avoid, resume=resume)
                elif not call.got_result:  # the stream ended without a result: nothing to take over
                    raise RPCError(grpc.StatusCode.INTERNAL, "target stream ended without a result")
            except Exception as e:  # noqa: BLE001 — a lost replica is taken over, the rest is raised
                if isinstance(e, RPCError) or call.got_result or not target_died(e):
                    raise
                if isinstance(e, LeaseLost):  # alive to Serve, so it may be routed to: avoided
                    call.stream.cancel()  # its run stops there (freeing its KV) if its engine moves again
                    call.avoid += (e.replica,) if e.replica not in call.avoid else ()
                # no takeover was asked for yet: its record names the lost replica (its started event
                # may not have come), and a client that leaves from now on ends the run only there
                call.lost = await asyncio.to_thread(held_by, self.tree, run_id) or call.replica
                await lost.wait(e)  # raises TargetLost when the run cannot be taken over
                rec = await asyncio.to_thread(self.tree.get_run, run_id)
                # it ended just before its replica went (a lease that ran out meanwhile is not an end
                # here: this Coordinator is taking the run over, ``run_records.end_if_lost``)
                if rec and rec.get("result") and not rec["result"].get("lost"):
                    call.got_result = True
                    yield self._result(rec["result"], call, method)
                    return
                resume = True
                call.stream = self.stream.run.remote(*args, avoid=call.avoid, resume=True)

    async def _events(self, call: Call, run_id: str, lost: Lost | None = None):
        """``call.stream``'s dicts. While none has come (the run waits in Serve's queue, no Target admitted
        it) its cancel flag is read every ``QUEUED_POLL_S``: a flagged run ends here at once, with a
        cancelled result marked ``unstarted``, where it ended only once a Target slot freed. Once it
        started on a replica, a silent stream has that replica's lease read every ``LEASE_POLL_S``:
        lapsed, it is ``LeaseLost`` (its engine stopped, the stream would wait for ever). A re-sent run
        that no replica starts gives up at the takeover's deadline (``Lost.overdue``)."""
        it = call.stream.__aiter__()
        started = ""  # the replica this stream's run started on
        while True:
            nxt = asyncio.ensure_future(it.__anext__())
            nxt.add_done_callback(lambda f: f.cancelled() or f.exception())  # read even when left behind
            try:
                while not (await asyncio.wait({nxt}, timeout=self._poll_s(call, started, lost)))[0]:
                    if call.first is None:
                        reason = await asyncio.to_thread(flagged, self.tree, run_id)
                        if reason:
                            call.stream.cancel()
                            total_s = time.perf_counter() - call.t0
                            d = ended_result(run_id, "cancelled", reason + UNSTARTED, total_s)
                            await asyncio.to_thread(end_queued_quietly, self.tree, run_id, d)
                            yield d | {"unstarted": True}
                            return
                    elif started:
                        if await asyncio.to_thread(lease_lapsed, self.tree, run_id, started):
                            raise LeaseLost(started)
                    elif lost is not None and (late := lost.overdue()) is not None:
                        raise late
            finally:
                if not nxt.done():
                    nxt.cancel()
            try:
                d = nxt.result()
            except StopAsyncIteration:
                return
            if d.get("kind") == "started":
                started = str(d.get("replica") or "")
            yield d

    def _poll_s(self, call: Call, started: str, lost: Lost | None) -> float | None:
        """How long a silent stream is waited on before ``_events`` looks again (None: for ever)."""
        if call.first is None:
            return QUEUED_POLL_S
        if started:
            return LEASE_POLL_S
        if lost is not None and lost.deadline is not None:
            return max(0.01, min(LEASE_POLL_S, lost.deadline - lost.clock()))
        return None

    def _first_event(self, t0: float, method: str) -> float:
        first = time.perf_counter() - t0
        self.waiting -= 1
        self.metrics.set("gambit_num_requests_waiting", self.waiting)
        self.metrics.observe("gambit_time_to_first_token_seconds", first, method=method)
        return first

    def _result(self, d: dict, call: Call, method: str):
        e2e = time.perf_counter() - call.t0
        if d.get("status") == "failed":  # the RPC ends OK with a failed run: the error alert must see it
            self.metrics.inc("gambit_request_errors_total", code="INTERNAL", rpc="Solve")
        else:
            self.metrics.observe("gambit_e2e_request_latency_seconds", e2e, method=method)
        # request to result, as the Coordinator saw it: the Target's own clock starts at admission (after
        # any time in Serve's queue) and again on the replica that takes a run over. Kept beside the
        # Target's result in the record, for GetRun.
        asyncio.get_running_loop().run_in_executor(None, put_fields, self.tree, d["run_id"], {"total_s": e2e})
        return self.pb2.SolveEvent(result=result_msg(self.pb2, {**d, "total_s": e2e},
                                                     first_event_s=call.first or 0.0))

    async def _target_lost(self, run_id: str, e: Exception, total_s: float = 0.0) -> RPCError:
        """The run ends in Redis as ``failed`` (``run_records.end_lost``); the client gets UNAVAILABLE."""
        message = await asyncio.to_thread(end_lost, self.tree, run_id, e, total_s)
        return RPCError(grpc.StatusCode.UNAVAILABLE, message)

    def _flag_cancel(self, run_id: str, unstarted: bool = False, total_s: float = 0.0,
                     lost: str = "") -> None:
        """A Solve whose client went away: ``run_records.flag_cancel`` (``lost``: the replica it lost)."""
        flag_cancel(self.tree, run_id, unstarted, total_s, lost)

    async def _known_run(self, request, grpc_context) -> tuple[str, dict]:
        """Authorised request for a run that exists: (run id, its record), else an RPCError. A run whose
        Target replica stopped beating ends here as failed (``run_records.end_if_lost``)."""
        self._check(grpc_context)
        run_id = check_run_id(request.run_id)
        try:
            rec = await asyncio.to_thread(self.tree.get_run, run_id)
        except ValueError as e:  # a record this version cannot read (tree_view): not the caller's argument
            raise RPCError(grpc.StatusCode.INTERNAL, str(e)) from None
        if rec is None:
            raise RPCError(grpc.StatusCode.NOT_FOUND, f"run_id: no run {run_id!r}")
        return run_id, await asyncio.to_thread(end_if_lost, self.tree, run_id, rec)

    async def GetRun(self, request, grpc_context):  # noqa: N802
        try:
            run_id, rec = await self._known_run(request, grpc_context)
            n = await asyncio.to_thread(self.tree.num_traces, run_id)
            return run_info(self.pb2, run_id, rec, n)
        except Exception as e:  # noqa: BLE001
            self._fail(grpc_context, e, "GetRun")

    async def CancelRun(self, request, grpc_context):  # noqa: N802
        try:
            run_id, rec = await self._known_run(request, grpc_context)
            if rec.get("status") in ENDED:
                return self.pb2.CancelRunResponse(run_id=run_id, cancelled=False, status=rec["status"])
            await asyncio.to_thread(self.tree.request_cancel, run_id)
            # a queued run ends now: no Target holds it (its relay sees the flag, a Target refuses it)
            if rec.get("status") == "queued" and await asyncio.to_thread(cancel_queued, self.tree, run_id):
                return self.pb2.CancelRunResponse(run_id=run_id, cancelled=True, status="cancelled")
            try:  # fast path: the replica the router picks stops it now if it holds it (one Target:
                # always); the flag above reaches whichever replica holds it within its poll interval
                await asyncio.wait_for(self.target.cancel.remote(run_id), timeout=2.0)
            except Exception:  # noqa: BLE001 — best effort
                pass
            return self.pb2.CancelRunResponse(run_id=run_id, cancelled=True, status="cancelling")
        except Exception as e:  # noqa: BLE001
            self._fail(grpc_context, e, "CancelRun")
