"""The Ray Serve applications, described once in Python; `serve_config` turns them into a config that
``ray.serve.schema.ServeDeploySchema`` accepts (deploy/serve*.yaml; the chart's serveConfigV2 is tested
equal to the ``kubernetes`` profile).

Two applications share Serve's gRPC proxy (services' `gambit.deployments.app`): ``gambit``
(Coordinator -> Target, answers ReasoningService) and ``scorer`` (answers ScorerService; Targets call
it through the proxy on their own node). Profiles: ``local`` (one machine, what `gambit serve` runs)
and ``kubernetes`` (the Target asks for a GPU, so it lands on the GPU worker group; the Scorer and
Coordinator ask for a custom resource only the CPU worker group advertises).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from gambit.checks import above, at_least, finite
from gambit.cpu_info import check_cpu_weights, check_kv_dtype
from gambit.deployments.scorer_autoscaling import POLICY as SCORER_POLICY  # (imports nothing: no Ray)
from gambit.drafter_map import parse_drafters
from gambit.ops.serve_env import check_score_message
from gambit.serving.limits import MAX_KEYS, MAX_ROWS, MAX_STATE_MB  # (scoring.scorer's: tested equal)
from gambit.serving.solve_config import server_defaults
from gambit.serving.tree_view import RETENTION_S

CPU_GROUP_RESOURCE = "gambit_cpu_worker"  # advertised by the chart's CPU worker group
MAX_NUM_SEQS = 256  # the Target's (EngineConfig's) default engine batch (tested equal)
# the most each may be: the chart's values.schema.json maxima (tested equal), so a value `helm install`
# refuses is refused here too, and the other way round
UPPER_LIMITS = {"max_keys": 2**31 - 1, "max_state_mb": 1 << 20, "max_rows": 1 << 20, "max_num_seqs": 1 << 16}
SCORER_TLS_DIR = "/etc/gambit/scorer-tls"  # where the chart mounts serve.scorerTls.secret on the workers
GRPC_SERVICER_FUNCTIONS = (
    "gambit.serving.grpc_api.add_ReasoningServiceServicer_to_server",
    "gambit.serving.grpc_api.add_ScorerServiceServicer_to_server",
    "gambit.serving.grpc_api.add_health_servicer",
)
SOLVE_DEFAULTS = (("capacity", 8), ("swap", 2), ("round_interval", 16), ("max_tokens", 320))
# Ports Ray itself listens on (the chart refuses the same): a Serve proxy given one started, and then
# it or Ray failed with an error that named neither.
RAY_PORTS = {6379: "Ray's GCS port (and Redis's)", 8265: "Ray's dashboard port",
             10001: "Ray's client server port", 52365: "Ray's dashboard agent port"}


def check_ports(**ports: int) -> None:
    """Each a TCP port, none of Ray's own, no two the same; a one-line error naming the field."""
    seen: dict[int, str] = {}
    for name, port in ports.items():
        if not 0 < port < 65536:
            raise ValueError(f"{name} must be a TCP port (1-65535), got {port}")
        if port in RAY_PORTS:
            raise ValueError(f"{name}: {port} is {RAY_PORTS[port]}; give another")
        if port in seen:
            raise ValueError(f"{name} and {seen[port]} are both {port}; they must differ")
        seen[port] = name


_IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")  # Serve's policy_function form

# Serve's replica health check and stop (DeploymentSpec's defaults are Ray 2.60's, ray/serve/_private/
# constants.py: a check every 10 s, 30 s to answer, unhealthy after 3 failures in a row; a stop polls the
# replica's ongoing requests every 2 s until none is left, then runs __del__, and the controller kills the
# replica 20 s after asking). Written into every config, so `serve deploy`, the chart and `gambit serve`
# (``timing_options``) run the same, and a Serve upgrade that moves its defaults moves none of these.
TARGET_CLOSE_S = 25.0  # Target.__del__ -> TargetService.close() at worst: CLOSE_WAIT_S (10 s) for a wedged
# step, then RecordWriter.flush (5 s) and its thread's join (5 s), then RemoteScorer.close's join (5 s)
TIMING_FIELDS = ("health_check_period_s", "health_check_timeout_s", "graceful_shutdown_wait_loop_s",
                 "graceful_shutdown_timeout_s")
