"""``Target`` deployment: one engine + search driver serving many runs; calls the Scorer over gRPC."""

from __future__ import annotations

import asyncio
import os
import time

import ray
from ray import serve
from ray.serve.config import RequestRouterConfig

from gambit.deployments.kv_router import STATS_PERIOD_S, KVAwareRouter
from gambit.deployments.ray_metrics import ray_metrics
from gambit.deployments.run_records import UNSTARTED, ended_result
from gambit.serving.embedded import EmbeddedConfig, build_target
from gambit.serving.security import read_token
from gambit.serving.solve_config import SolveConfig
from gambit.serving.target_service import CancelFlagged, EngineStuck, Overcommitted
from gambit.serving.tree_view import CANCELLED_BY_RPC, STREAM_CLOSED, StoreUnavailable
from gambit.speculative.decodings import DecodingUnavailable


@serve.deployment(max_ongoing_requests=64, ray_actor_options={"num_cpus": 0},
                  request_router_config=RequestRouterConfig(request_router_class=KVAwareRouter,
                                                            request_routing_stats_period_s=STATS_PERIOD_S))
class Target:
    def __init__(self, model: str = "", tree: str = "redis://127.0.0.1:6379/0", prefix: str = "gambit:",
                 scorer_address: str = "127.0.0.1:9000", scorer_app: str = "scorer", scorer: str = "",
                 num_blocks: int = 0, max_num_seqs: int = 256, token_env: str = "GAMBIT_TOKEN",
                 threads: int = 0, scorer_direct: bool = True,
                 spec_max_batch: int = EmbeddedConfig.spec_max_batch, cpu_weights: str = "float32",
                 kv_dtype: str = "auto", batch_invariant: bool | None = None, drafters: str = "",
                 retention_s: float = EmbeddedConfig.retention_s, scorer_tls_ca: str = "",
                 scorer_tls_cert: str = "", scorer_tls_key: str = "",
                 scorer_tls_server_name: str = "") -> None:
        """``scorer_direct``: call a Scorer replica's own gRPC endpoint, not the proxy (the proxy stays
        the fallback); see ``gambit.deployments.scorer``. ``scorer_tls_*``: a TLS Scorer at
        ``scorer_address`` (``gambit scorer serve --tls-cert``; ``EmbeddedConfig``): the Ray Scorer's
        endpoints are plaintext, so no direct one is looked up then."""
        import torch

        # Ray sets OMP_NUM_THREADS to the actor's num_cpus (1 for num_cpus=0): give the engine the cores
        torch.set_num_threads(threads or os.cpu_count() or 1)
        self.loop: asyncio.AbstractEventLoop | None = None  # the loop runs are served on (first run)
        ctx = serve.get_replica_context()
        self.replica = ctx.replica_id.unique_id
        cfg = EmbeddedConfig(model=model, scorer=scorer, scorer_address=scorer_address, tree=tree,
                             prefix=prefix, num_blocks=num_blocks, max_num_seqs=max_num_seqs,
                             spec_max_batch=spec_max_batch, cpu_weights=cpu_weights, kv_dtype=kv_dtype,
                             batch_invariant=batch_invariant, drafters=drafters, retention_s=retention_s,
                             scorer_tls_ca=scorer_tls_ca, scorer_tls_cert=scorer_tls_cert,
                             scorer_tls_key=scorer_tls_key, scorer_tls_server_name=scorer_tls_server_name)
        self.svc = build_target(cfg, ray_metrics(), self.replica, scorer_app,
                                read_token(token_env),
                                resolve=_direct_scorer(scorer_app, lambda: self.loop)
                                if scorer_app and scorer_direct and not scorer_tls_ca else None)

    async def run(self, run_id: str, problem: str, cfg: dict, avoid: tuple = (), resume: bool = False):
        """Stream of dicts for one run: started, progress..., result — or one ``error`` dict.

        ``avoid``: replicas that refused the run (read by the request router, ``kv_router``): for its KV
        (RESOURCE_EXHAUSTED) or because their engine is stuck (UNAVAILABLE, ``EngineStuck``).
        ``resume``: the replica that held the run was lost; rebuild it from its tree in Redis
        (``DriverAdapter.resume``). Its ``started`` dict then says ``resumed``, and ``restored``
        (False: no tree was recorded, the run started afresh under its id)."""
        first, loop = self.loop is None, asyncio.get_running_loop()
        if first:  # now the Scorer's direct endpoint can be looked up (on this loop)
            self.loop = loop
            getattr(self.svc.scorer, "refresh", lambda: None)()
        q: asyncio.Queue = asyncio.Queue()
        admitted = self.svc.submit_run(run_id, problem, SolveConfig(**cfg),
                                       lambda d: loop.call_soon_threadsafe(q.put_nowait, d), resume=resume)
        try:
            restored = await asyncio.shield(asyncio.wrap_future(admitted))  # admitted between steps
        except asyncio.CancelledError:  # the caller left before admission: stop the run once it is in
            # without waiting for a step: admitted already, this runs here, on the event loop
            admitted.add_done_callback(
                lambda f: f.exception() or self.svc.cancel_soon(run_id, "cancelled", STREAM_CLOSED))
            raise
        except CancelFlagged as e:  # cancelled while it waited in Serve's queue (or for a takeover)
            yield await asyncio.to_thread(_refuse_cancelled, self.svc.tree, run_id, str(e), resume)
            return
        except Overcommitted as e:
            yield {"kind": "error", "code": "RESOURCE_EXHAUSTED", "message": str(e), "replica": self.replica}
            return
        except EngineStuck as e:  # its engine is wedged: the Coordinator tries another replica
            yield {"kind": "error", "code": "UNAVAILABLE", "message": str(e), "replica": self.replica}
            return
        except DecodingUnavailable as e:  # a valid decoding this Target has no drafter for
            yield {"kind": "error", "code": "UNIMPLEMENTED", "message": str(e)}
            return
        except ValueError as e:
            yield {"kind": "error", "code": "INVALID_ARGUMENT", "message": str(e)}
            return
        yield {"kind": "started", "run_id": run_id, "replica": self.replica, "resumed": resume,
               "restored": bool(restored)}
        done = False
        try:
            while not done:
                d = await q.get()
                done = d["kind"] == "result"
                yield d
        finally:
            if not done:  # cancelled stream: free the run's KV between two steps (never waited for here)
                self.svc.cancel_soon(run_id, "cancelled", STREAM_CLOSED)

    def cancel(self, run_id: str) -> bool:
        return self.svc.cancel(run_id, "cancelled", CANCELLED_BY_RPC)

    def load(self) -> dict:
        return self.svc.load()

    def check_health(self) -> None:
        """Serve's health check (every ``health_check_period_s``): raises while the engine is stuck in one
        step past ``run_lease.STUCK_S`` or its thread died, so Serve replaces the replica (it was only
        avoided: its heartbeat withheld, its runs refused and taken over, its KV and slot held for ever).
        Reads ``Progress`` only: a long legit step never fails it, and it never waits for the engine."""
        if why := self.svc.health():
            raise RuntimeError(why)

    def record_routing_stats(self) -> dict:
        """What the request router ranks replicas by (``kv_router``): KV blocks free and reserved, and the
        engine batch's slots (``max_num_seqs``; ``batch_slots``: the launched and held runs'); ``stuck``: it
        cannot serve now (``check_health`` fails: it refuses every run until Serve replaces it)."""
        load = self.svc.load()
        keys = ("runs", "reserved_blocks", "num_blocks", "block_size", "max_model_len", "max_num_seqs",
                "batch_slots")
        return {k: load[k] for k in keys} | {"stamp": time.time(), "stuck": bool(self.svc.health())}

    def __del__(self) -> None:
        svc = getattr(self, "svc", None)
        if svc is not None:
            svc.close()


