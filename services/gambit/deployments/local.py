"""``gambit serve``: start Ray (single node, this process), Serve's gRPC proxy and both apps.

Ray 2.60 turns token authentication on by default: ``ray.init`` here creates the local cluster
and writes its token to ``~/.ray/auth_token`` (mode 0600) when none exists, and every process of
this user on this machine reuses it; nothing else is needed for a local run. Serve's HTTP proxy
binds to ``host``; its gRPC proxy binds all interfaces (hard-coded in Ray 2.60), so set a bearer
token (``GAMBIT_TOKEN``) on any machine reachable from others.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from functools import cache
from typing import ClassVar

import grpc

from gambit.checks import at_least
from gambit.cpu_info import default_spec_max_batch
from gambit.ops.serve_env import SERVE_ENV
from gambit.serving.grpc_api import SERVICER_FUNCTIONS
from gambit.serving.limits import MAX_KEYS, MAX_ROWS, MAX_STATE_MB
from gambit.serving.security import read_token
from gambit.serving.solve_config import SolveConfig, server_defaults
from gambit.serving.tree_view import RETENTION_S

# SERVE_ENV: set before Ray starts (its processes inherit it); a value already in the environment
# wins. The chart and deploy/serve.env carry the same (gambit.ops.serve_env).


@dataclass
class ServeConfig:
    """Local Ray Serve deployment of Coordinator, Target and Scorer."""

    FLAG_ERRORS: ClassVar[bool] = True  # gambit.config_cli: its errors name the flags, exit 2
    host: str = "127.0.0.1"  # interface Serve's HTTP proxy binds (0.0.0.0: all; the gRPC proxy binds all)
    grpc_port: int = 9000  # Serve's gRPC proxy port, on every interface (ReasoningService, ScorerService)
    http_port: int = 8000  # Serve's HTTP proxy port (unused by gambit, but Serve starts it)
    metrics_port: int = 8080  # Ray's Prometheus metrics export port (/metrics)
    num_cpus: int = 2  # CPUs Ray may schedule on
    tree: str = "redis://127.0.0.1:6379/0"  # tree view: redis:// URL (password from GAMBIT_REDIS_PASSWORD)
    prefix: str = "gambit:"  # Redis key prefix; trees go under <prefix>tree (what `inspect --prefix` takes)
    retention_s: float = RETENTION_S  # seconds a finished run's record and tree stay in Redis (GetRun)
    token_env: str = "GAMBIT_TOKEN"  # environment variable with the bearer token (unset = no auth)
    model: str = ""  # target model: a folder or a name such as smollm2 ("" = shipped target)
    scorer: str = ""  # scorer spec (gambit.scoring.spec): "" / process | mlp | sequence | confidence | folder
    num_blocks: int = 0  # KV blocks per Target (0 = from the memory budget)
    max_num_seqs: int = 256  # traces in one engine batch of each Target (a Gambit run's capacity at most)
    target_replicas: int = 1  # Target replicas (each run pinned to one)
    target_gpus: float = -1  # GPUs per Target replica (-1 = 1 when the node has a GPU, else 0)
    coordinator_replicas: int = 1  # Coordinator replicas
    max_resumes: int = 2  # times a run is taken over by another Target after its replica was lost
    resume_wait_s: float = 120.0  # seconds each takeover may wait for a live Target replica
    target_threads: int = 0  # torch intra-op threads of each Target's engine (0 = every core of the node)
    # the default is the engine's SpecConfig.max_batch, read from the torch-free gambit.cpu_info
    spec_max_batch: int = default_spec_max_batch()  # pr/eagle3.1 draft in steps of <= N traces (0: no cap)
    drafters: str = ""  # Targets' drafters for a real checkpoint: pr=FOLDER,eagle3.1=FOLDER ("" = shipped)
    cpu_weights: str = "float32"  # each Target's CPU linear weights: "float32" | "bfloat16" (AMX; fp32 math)
    kv_dtype: str = "auto"  # each Target's KV cache elements: "auto" (the model's) | "float32" | "bfloat16"
    batch_invariant: bool | None = None  # a trace's floats its own in any batch (unset: on where it holds)
    batch_wait_ms: float = 0.0  # ms the Scorer waits to batch calls, 0-1000 (0: none; queued calls batch)
    hidden_size: int = 0  # the Scorer's input width (0 = the model's hidden size, read from its config)
    max_keys: int = MAX_KEYS  # trace histories a sequence scorer keeps (least recently used go beyond)
    max_state_mb: int = MAX_STATE_MB  # MiB of trace history a sequence scorer keeps (LRU beyond)
    max_rows: int = MAX_ROWS  # state rows a Score call may carry (more: refused; >= --max-num-seqs)
    scorer_address: str = ""  # host:port of a ScorerService outside Ray (then no scorer app; "" = the app)
    scorer_tls_ca: str = ""  # PEM CA verifying the Scorer at --scorer-address ("" = plaintext)
    scorer_tls_cert: str = ""  # PEM client certificate for a Scorer run with --tls-client-ca (mTLS)
    scorer_tls_key: str = ""  # PEM private key of --scorer-tls-cert
    scorer_tls_server_name: str = ""  # the host the Scorer's certificate names, if not --scorer-address's
    capacity: int = 8  # default C of a run
    swap: int = 2  # default K (0: no swaps; above the capacity: taken as the capacity)
    round_interval: int = 16  # default Δ, decode steps
    max_tokens: int = 320  # default tokens per trace

    def __post_init__(self) -> None:
        from gambit.ops.serve_config import check_ports, check_serve_settings
        from gambit.serving.security import check_client_tls

        check_ports(grpc_port=self.grpc_port, http_port=self.http_port, metrics_port=self.metrics_port)
        at_least(1, num_cpus=self.num_cpus, target_replicas=self.target_replicas,
                 coordinator_replicas=self.coordinator_replicas)
        capacity = self.solve_defaults().capacity  # a bad one stopped every Coordinator, after Ray started
        # the model's width, read from its config once, where a check needs it (a full Score call must fit
        # the gRPC message caps Ray is started with)
        width = cache(self._model_width)
        need_width = not self.hidden_size and not self.scorer_address
        # what the chart's ServeAppSpec checks too: the same function, so the two cannot drift
        check_serve_settings(self, capacity, width() if need_width else 0)
        tls = (self.scorer_tls_ca, self.scorer_tls_cert, self.scorer_tls_key, self.scorer_tls_server_name)
        check_client_tls("scorer_tls_", *tls)  # the files, here: a Target checked them after Ray started
        if self.scorer not in ("", "process", "mlp", "sequence"):  # a folder or a parametrised spec
            from gambit.scoring.spec import check_scorer_spec  # (imports torch: not for the shipped names)

            check_scorer_spec(self.scorer, width())  # a folder loads: weights, kind, width

    def _model_width(self) -> int:
        """The Targets' hidden size, the width a scorer folder must read (0: the model is not there,
        which ``check_startable`` names)."""
        from gambit.model.loader import model_hidden_size

        try:
            return model_hidden_size(self.model)
        except (OSError, ValueError):
            return 0

    def solve_defaults(self) -> SolveConfig:
        return server_defaults({"capacity": self.capacity, "swap": self.swap,
                                "round_interval": self.round_interval, "max_tokens": self.max_tokens})

    def app_args(self) -> dict:
        d = self.solve_defaults()
        return {"tree": self.tree, "prefix": self.prefix, "retention_s": self.retention_s,
                "token_env": self.token_env,
                "target_replicas": self.target_replicas, "coordinator_replicas": self.coordinator_replicas,
                "target_gpus": self.target_gpus,
                "coordinator": {"max_resumes": self.max_resumes, "resume_wait_s": self.resume_wait_s},
                "target": {"model": self.model, "scorer": self.scorer, "num_blocks": self.num_blocks,
                           "scorer_address": self.scorer_address or f"127.0.0.1:{self.grpc_port}",
                           "scorer_app": "" if self.scorer_address else "scorer",
                           "scorer_tls_ca": self.scorer_tls_ca, "scorer_tls_cert": self.scorer_tls_cert,
                           "scorer_tls_key": self.scorer_tls_key,
                           "scorer_tls_server_name": self.scorer_tls_server_name,
                           "threads": self.target_threads, "max_num_seqs": self.max_num_seqs,
                           "spec_max_batch": self.spec_max_batch, "cpu_weights": self.cpu_weights,
                           "kv_dtype": self.kv_dtype, "batch_invariant": self.batch_invariant,
                           "drafters": self.drafters},
                "defaults": {k: getattr(d, k) for k in ("capacity", "swap", "round_interval", "max_tokens")}}

    def scorer_args(self) -> dict:
        """The Scorer's kwargs: the chart's (``serve_config.scorer_args``), from the same fields."""
        from gambit.ops.serve_config import scorer_args

        return scorer_args(self)


def busy_ports(ports, wait_s: float = 0.0) -> list[int]:
    """The ``ports`` something listens on, on any interface of this machine (a bind without
    SO_REUSEPORT fails there), after waiting up to ``wait_s`` for them to be released. gRPC servers bind
    with SO_REUSEPORT, so a second Serve proxy on a taken port starts silently and the kernel splits
    the connections between the two: ``gambit serve`` would say ready while another server answers."""
    deadline = time.monotonic() + wait_s
    while True:
        busy = []
        for port in ports:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no owner
                try:
                    s.bind(("", port))
                except OSError:
                    busy.append(port)
        if not busy or time.monotonic() >= deadline:
            return busy
        time.sleep(0.25)


def check_startable(cfg: ServeConfig) -> None:
    """What would otherwise fail after Ray starts, said before it: ports something listens on, a run
    store that does not answer, a model that is not there (the Targets, Coordinators and Scorer open
    these as they start, and a failure there surfaced as "Failed to update the deployments ['Target']",
    its reason in a replica's log)."""
    from gambit.model.loader import model_hidden_size
    from gambit.serving.tree_view import open_trace_store, open_tree_view

    ports = {"grpc_port": cfg.grpc_port, "http_port": cfg.http_port, "metrics_port": cfg.metrics_port}
    busy = busy_ports(ports.values(), wait_s=5.0)  # a Serve stopping just now releases them in ~1 s
    if busy:
        names = ", ".join(f"{k.replace('_', '-')} {v}" for k, v in ports.items() if v in busy)
        raise OSError(f"in use on this machine: {names} (another `gambit serve` or `serve run`?); "
                      "stop it, or give other ports (--grpc-port, --http-port, --metrics-port)")
    open_tree_view(cfg.tree, cfg.prefix).ping()  # StoreUnavailable naming the URL (--tree)
    open_trace_store(cfg.tree, cfg.prefix)  # the Targets' trace store logs in too (it pings as it opens)
    model_hidden_size(cfg.model)  # FileNotFoundError / ValueError naming the folder or the name


def start(cfg: ServeConfig, wait_s: float = 120.0) -> None:
    """Start everything and return when both apps answer over gRPC."""
    import ray
    from ray import serve
    from ray.serve.config import gRPCOptions

    from gambit.deployments.app import build_gambit, build_scorer

    if not ray.is_initialized():
        check_startable(cfg)
        for k, v in SERVE_ENV.items():
            os.environ.setdefault(k, v)
    for attempt in range(2):  # a busy machine can time the node's start out once
        if ray.is_initialized():
            break
        try:
            ray.init(num_cpus=cfg.num_cpus, include_dashboard=False,
                     _metrics_export_port=cfg.metrics_port, log_to_driver=False)
        except Exception:
            if attempt:
                raise
            ray.shutdown()
    for attempt in range(2):  # on a saturated machine the proxy can miss its readiness checks once
        try:
            grpc_options = gRPCOptions(port=cfg.grpc_port, grpc_servicer_functions=SERVICER_FUNCTIONS)
            serve.start(http_options={"host": cfg.host, "port": cfg.http_port}, grpc_options=grpc_options)
            break
        except Exception:
            if attempt:
                raise
            serve.shutdown()
    scorer_app = not cfg.scorer_address  # an outside Scorer: no Target calls the scorer app
    if scorer_app:
        _deploy(build_scorer(cfg.scorer_args()), "scorer")
    _deploy(build_gambit(cfg.app_args()), "gambit")
    wait_ready(f"127.0.0.1:{cfg.grpc_port}", wait_s, read_token(cfg.token_env), scorer=scorer_app)


def _deploy(app, name: str) -> None:
    """``serve.run``; a replica that fails to start is one ValueError with its reason (Serve raised
    "Failed to update the deployments ['Scorer']" and kept the reason in its logs)."""
    from ray import serve

    try:
        serve.run(app, name=name, route_prefix=f"/{name}", blocking=False)
    except RuntimeError as e:
        try:
            why = deploy_failure(serve.status(), name)
        except Exception:  # noqa: BLE001 — no status to read: Serve's own message
            why = ""
        raise ValueError(why or f"{e} (the reason is in Ray's logs, /tmp/ray/session_latest/logs)") from None


def deploy_failure(status, app: str) -> str:
    """"the <Deployment> deployment failed: <its replica's exception>" for the first failed deployment
    of ``app`` in ``serve.status()``, "" if none: the exception is the last line of Serve's message."""
    application = status.applications.get(app)
    for name, dep in (application.deployments.items() if application else ()):
        if getattr(dep.status, "name", str(dep.status)) in ("DEPLOY_FAILED", "UNHEALTHY"):
            lines = [line.strip() for line in (dep.message or "").splitlines() if line.strip()]
            return f"the {name} deployment failed: {lines[-1] if lines else dep.status}"
    return ""


AUTH_CODES = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


def wait_ready(address: str, wait_s: float = 120.0, token: str = "", application: str = "gambit",
               scorer: bool | None = True) -> None:
    """Until the proxy routes both apps (Serve's own ``ListApplications`` names them) and the Scorer
    answers an authenticated ``Info``; ``application``: the name the ReasoningService app was deployed
    under. No call to the app itself: a probe ``GetRun`` of an unknown id counted a NOT_FOUND in
    ``gambit_request_errors_total`` at every start. A refused token raises PermissionError at once.
    ``scorer`` False: no scorer app (the Targets call an outside Scorer), ``application`` alone, and no
    token checked; None: a server already up, the scorer app probed if it routes one, else as False."""
    from ray.serve.generated import serve_pb2, serve_pb2_grpc

    from gambit.serving.protos import load
    from gambit.serving.security import auth_metadata

    spb2, sg = load("scorer")
    deadline = time.monotonic() + wait_s
    with grpc.insecure_channel(address) as ch:
        api, sstub = serve_pb2_grpc.RayServeAPIServiceStub(ch), sg.ScorerServiceStub(ch)
        md = auth_metadata(token)
        while True:
            try:
                names = api.ListApplications(serve_pb2.ListApplicationsRequest(), timeout=5).application_names
                if application in names and "scorer" in names and scorer is not False:
                    sstub.Info(spb2.InfoRequest(), timeout=5, metadata=md + (("application", "scorer"),))
                    return
                if application in names and not scorer:
                    return
                want = f"{application!r} and 'scorer'" if scorer else repr(application)
                why = f"the proxy routes {sorted(names)}, not yet {want}"
            except grpc.RpcError as e:
                if e.code() in AUTH_CODES:  # no retry makes a wrong token right
                    raise PermissionError(f"{e.code().name}: {e.details()}") from None
                why = f"{e.code()} {e.details()}"
            if time.monotonic() > deadline:
                raise TimeoutError(f"services not ready after {wait_s} s: {why}") from None
            time.sleep(0.3)


def stop() -> None:
    """Shut Serve and this process's Ray down (never ``ray stop``: other Ray users may share the host)."""
    import ray
    from ray import serve

    if ray.is_initialized():
        serve.shutdown()
        ray.shutdown()