TIMINGS: dict[str, dict[str, float]] = {
    # Every 10 s: check_health fails from run_lease.STUCK_S (120 s) of a wedged step on, and three failures
    # later (~30 s) Serve replaces the replica, its runs already taken over once its lease lapsed (STUCK_S +
    # LEASE_S). 30 s to answer: check_health reads Progress only and never waits for the engine, so only an
    # event loop blocked that long (three times in a row) fails it on a busy node. 60 s to stop: close()
    # runs once the streams have ended (Serve's drain) and needs TARGET_CLOSE_S after a 2 s poll; under
    # Serve's 20 s a wedged step (10 s) and a slow Redis (the writer's 5 s + 5 s) were killed mid-close, and
    # runs streaming at a redeploy were cut at 20 s and taken over instead of ending where they ran.
    "Target": {"health_check_period_s": 10.0, "health_check_timeout_s": 30.0,
               "graceful_shutdown_wait_loop_s": 2.0, "graceful_shutdown_timeout_s": 60.0},
    # A stopped Coordinator ends the runs it relays (their Target streams close with it): it waits as long
    # as the Targets do, so a run a stopping Target finishes still reaches its client. No check_health:
    # Serve's default check (the actor answers).
    "Coordinator": {"health_check_period_s": 10.0, "health_check_timeout_s": 30.0,
                    "graceful_shutdown_wait_loop_s": 2.0, "graceful_shutdown_timeout_s": 60.0},
    # Score calls are short (a Target gives up after RemoteScorer's 2 s) and __del__ stops the direct
    # endpoint at once: Serve's 20 s is ample for a scaled-in replica to finish the proxy's calls.
    "Scorer": {"health_check_period_s": 10.0, "health_check_timeout_s": 30.0,
               "graceful_shutdown_wait_loop_s": 2.0, "graceful_shutdown_timeout_s": 20.0},
}


def timing_options(name: str) -> dict[str, float]:
    """``TIMINGS[name]`` as ``Deployment.options`` kwargs (``build_gambit`` / ``build_scorer``)."""
    return dict(TIMINGS[name])


def check_timings(where: str, t: dict) -> None:
    """Serve's own ranges (checks > 0, stop >= 0), finite, and a stop poll within the stop's time (a longer
    one meant the replica was always killed, never drained); a one-line error naming the field."""
    for k, v in t.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"{where}: {k} must be a number of seconds, got {v!r}")
        finite(**{f"{where}: {k}": v})
    above(0, **{f"{where}: {k}": t[k] for k in TIMING_FIELDS[:2]})
    at_least(0, **{f"{where}: {k}": t[k] for k in TIMING_FIELDS[2:]})
    if t["graceful_shutdown_wait_loop_s"] > t["graceful_shutdown_timeout_s"]:
        raise ValueError(f"{where}: graceful_shutdown_wait_loop_s {t['graceful_shutdown_wait_loop_s']} is "
                         f"above graceful_shutdown_timeout_s {t['graceful_shutdown_timeout_s']}: Serve would "
                         "kill every stopping replica before its first drain poll")