def _refuse_cancelled(tree, run_id: str, reason: str, resume: bool) -> dict:
    """The result of a run cancelled before this Target admitted it (``TargetService`` read its flag at
    admission), written to its record: no engine step is spent on it (it was admitted, stepped and then
    stopped by the flag poll)."""
    d = ended_result(run_id, "cancelled", reason if resume else reason + UNSTARTED)
    try:
        tree.put_run(run_id, status="cancelled", message=d["message"], result=d)
    except StoreUnavailable:
        pass
    return d


def _direct_scorer(app: str, loop_of):
    """Ask the Scorer app, through its Ray handle, for one replica's direct gRPC endpoint. The call
    runs on the replica's event loop (``loop_of()``): a handle's router may live there."""
    handle = None

    async def ask() -> str:
        nonlocal handle
        if handle is None:
            handle = serve.get_deployment_handle("Scorer", app_name=app)
        try:
            got = await handle.address.remote()
        except Exception:
            handle = None  # the app may have been redeployed: a fresh handle next time
            raise
        loopback = got["address"].startswith(("127.", "localhost:", "[::1]"))
        if loopback and got["node"] != ray.get_runtime_context().get_node_id():
            return ""  # that replica's loopback endpoint is on another node: use the proxy
        return got["address"]

    def resolve() -> str:
        loop = loop_of()
        if loop is None:
            raise RuntimeError("no run yet: the replica's event loop is not known")
        return asyncio.run_coroutine_threadsafe(ask(), loop).result(timeout=10)

    return resolve
