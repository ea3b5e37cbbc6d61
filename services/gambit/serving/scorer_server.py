"""Standalone ScorerService gRPC server (no Ray): ``gambit scorer serve``.

Batched through ``ScorerCore``; health + reflection; optional bearer token and TLS; Prometheus
metrics on its own HTTP port. Payloads are raw bytes + dtype + shape; nothing is unpickled.
"""

from __future__ import annotations

import logging
from concurrent import futures
from dataclasses import dataclass, field
from typing import ClassVar

import grpc

from gambit.checks import at_least
from gambit.ops.serve_env import check_score_message
from gambit.scoring.spec import load_scorer_spec
from gambit.serving.grpc_common import DecodeErrorInterceptor, add_health_and_reflection
from gambit.serving.limits import (
    MAX_BATCH_WAIT_MS,
    MAX_KEYS,
    MAX_ROWS,
    MAX_STATE_MB,
    SCORER_ENDPOINT_MESSAGE_BYTES,
)
from gambit.serving.metrics import Metrics, PrometheusBackend
from gambit.serving.ongoing import OngoingCalls
from gambit.serving.protos import load
from gambit.serving.scorer_core import SCORE_TIMEOUT_S, ScorerCore
from gambit.serving.security import BearerTokenInterceptor, TLSConfig, add_port, read_token

log = logging.getLogger(__name__)

SCORER_METRICS = ("gambit_scorer_latency_seconds", "gambit_scorer_batch_size", "gambit_request_errors_total",
                  "gambit_scorer_evictions_total")
RPCS = ("Score", "Info")  # the ScorerService's methods: the only ``rpc`` labels counted


@dataclass
class ScorerServerConfig:
    """The standalone Scorer server."""

    FLAG_ERRORS: ClassVar[bool] = True  # gambit.config_cli: its errors name the flags, exit 2
    scorer: str = ""  # "" / process | mlp | sequence | confidence[:H] (H: width, else --model's) | folder
    model: str = ""  # which target model's width the scorer must read: a folder or smollm2 ("" = shipped)
    host: str = "127.0.0.1"  # address to bind
    port: int = 50061  # gRPC port (0 = any free port)
    metrics_port: int = 9461  # Prometheus /metrics HTTP port (0 = any free port, -1 = off)
    token_env: str = "GAMBIT_TOKEN"  # environment variable holding the bearer token (unset or empty: no auth)
    tls_cert: str = ""  # PEM server certificate chain ("" = plaintext)
    tls_key: str = ""  # PEM private key of --tls-cert ("" = plaintext)
    tls_client_ca: str = ""  # PEM CA for client certificates (mTLS; "" = none asked)
    max_rows: int = MAX_ROWS  # most state rows in one request (a full one must fit the 256 MiB message cap)
    batch_wait_ms: float = 2.0  # how long the batcher waits for more requests, milliseconds (at most 1000)
    max_batch_rows: int = 1024  # rows scored by one forward at most
    workers: int = 8  # gRPC handler threads
    max_keys: int = MAX_KEYS  # how many trace histories a sequence scorer keeps (least recently used evicted)
    max_state_mb: int = MAX_STATE_MB  # MiB of history a sequence scorer keeps (attn: grows per boundary)
    tls: TLSConfig = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in 0..65535 (0: any free one), got {self.port}")
        if not -1 <= self.metrics_port < 65536:
            raise ValueError(f"metrics_port must be in -1..65535 (-1: none, 0: any free one), got "
                             f"{self.metrics_port}")
        if not self.host:
            raise ValueError("host must be an address to bind, e.g. 127.0.0.1")
        if self.port > 0 and self.port == self.metrics_port:  # the metrics server failed "Address in use"
            raise ValueError(f"port and metrics_port are both {self.port}; they must differ")
        at_least(1, max_rows=self.max_rows, max_batch_rows=self.max_batch_rows, workers=self.workers,
                 max_keys=self.max_keys, max_state_mb=self.max_state_mb)
        check_batch_wait_ms(self.batch_wait_ms)
        model_width(self.model)  # a model that is not there: refused before the scorer loads
        self.tls = TLSConfig(self.tls_cert, self.tls_key, self.tls_client_ca)