@dataclass(frozen=True)
class DeploymentSpec:
    name: str
    max_ongoing_requests: int = 64  # requests a replica takes at once before the proxy queues
    num_replicas: int | None = None  # None: autoscaling if set, else the builder's choice; set: wins
    num_cpus: float | None = None  # CPUs reserved per replica (None: the deployment's code default)
    num_gpus: float | None = None  # GPUs reserved per replica (None: the deployment's code default)
    resources: tuple[tuple[str, float], ...] = ()  # custom Ray resources per replica
    autoscaling: tuple[tuple[str, float], ...] = ()  # Serve autoscaling_config (unused with num_replicas)
    # autoscaling_config.policy.policy_function, "module:function" ("": Serve's default policy). A config's
    # autoscaling_config replaces the code's whole block, policy included: it must be written here.
    autoscaling_policy: str = ""
    health_check_period_s: float = 10.0  # Serve's defaults; each deployment's own: TIMINGS
    health_check_timeout_s: float = 30.0
    graceful_shutdown_wait_loop_s: float = 2.0
    graceful_shutdown_timeout_s: float = 20.0

    @classmethod
    def of(cls, name: str, **kw) -> DeploymentSpec:
        """``name``'s spec with its ``TIMINGS``."""
        return cls(name, **(TIMINGS[name] | kw))

    @property
    def timings(self) -> dict[str, float]:
        """Serve's health check and stop settings, as a config's deployment names them."""
        return {k: getattr(self, k) for k in TIMING_FIELDS}

    def __post_init__(self):
        if not self.name.isidentifier():
            raise ValueError(f"deployment name must be an identifier, got {self.name!r}")
        if self.num_replicas is not None and self.num_replicas < 1:
            raise ValueError(f"{self.name}: num_replicas must be >= 1, got {self.num_replicas}")
        if (self.num_cpus or 0) < 0 or (self.num_gpus or 0) < 0:
            raise ValueError(f"{self.name}: num_cpus and num_gpus must be >= 0")
        if self.max_ongoing_requests < 1:
            raise ValueError(f"{self.name}: max_ongoing_requests must be >= 1")
        if self.autoscaling_policy and not _IMPORT_PATH.fullmatch(self.autoscaling_policy):
            raise ValueError(f"{self.name}: autoscaling_policy must be module.path:function, got "
                             f"{self.autoscaling_policy!r}")
        check_timings(self.name, self.timings)

    @property
    def autoscaled(self) -> bool:
        """Serve scales it: an autoscaling block and no num_replicas. A count set explicitly wins over
        the block (the chart's rule), so ``replace(scorer, num_replicas=2)`` pins the default-autoscaled
        Scorer at two."""
        return bool(self.autoscaling) and self.num_replicas is None

    @property
    def max_replicas(self) -> int:
        """The most replicas it can run: what the Coordinator is told of the Targets (the replicas a run
        refused for its KV may be tried on)."""
        if self.autoscaled:
            return int(dict(self.autoscaling).get("max_replicas", 1))  # Serve's default max is 1 too
        return self.num_replicas or 1

    def to_dict(self) -> dict:
        out: dict = {"name": self.name}
        if self.num_replicas is not None:
            out["num_replicas"] = self.num_replicas
        out["max_ongoing_requests"] = self.max_ongoing_requests
        out |= self.timings
        if self.autoscaled:
            out["autoscaling_config"] = dict(self.autoscaling)
            if self.autoscaling_policy:
                out["autoscaling_config"]["policy"] = {"policy_function": self.autoscaling_policy}
        opts: dict = {}
        if self.num_cpus is not None:
            opts["num_cpus"] = self.num_cpus
        if self.num_gpus is not None:
            opts["num_gpus"] = self.num_gpus
        if self.resources:
            opts["resources"] = dict(self.resources)
        if opts:
            out["ray_actor_options"] = opts
        return out


def at_most_limits(**values: int) -> None:
    """Each value at most its ``UPPER_LIMITS`` entry; else a one-line ValueError naming the field."""
    for name, v in values.items():
        if not v <= UPPER_LIMITS[name]:
            raise ValueError(f"{name} must be at most {UPPER_LIMITS[name]} (the chart's limit), got {v!r}")


def check_scorer_address(address: str, where: str = "scorer_address") -> None:
    """"" or host:port with a TCP port: a Target given anything else failed every Score call, after start."""
    if not address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{where}: {address!r} is not host:port (e.g. scorer.example.internal:50061)")


def check_scorer_tls(address: str, ca: str, cert: str, key: str, server_name: str) -> None:
    """The Targets' TLS settings for an outside Scorer, checked without reading the files (they are paths on
    the Targets' nodes, e.g. the chart's Secret mount; the Target checks them as it starts)."""
    from gambit.serving.security import check_tls_pairs  # (grpc: imported only where it is checked)

    check_tls_pairs("scorer_tls_", ca, cert, key, server_name, "Scorer")
    if ca and not address:
        raise ValueError("scorer_tls_ca: set only with scorer_address (a TLS ScorerService outside Ray, "
                         "e.g. `gambit scorer serve --tls-cert`): the scorer app behind Serve's proxy is "
                         "plaintext")


def check_engine_batch(max_num_seqs: int, capacity: int, max_rows: int | None = None) -> None:
    """The Targets' engine batch against what fills it: a Gambit run keeps ``capacity`` traces alive at
    once and is refused at admission beyond ``max_num_seqs`` (every request left at the default would be);
    a step's boundaries, up to one row per trace in the batch, go to the Scorer in one call, which it
    refuses beyond ``max_rows`` (None: an outside Scorer, whose own limit this does not know)."""
    if capacity > max_num_seqs:
        raise ValueError(f"max_num_seqs: {max_num_seqs} is below the default capacity {capacity}: every "
                         "Gambit request left at the default would be refused at admission; raise "
                         "max_num_seqs or lower the default capacity")
    if max_rows is not None and max_rows < max_num_seqs:
        raise ValueError(f"max_rows: {max_rows} is below max_num_seqs {max_num_seqs}: a step's boundaries "
                         "(a row per trace in the batch) would be refused by the Scorer and fall back "
                         "unguided; raise max_rows or lower max_num_seqs")


