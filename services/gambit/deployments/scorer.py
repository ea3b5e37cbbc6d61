"""``Scorer`` deployment: ScorerService behind Ray Serve's gRPC proxy (application "scorer"), and on
each replica's own gRPC endpoint for the Targets.

Requests are validated (INVALID_ARGUMENT naming the field) and micro-batched by ``ScorerCore``;
replicas autoscale on ongoing requests (``deploy/serve.yaml``): the proxy's, which Serve counts, plus
the direct endpoint's, which each replica reports (``record_autoscaling_stats``) to the policy of
``scorer_autoscaling``. A sequence scorer keeps per-trace history in its replica, so for
``kind: sequence`` keep ``max_replicas: 1``.

Direct endpoint: a Target calls Score once per few decode steps, and through the proxy each call
crosses two more processes (proxy, then a Ray actor call), ~7 ms and CPU the engine needs on a small
machine. Each replica therefore also serves ScorerService itself (same core, health, reflection and
bearer token) on ``direct_host``; ``address()`` tells a Target where, and the Target falls back to
the proxy whenever the direct endpoint fails (see ``scorer_client.RemoteScorer``).
"""

from __future__ import annotations

import logging

import grpc
import ray
from ray import serve

from gambit.checks import at_least
from gambit.deployments.ray_metrics import ray_metrics
from gambit.deployments.scorer_autoscaling import DIRECT_ONGOING, POLICY
from gambit.model.loader import model_hidden_size
from gambit.ops.serve_env import check_score_message
from gambit.scoring.spec import load_scorer_spec
from gambit.serving.limits import MAX_KEYS, MAX_ROWS, MAX_STATE_MB
from gambit.serving.ongoing import OngoingCalls
from gambit.serving.protos import load
from gambit.serving.scorer_core import ScorerCore
from gambit.serving.scorer_server import SCORER_METRICS, check_batch_wait_ms, scorer_grpc_server
from gambit.serving.security import check_token, read_token

log = logging.getLogger(__name__)

MAX_ONGOING = 32  # Score calls one replica serves at once, through the proxy and on its direct endpoint each


def _check_one_replica(scorer: str) -> None:
    """A sequence scorer keeps each trace's history in its replica: refuse a deployment that may run
    two (a config naming a sequence scorer folder with the default autoscaling), where each replica
    would score a trace from half of its boundaries."""
    try:
        config = serve.get_replica_context()._deployment_config  # noqa: SLF001 — not public in Serve 2.60
    except Exception:  # noqa: BLE001 — outside Serve (tests build the class directly): nothing to check
        return
    auto = config.autoscaling_config
    most = auto.max_replicas if auto is not None else config.num_replicas
    if most and most > 1:
        raise ValueError(f"Scorer: {scorer!r} is a sequence scorer (per-trace history in its replica) but "
                         f"the deployment may run {most} replicas; set the Scorer's num_replicas to 1 (the "
                         "chart: serve.deployments.Scorer.autoscaling.max_replicas 1)")


def advertised_address(bind_host: str, port: int, node_ip) -> str:
    """The direct endpoint's address for Targets: a wildcard bind advertises this node's IP
    (``node_ip()``), and an IPv6 host is bracketed ("[fd00::5]:7000": bare, "fd00::5:7000" is no
    address a Target can dial)."""
    host = bind_host
    if host in ("0.0.0.0", "::", "[::]"):  # advertise an address others can reach
        host = node_ip()
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


@serve.deployment(max_ongoing_requests=MAX_ONGOING, ray_actor_options={"num_cpus": 0},
                  autoscaling_config={"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 8,
                                      "policy": {"policy_function": POLICY}})