def check_batch_wait_ms(ms: float) -> None:
    """ValueError unless 0 <= ms <= MAX_BATCH_WAIT_MS: a longer wait (40000 was taken) failed every call
    after the core's 30 s, and a Target gives up after 2 s anyway."""
    at_least(0, batch_wait_ms=ms)  # NaN too
    if ms > MAX_BATCH_WAIT_MS:
        raise ValueError(f"batch_wait_ms must be at most {MAX_BATCH_WAIT_MS:g} (each call waits it; a "
                         f"Target's call times out after 2 s), got {ms:g}")


def model_width(model: str) -> int:
    """The hidden size of the target ``model`` ("" = the shipped one): the width the served scorer must
    read, or ValueError naming --model."""
    from gambit.model.loader import model_hidden_size

    try:
        return model_hidden_size(model)
    except (OSError, ValueError) as e:
        raise ValueError(f"--model {model!r}: {e}") from None


class ScorerServicer:
    def __init__(self, core: ScorerCore, pb2, metrics: Metrics, ongoing: OngoingCalls | None = None) -> None:
        """``ongoing``: counts the Score calls in flight (a Ray replica reports them to Serve's
        autoscaler)."""
        self.core, self.pb2, self.metrics = core, pb2, metrics
        self.ongoing = ongoing if ongoing is not None else OngoingCalls()

    def Score(self, request, context):
        with self.ongoing:
            return self._score(request, context)

    def _score(self, request, context):
        try:
            job = self.core.validate(request.states, request.dtype, request.shape, request.trace_ids,
                                     request.forks, request.drops, request.features)
        except ValueError as e:
            self.metrics.inc("gambit_request_errors_total", code="INVALID_ARGUMENT", rpc="Score")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        left = context.time_remaining()  # the caller's deadline (None: none): a call it gave up on while
        # queued is not scored for nobody, its forks and drops not applied (the caller sends them again),
        # and its handler thread is free again (it waited out the core's 30 s after a Target's 2 s)
        timeout = SCORE_TIMEOUT_S if left is None else max(0.0, min(SCORE_TIMEOUT_S, left))
        try:
            scores = self.core.score(job, timeout)
        except TimeoutError as e:  # the caller's deadline, else the core's own bound
            code = "DEADLINE_EXCEEDED" if timeout < SCORE_TIMEOUT_S else "INTERNAL"
            self.metrics.inc("gambit_request_errors_total", code=code, rpc="Score")
            context.abort(grpc.StatusCode[code], f"scoring failed: {e}")
        except Exception as e:  # noqa: BLE001
            self.metrics.inc("gambit_request_errors_total", code="INTERNAL", rpc="Score")
            context.abort(grpc.StatusCode.INTERNAL, f"scoring failed: {e}")
        return self.pb2.ScoreResponse(scores=scores.tolist())

    def Info(self, request, context):
        s = self.core.scorer
        return self.pb2.InfoResponse(kind=s.kind, hidden_size=s.hidden_size, max_rows=self.core.max_rows,
                                     features=self.core.features)


def refusal_counter(metrics: Metrics):
    """``BearerTokenInterceptor``'s ``on_deny``: counts the calls it refuses in
    ``gambit_request_errors_total`` (it answers UNAUTHENTICATED before the servicer, which counts every
    other error), as the Ray deployment does."""

    def on_deny(method: str) -> None:
        service, _, rpc = method.rpartition("/")
        if service == "/gambit.v1.ScorerService" and rpc in RPCS:
            metrics.inc("gambit_request_errors_total", code="UNAUTHENTICATED", rpc=rpc)

    return on_deny