def check_serve_settings(s, capacity: int, width: int = 0) -> None:
    """The checks ``ServeAppSpec`` and ``ServeConfig`` share, one function so they cannot drift (the spec
    took a negative hidden_size, num_blocks or target_gpus that `gambit serve` refused): ``s`` has both
    classes' common fields, ``capacity`` is its default run capacity and ``width`` the model's hidden
    size where known (0: not read here). Each error a one-line ValueError naming the field."""
    from gambit.search.store import check_no_password
    from gambit.serving.scorer_server import check_batch_wait_ms

    at_least(1, retention_s=s.retention_s)
    check_batch_wait_ms(s.batch_wait_ms)  # the Scorer replica's own check, before Ray starts
    sizes = {"max_keys": s.max_keys, "max_state_mb": s.max_state_mb, "max_rows": s.max_rows,
             "max_num_seqs": s.max_num_seqs}
    for name, value in sizes.items():  # the Scorer replica refused 1.5 after Ray started
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be a whole number, got {value!r}")
    at_least(1, **sizes)
    at_most_limits(**sizes)  # the chart's limits
    at_least(0, hidden_size=s.hidden_size, target_threads=s.target_threads, max_resumes=s.max_resumes,
             num_blocks=s.num_blocks)
    above(0, resume_wait_s=s.resume_wait_s)
    if not (s.target_gpus == -1 or s.target_gpus >= 0):
        raise ValueError(f"target_gpus must be >= 0, or -1 (one when the node has a GPU), got "
                         f"{s.target_gpus}")
    if s.spec_max_batch is not None:  # None: the engine's default (0: no cap)
        at_least(0, spec_max_batch=s.spec_max_batch)
    parse_drafters(s.drafters)
    check_cpu_weights(s.cpu_weights)
    check_kv_dtype(s.kv_dtype)
    check_engine_batch(s.max_num_seqs, capacity, None if s.scorer_address else s.max_rows)
    if not s.scorer_address:  # a full Score call must fit the gRPC message caps (an outside one: its own)
        check_score_message(s.max_rows, s.hidden_size or width)
    check_scorer_address(s.scorer_address)
    check_scorer_tls(s.scorer_address, s.scorer_tls_ca, s.scorer_tls_cert, s.scorer_tls_key,
                     s.scorer_tls_server_name)
    check_no_password(s.tree, "tree")  # the password comes from GAMBIT_REDIS_PASSWORD, never the URL


SCORER_AUTOSCALING = (("min_replicas", 1), ("max_replicas", 4), ("target_ongoing_requests", 8),
                      ("upscale_delay_s", 5), ("downscale_delay_s", 60))
# SCORER_POLICY: Serve's count plus the replicas' direct-endpoint calls (``scorer_autoscaling``); Serve's
# default counts only the proxy's, and the Targets' calls go to each replica's own endpoint.