class Scorer:
    def __init__(self, scorer: str = "", hidden_size: int = 0, max_rows: int = MAX_ROWS,
                 batch_wait_ms: float = 0.0, token_env: str = "GAMBIT_TOKEN", direct_host: str = "127.0.0.1",
                 direct_port: int = 0, model: str = "", max_keys: int = MAX_KEYS,
                 max_state_mb: int = MAX_STATE_MB) -> None:
        """``hidden_size`` 0: the width of ``model``, the Targets' model ("" = the shipped target).
        ``batch_wait_ms`` 0: score at once; calls that arrive while a batch is scored go together
        in the next one. Each Target already sends one call at a time with everything that queued up
        meanwhile, so a fixed wait only delays guidance (2 ms of ~7 ms per call through the proxy).
        ``direct_host``: where this replica serves ScorerService itself ("" = proxy only);
        ``direct_port`` 0 = any free port. ``max_keys``: trace histories a sequence scorer keeps, the
        least recently used evicted beyond it (``gambit_scorer_evictions_total``); ``max_state_mb``: the
        same for the MiB of those histories together (an attn history grows with each boundary).
        ``max_rows``: state rows one Score call may carry (more: INVALID_ARGUMENT); refused here where
        a full call would pass the gRPC message cap (``serve_env.check_score_message``)."""
        try:  # 40000 was taken: every call then failed after the core's 30 s with "scoring failed: "
            check_batch_wait_ms(batch_wait_ms)
            sizes = {"max_keys": max_keys, "max_state_mb": max_state_mb, "max_rows": max_rows}
            for name, value in sizes.items():  # 1.5 passed where the scorer keeps no history
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ValueError(f"{name} must be a whole number, got {value!r}")
            at_least(1, **sizes)
            at_least(0, hidden_size=hidden_size)  # -1 reached the scorer's build as a width
        except ValueError as e:
            raise ValueError(f"Scorer: {e}") from None
        self.pb2, _ = load("scorer")
        self.metrics = ray_metrics(SCORER_METRICS)  # the standalone server's, on Ray's metrics
        if not hidden_size:
            try:
                hidden_size = model_hidden_size(model)
            except (OSError, ValueError) as e:
                raise ValueError(f"Scorer: the hidden size of model {model!r} is unknown here ({e}); give "
                                 "hidden_size (the chart's serve.hiddenSize)") from None
        scorer_net = load_scorer_spec(scorer, hidden_size, note=log.warning, max_keys=max_keys,
                                      max_state_mb=max_state_mb)  # bounded from the start
        try:  # a full call must fit the proxy's caps (this node's environment) and the direct endpoint's
            check_score_message(max_rows, scorer_net.hidden_size)
        except ValueError as e:
            raise ValueError(f"Scorer: {e}") from None
        if getattr(scorer_net, "kind", "") == "sequence":
            _check_one_replica(scorer)
        self.core = ScorerCore(scorer_net, max_rows, batch_wait_ms / 1000, metrics=self.metrics)
        self.token = read_token(token_env)
        self.direct, self._address = None, ""
        self.direct_ongoing = OngoingCalls()  # its Score calls in flight: Serve does not see them
        if direct_host:  # as many handler threads as the proxy's calls: 8 capped the count Serve saw at 8
            self.direct, port = scorer_grpc_server(self.core, self.metrics, f"{direct_host}:{direct_port}",
                                                   self.token, workers=MAX_ONGOING,
                                                   ongoing=self.direct_ongoing)
            self._address = advertised_address(direct_host, port, ray.util.get_node_ip_address)

    def address(self) -> dict:
        """This replica's direct ScorerService endpoint ("" if it has none) and its Ray node (a
        loopback address only serves Targets on the same node). Ray handle call."""
        return {"address": self._address, "node": ray.get_runtime_context().get_node_id()}

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's hook (sampled a few times per look-back window): the mean Score calls in flight on
        the direct endpoint since the last sample, which ``scorer_autoscaling_policy`` adds to the
        proxy's ongoing requests. Without it a Scorer busy with its Targets' direct calls never scaled."""
        return {DIRECT_ONGOING: self.direct_ongoing.mean()}

    def _fail(self, grpc_context, code: grpc.StatusCode, message: str, rpc: str = "Score"):
        self.metrics.inc("gambit_request_errors_total", code=code.name, rpc=rpc)
        grpc_context.set_code(code)
        grpc_context.set_details(message)
        raise RuntimeError(message)

    async def Score(self, request, grpc_context):  # noqa: N802 — the RPC's name
        if not check_token(grpc_context.invocation_metadata(), self.token):
            self._fail(grpc_context, grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        try:
            job = self.core.validate(request.states, request.dtype, request.shape, request.trace_ids,
                                     request.forks, request.drops, request.features)
        except ValueError as e:
            self._fail(grpc_context, grpc.StatusCode.INVALID_ARGUMENT, str(e))
        try:  # bounded as the direct endpoint's: a stuck scorer held each proxy call for good
            scores = await self.core.score_async(job)
        except Exception as e:  # noqa: BLE001 — counted and said as the direct endpoint does
            self._fail(grpc_context, grpc.StatusCode.INTERNAL, f"scoring failed: {e}")
        return self.pb2.ScoreResponse(scores=scores.tolist())

    async def Info(self, request, grpc_context):  # noqa: N802
        if not check_token(grpc_context.invocation_metadata(), self.token):
            self._fail(grpc_context, grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token", "Info")
        s = self.core.scorer
        return self.pb2.InfoResponse(kind=s.kind, hidden_size=s.hidden_size, max_rows=self.core.max_rows,
                                     features=self.core.features)

    def __del__(self) -> None:
        if getattr(self, "direct", None) is not None:
            self.direct.stop(0)