@dataclass
class RunningScorer:
    server: grpc.Server
    port: int
    metrics_port: int
    core: ScorerCore
    metrics_backend: PrometheusBackend

    def stop(self, grace: float = 0.5) -> None:
        self.server.stop(grace).wait()
        self.core.close()
        http = getattr(self, "_http", None)
        if http is not None:
            http.shutdown()


def scorer_grpc_server(core: ScorerCore, metrics: Metrics, address: str, token: str = "",
                       tls: TLSConfig | None = None, workers: int = 8,
                       ongoing: OngoingCalls | None = None) -> tuple[grpc.Server, int]:
    """A started ScorerService server over ``core`` (health, reflection, bearer token, TLS); its port.
    The standalone server and each Ray Serve Scorer replica (its direct endpoint) use it. ``ongoing``
    counts its Score calls in flight, up to ``workers`` (more wait in gRPC's queue, uncounted)."""
    pb2, pb2_grpc = load("scorer")
    interceptors = [BearerTokenInterceptor(token, refusal_counter(metrics))] if token else []
    interceptors.append(DecodeErrorInterceptor())  # a request that does not parse: INVALID_ARGUMENT
    # so_reuseport 0: a taken port fails here; with gRPC's default a second server shares it silently and
    # the kernel splits the connections between the two
    server = grpc.server(futures.ThreadPoolExecutor(workers), interceptors=interceptors,
                         options=[("grpc.max_receive_message_length", SCORER_ENDPOINT_MESSAGE_BYTES),
                                  ("grpc.so_reuseport", 0)])
    pb2_grpc.add_ScorerServiceServicer_to_server(ScorerServicer(core, pb2, metrics, ongoing), server)
    add_health_and_reflection(server, [pb2.DESCRIPTOR.services_by_name["ScorerService"].full_name])
    try:
        port = add_port(server, address, tls)
    except RuntimeError as e:  # grpcio raises where older versions returned 0
        raise OSError(f"{address}: cannot listen there (port in use?): {e}") from None
    if not port:
        raise OSError(f"{address}: cannot listen there (port in use?)")
    server.start()
    return server, port


def start_scorer_server(cfg: ScorerServerConfig, scorer=None) -> RunningScorer:
    """Start serving (non-blocking); ``scorer`` overrides ``cfg.scorer`` (an already-built one, with
    the ``max_keys`` it was built with)."""
    backend = PrometheusBackend()
    metrics = Metrics(backend, names=SCORER_METRICS)
    if scorer is None:  # a folder of another width than the model's is refused here, naming --scorer
        width = model_width(cfg.model)
        scorer = load_scorer_spec(cfg.scorer, width, note=log.warning, max_keys=cfg.max_keys,
                                  max_state_mb=cfg.max_state_mb)
        if cfg.model and scorer.hidden_size != width:  # confidence:H / random:kind:H of another width
            raise ValueError(f"--scorer {cfg.scorer!r} reads width {scorer.hidden_size}, but --model "
                             f"{cfg.model!r} has hidden size {width}: every Score call would be refused")
    # no proxy on the way: a full call must fit this server's own cap (else every one was refused)
    check_score_message(cfg.max_rows, scorer.hidden_size, endpoint_only=True)
    core = ScorerCore(scorer, cfg.max_rows, cfg.batch_wait_ms / 1000, cfg.max_batch_rows, metrics)
    token = read_token(cfg.token_env)
    try:
        server, port = scorer_grpc_server(core, metrics, f"{cfg.host}:{cfg.port}", token, cfg.tls,
                                          cfg.workers)
    except OSError:
        core.close()  # its batcher thread joined, not left to the interpreter's exit
        raise
    running = RunningScorer(server, port, -1, core, backend)
    if cfg.metrics_port >= 0:
        try:
            http, _ = backend.serve_http(cfg.metrics_port, cfg.host)
        except OSError as e:  # the gRPC server and the batcher were left running, its port held
            running.stop(0)
            raise OSError(f"metrics_port {cfg.metrics_port}: cannot listen on {cfg.host} ({e})") from None
        running._http = http
        running.metrics_port = http.server_port
    return running