@dataclass(frozen=True)
class ServeAppSpec:
    http_host: str = "127.0.0.1"  # Serve's HTTP proxy address
    grpc_port: int = 9000  # Serve's gRPC proxy (ReasoningService and ScorerService)
    http_port: int = 8000  # Serve's HTTP proxy (Serve starts it; gambit does not use it)
    tree: str = "redis://127.0.0.1:6379/0"  # run store URL (password from GAMBIT_REDIS_PASSWORD)
    prefix: str = "gambit:"  # Redis key prefix; trees go under <prefix>tree (what `inspect --prefix` takes)
    retention_s: float = RETENTION_S  # seconds a finished run's record and tree stay in Redis (GetRun)
    token_env: str = "GAMBIT_TOKEN"  # env var with the bearer token (unset: no auth)
    model: str = ""  # target model: a folder or a name such as smollm2 ("" = the shipped target)
    scorer: str = ""  # scorer spec (gambit.scoring.spec): "" / process | mlp | sequence | confidence | folder
    hidden_size: int = 0  # the Scorer's input width (0 = the model's hidden size, read from its config)
    drafters: str = ""  # Targets' drafters for a real checkpoint: pr=FOLDER,eagle3.1=FOLDER ("" = shipped)
    batch_wait_ms: float = 0.0  # ms the Scorer waits to batch Score calls (0: at once; queued calls batch)
    max_keys: int = MAX_KEYS  # trace histories a sequence scorer keeps per replica (LRU evicted beyond)
    max_state_mb: int = MAX_STATE_MB  # MiB of trace history a sequence scorer keeps per replica (LRU beyond)
    max_rows: int = MAX_ROWS  # state rows the Scorer takes in one Score call at most (more: refused)
    max_num_seqs: int = MAX_NUM_SEQS  # traces in one Target engine batch (a Gambit run's capacity at most)
    # A ScorerService outside Ray the Targets call instead of the scorer app (e.g. `gambit scorer serve
    # --tls-cert`), host:port ("" = the scorer app through Serve's gRPC proxy; set: no scorer app
    # deployed); its TLS files are paths on the Targets' nodes (the chart mounts serve.scorerTls.secret at
    # SCORER_TLS_DIR).
    scorer_address: str = ""
    scorer_tls_ca: str = ""  # PEM CA that verifies the Scorer at scorer_address ("" = plaintext)
    scorer_tls_cert: str = ""  # PEM client certificate for a Scorer that asks for one (--tls-client-ca)
    scorer_tls_key: str = ""  # PEM private key of scorer_tls_cert
    scorer_tls_server_name: str = ""  # the host the Scorer's certificate names, if not scorer_address's
    spec_max_batch: int | None = None  # pr/eagle3.1 draft in steps of <= N traces (0: no cap; None: engine's)
    target_threads: int = 0  # torch threads of each Target's engine (0: every core the node reports)
    max_resumes: int = 2  # times a run is taken over by another Target after its replica was lost
    resume_wait_s: float = 120.0  # seconds each takeover may wait for a live Target replica
    num_blocks: int = 0  # KV blocks per Target (0 = from the memory budget)
    cpu_weights: str = "float32"  # a CPU Target's linear weights: "float32" | "bfloat16" (AMX; fp32 math)
    kv_dtype: str = "auto"  # each Target's KV cache elements: "auto" (the model's) | "float32" | "bfloat16"
    batch_invariant: bool | None = None  # a trace's floats its own in any batch (unset: on where it holds)
    target_gpus: float = -1  # GPUs per Target (-1: one when the cluster has GPUs)
    solve_defaults: tuple[tuple[str, int], ...] = SOLVE_DEFAULTS  # SolveConfig defaults of a run
    deployments: tuple[DeploymentSpec, ...] = field(default_factory=lambda: (
        DeploymentSpec.of("Coordinator", max_ongoing_requests=256),
        DeploymentSpec.of("Target", max_ongoing_requests=64),
        DeploymentSpec.of("Scorer", max_ongoing_requests=32, autoscaling=SCORER_AUTOSCALING,
                          autoscaling_policy=SCORER_POLICY),
    ))

    def __post_init__(self):
        check_ports(grpc_port=self.grpc_port, http_port=self.http_port)
        names = sorted(d.name for d in self.deployments)
        if names != ["Coordinator", "Scorer", "Target"]:
            raise ValueError(f"deployments must be Target, Coordinator, Scorer; got {names}")
        defaults = server_defaults(dict(self.solve_defaults))  # what each Coordinator would refuse at start
        # the model's width is not read here (a path on the Targets' nodes): hidden_size alone, if given
        check_serve_settings(self, defaults.capacity)

    def deployment(self, name: str) -> DeploymentSpec:
        return next(d for d in self.deployments if d.name == name)


def profile(name: str, spec: ServeAppSpec | None = None) -> ServeAppSpec:
    """``local``: the spec as is. ``kubernetes``: Target on a GPU, the rest on the CPU worker group."""
    spec = spec or ServeAppSpec()
    if name == "local":
        return spec
    if name != "kubernetes":
        raise ValueError(f"profile must be local or kubernetes, got {name!r}")
    cpu_group = ((CPU_GROUP_RESOURCE, 0.01),)
    deps = tuple(
        replace(d, num_replicas=None if d.autoscaled else (d.num_replicas or 1), num_cpus=1.0,
                **({"num_gpus": 1.0} if d.name == "Target" else {"num_gpus": 0.0, "resources": cpu_group}))
        for d in spec.deployments
    )
    return replace(spec, deployments=deps, http_host="0.0.0.0", tree="redis://gambit-redis:6379/0",
                   target_gpus=1.0)


