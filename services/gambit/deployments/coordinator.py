"""``Coordinator`` deployment: the ReasoningService behind Ray Serve's gRPC proxy.

It validates requests, records runs in the tree view (Redis), starts each run on a Target replica
(the run stays pinned there: its KV lives there; Serve's router picks the replica with the fewest
runs in flight among two sampled, and a full replica answers RESOURCE_EXHAUSTED) and relays the
run's events. The tournament itself runs inside the Target next to its engine (see README,
"Architecture"), so a Coordinator holds no run state: any replica serves GetRun/CancelRun.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from dataclasses import asdict

import grpc
from google.protobuf.json_format import MessageToDict, ParseDict
from ray import serve

from gambit.deployments.ray_metrics import ray_metrics
from gambit.serving.convert import event_msg, progress_msg, result_msg
from gambit.serving.protos import load
from gambit.serving.security import check_token
from gambit.serving.solve_config import SolveConfig, check_run_id, from_request
from gambit.serving.tree_view import ENDED, STREAM_CLOSED, StoreUnavailable, open_tree_view


class RPCError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


@serve.deployment(max_ongoing_requests=256, ray_actor_options={"num_cpus": 0})
class Coordinator:
    def __init__(self, target, tree: str = "redis://127.0.0.1:6379/0", prefix: str = "gambit:",
                 defaults: dict | None = None, token_env: str = "GAMBIT_TOKEN") -> None:
        self.pb2, _ = load("reasoning")
        self.target = target
        self.stream = target.options(stream=True)  # one handle for every run, not one per Solve
        self.tree = open_tree_view(tree, prefix)
        self.defaults = SolveConfig(**(defaults or {}))
        self.token = os.environ.get(token_env, "") if token_env else ""
        self.metrics = ray_metrics(("gambit_num_requests_waiting", "gambit_time_to_first_token_seconds",
                                    "gambit_e2e_request_latency_seconds", "gambit_request_errors_total"))
        self.waiting = 0
        self.metrics.set("gambit_num_requests_waiting", 0)
        # Ray drops a gauge that was not set for ~2 export intervals: keep it fresh while idle (ops).
        threading.Thread(target=self._refresh_gauges, name="gauges", daemon=True).start()

    def _refresh_gauges(self) -> None:
        while True:
            time.sleep(5.0)
            self.metrics.set("gambit_num_requests_waiting", self.waiting)

    # -- helpers -------------------------------------------------------------------------------
    def _check(self, grpc_context) -> None:
        if not check_token(grpc_context.invocation_metadata(), self.token):
            raise RPCError(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

    def _fail(self, grpc_context, e: Exception):
        if isinstance(e, StoreUnavailable):
            e = RPCError(grpc.StatusCode.UNAVAILABLE, str(e))
        elif isinstance(e, ValueError):
            e = RPCError(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        elif not isinstance(e, RPCError):
            e = RPCError(grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}")
        self.metrics.inc("gambit_request_errors_total", code=e.code.name)
        grpc_context.set_code(e.code)
        grpc_context.set_details(e.message)
        raise RuntimeError(e.message) from None  # plain and picklable: the proxy reads the code set above

    # -- RPCs ----------------------------------------------------------------------------------
    async def Solve(self, request, grpc_context):  # noqa: N802 — the RPC's name
        t0 = time.perf_counter()
        stream, got_result, first = None, False, None
        run_id = ""
        try:
            self._check(grpc_context)
            problem, cfg = from_request(request, self.defaults)
            run_id = check_run_id(request.run_id) if request.run_id else uuid.uuid4().hex[:16]
            if request.run_id:  # a generated id is new: only a client's own id needs the look-up
                old = await asyncio.to_thread(self.tree.get_run, run_id)
                if old and old.get("status") not in ENDED:
                    raise RPCError(grpc.StatusCode.ALREADY_EXISTS, f"run_id: {run_id!r} is in flight")
            # written before the run starts: a late "queued" must never overwrite the Target's status
            await asyncio.to_thread(self.tree.put_run, run_id, status="queued",
                                    request=MessageToDict(request, preserving_proto_field_name=True))
            self.waiting += 1
            self.metrics.set("gambit_num_requests_waiting", self.waiting)
            stream = self.stream.run.remote(run_id, problem, asdict(cfg))
            async for d in stream:
                if first is None:
                    first = time.perf_counter() - t0
                    self.waiting -= 1
                    self.metrics.set("gambit_num_requests_waiting", self.waiting)
                    self.metrics.observe("gambit_time_to_first_token_seconds", first, method=cfg.method)
                if d["kind"] == "error":
                    await asyncio.to_thread(self.tree.put_run, run_id, status="failed", message=d["message"])
                    raise RPCError(getattr(grpc.StatusCode, d["code"]), d["message"])
                if d["kind"] == "result":
                    got_result = True
                    d = {**d, "first_event_s": first}
                    self.metrics.observe("gambit_e2e_request_latency_seconds", time.perf_counter() - t0,
                                         method=cfg.method)
                    ev = self.pb2.SolveEvent(result=result_msg(self.pb2, d, first_event_s=first))
                else:
                    ev = event_msg(self.pb2, d)
                yield ev
        except Exception as e:  # noqa: BLE001 — every failure becomes a status code
            if stream is not None and not got_result and not isinstance(e, RPCError):
                e = await self._target_lost(run_id, e)
            self._fail(grpc_context, e)
        finally:
            if first is None and stream is not None:
                self.waiting -= 1
                self.metrics.set("gambit_num_requests_waiting", self.waiting)
            if stream is not None and not got_result:  # client went away or error: free the KV
                stream.cancel()
                asyncio.get_running_loop().run_in_executor(None, self._flag_cancel, run_id)

    async def _target_lost(self, run_id: str, e: Exception) -> RPCError:
        """The Target's stream broke (its replica died): the run's KV is gone with it, so the run
        ends in Redis as ``failed`` (GetRun says so) and the client gets UNAVAILABLE to retry."""
        message = f"target lost mid-run ({type(e).__name__}); the run ended as failed"
        try:
            await asyncio.to_thread(self.tree.put_run, run_id, status="failed", message=message)
        except StoreUnavailable:
            pass
        return RPCError(grpc.StatusCode.UNAVAILABLE, message)

    def _flag_cancel(self, run_id: str) -> None:
        """The Target polls these flags too: a stream cancel that is lost still stops the run."""
        try:
            self.tree.request_cancel(run_id, STREAM_CLOSED)
        except StoreUnavailable:
            pass

    async def _known_run(self, request, grpc_context) -> tuple[str, dict]:
        """Authorised request for a run that exists: (run id, its record), else an RPCError."""
        self._check(grpc_context)
        run_id = check_run_id(request.run_id)
        rec = await asyncio.to_thread(self.tree.get_run, run_id)
        if rec is None:
            raise RPCError(grpc.StatusCode.NOT_FOUND, f"run_id: no run {run_id!r}")
        return run_id, rec

    async def GetRun(self, request, grpc_context):  # noqa: N802
        try:
            run_id, rec = await self._known_run(request, grpc_context)
            n = await asyncio.to_thread(self.tree.num_traces, run_id)
            info = self.pb2.RunInfo(run_id=run_id, status=rec.get("status", ""), num_traces=n)
            if rec.get("request"):
                ParseDict(rec["request"], info.request)
            if rec.get("progress"):
                info.last_progress.CopyFrom(progress_msg(self.pb2, rec["progress"]))
            if rec.get("result"):
                info.result.CopyFrom(result_msg(self.pb2, rec["result"]))
            return info
        except Exception as e:  # noqa: BLE001
            self._fail(grpc_context, e)

    async def CancelRun(self, request, grpc_context):  # noqa: N802
        try:
            run_id, rec = await self._known_run(request, grpc_context)
            if rec.get("status") in ENDED:
                return self.pb2.CancelRunResponse(run_id=run_id, cancelled=False, status=rec["status"])
            await asyncio.to_thread(self.tree.request_cancel, run_id)
            try:  # fast path: the replica the router picks stops it now if it holds it (one Target:
                # always); the flag above reaches whichever replica holds it within its poll interval
                await asyncio.wait_for(self.target.cancel.remote(run_id), timeout=2.0)
            except Exception:  # noqa: BLE001 — best effort
                pass
            return self.pb2.CancelRunResponse(run_id=run_id, cancelled=True, status="cancelling")
        except Exception as e:  # noqa: BLE001
            self._fail(grpc_context, e)