def scorer_deployment(spec: ServeAppSpec) -> dict:
    """The Scorer's deployment: a sequence scorer keeps each trace's history in its replica, so it runs
    as one replica, not autoscaled (two would each see half of a trace's boundaries; ``build_scorer``
    pins that in code too). Any other Scorer autoscales in code (``@serve.deployment``), and Serve keeps
    that under a config's ``num_replicas``: a count set here comes with ``autoscaling_config: null``."""
    scorer = spec.deployment("Scorer")
    if spec.scorer not in ("", "process", "mlp"):  # the stateless shipped ones, without importing torch
        from gambit.scoring.spec import keeps_history

        if keeps_history(spec.scorer):
            return replace(scorer, num_replicas=1, autoscaling=()).to_dict()
    out = scorer.to_dict()
    if scorer.num_replicas is not None:
        out["autoscaling_config"] = None
    return out


def target_args(spec: ServeAppSpec) -> dict:
    """The Target's kwargs. An outside Scorer (``scorer_address``) is called as itself: no ``scorer_app``,
    so no application metadata and no direct endpoint of the Ray Scorer looked up in its place."""
    out = {"model": spec.model, "scorer": spec.scorer,
           "scorer_address": spec.scorer_address or f"127.0.0.1:{spec.grpc_port}",
           "scorer_app": "" if spec.scorer_address else "scorer",
           "scorer_tls_ca": spec.scorer_tls_ca, "scorer_tls_cert": spec.scorer_tls_cert,
           "scorer_tls_key": spec.scorer_tls_key, "scorer_tls_server_name": spec.scorer_tls_server_name,
           "num_blocks": spec.num_blocks, "cpu_weights": spec.cpu_weights, "kv_dtype": spec.kv_dtype,
           "batch_invariant": spec.batch_invariant, "drafters": spec.drafters, "threads": spec.target_threads,
           "max_num_seqs": spec.max_num_seqs}
    if spec.spec_max_batch is not None:  # unset: the engine's default, which depends on the Target's CPU
        out["spec_max_batch"] = spec.spec_max_batch
    return out


def scorer_args(spec: ServeAppSpec) -> dict:
    """The Scorer's kwargs (``build_scorer``)."""
    return {"scorer": spec.scorer, "model": spec.model, "hidden_size": spec.hidden_size,
            "batch_wait_ms": spec.batch_wait_ms, "token_env": spec.token_env, "max_keys": spec.max_keys,
            "max_state_mb": spec.max_state_mb, "max_rows": spec.max_rows}


def serve_config(spec: ServeAppSpec) -> dict:
    """A Serve deploy config (the `serve deploy` / KubeRay serveConfigV2 format)."""
    target, coordinator = spec.deployment("Target"), spec.deployment("Coordinator")
    gambit_args = {
        "tree": spec.tree, "prefix": spec.prefix, "retention_s": spec.retention_s,
        "token_env": spec.token_env,
        "target_replicas": target.max_replicas, "target_gpus": spec.target_gpus,
        "coordinator_replicas": coordinator.max_replicas,
        "coordinator": {"max_resumes": spec.max_resumes, "resume_wait_s": spec.resume_wait_s},
        # ``scorer``: the Scorer app's spec, so each Target knows whether to send the confidence features
        "target": target_args(spec),
        "defaults": dict(spec.solve_defaults),
    }
    apps = [
        {"name": "gambit", "route_prefix": "/gambit", "import_path": "gambit.deployments.app:build_gambit",
         "args": gambit_args, "deployments": [coordinator.to_dict(), target.to_dict()]},
    ]
    if not spec.scorer_address:  # an outside Scorer: no Target calls the scorer app, so none is deployed
        apps.append({"name": "scorer", "route_prefix": "/scorer",
                     "import_path": "gambit.deployments.app:build_scorer",
                     "args": scorer_args(spec), "deployments": [scorer_deployment(spec)]})
    return {
        "proxy_location": "EveryNode",
        "http_options": {"host": spec.http_host, "port": spec.http_port},
        "grpc_options": {"port": spec.grpc_port, "grpc_servicer_functions": list(GRPC_SERVICER_FUNCTIONS)},
        "applications": apps,
    }
