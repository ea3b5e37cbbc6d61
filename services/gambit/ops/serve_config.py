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

from dataclasses import dataclass, field, replace

CPU_GROUP_RESOURCE = "gambit_cpu_worker"  # advertised by the chart's CPU worker group
GRPC_SERVICER_FUNCTIONS = (
    "gambit.serving.grpc_api.add_ReasoningServiceServicer_to_server",
    "gambit.serving.grpc_api.add_ScorerServiceServicer_to_server",
    "gambit.serving.grpc_api.add_health_servicer",
)
SOLVE_DEFAULTS = (("capacity", 8), ("swap", 2), ("round_interval", 16), ("max_tokens", 320))


@dataclass(frozen=True)
class DeploymentSpec:
    name: str
    num_replicas: int = 1  # replicas of this deployment
    num_cpus: float = 0.0  # CPUs reserved per replica
    num_gpus: float = 0.0  # GPUs reserved per replica
    max_ongoing_requests: int = 64  # requests a replica takes at once before the proxy queues
    resources: tuple[tuple[str, float], ...] = ()  # custom Ray resources per replica

    def __post_init__(self):
        if not self.name.isidentifier():
            raise ValueError(f"deployment name must be an identifier, got {self.name!r}")
        if self.num_replicas < 1:
            raise ValueError(f"{self.name}: num_replicas must be >= 1, got {self.num_replicas}")
        if self.num_cpus < 0 or self.num_gpus < 0:
            raise ValueError(f"{self.name}: num_cpus and num_gpus must be >= 0")
        if self.max_ongoing_requests < 1:
            raise ValueError(f"{self.name}: max_ongoing_requests must be >= 1")

    def to_dict(self) -> dict:
        opts: dict = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.resources:
            opts["resources"] = dict(self.resources)
        return {"name": self.name, "num_replicas": self.num_replicas,
                "max_ongoing_requests": self.max_ongoing_requests, "ray_actor_options": opts}


@dataclass(frozen=True)
class ServeAppSpec:
    grpc_port: int = 9000  # Serve's gRPC proxy (ReasoningService and ScorerService)
    http_port: int = 8000  # Serve's HTTP proxy (Serve starts it; gambit does not use it)
    tree: str = "redis://127.0.0.1:6379/0"  # run store URL (password from GAMBIT_REDIS_PASSWORD)
    prefix: str = "gambit:"  # Redis key prefix
    token_env: str = "GAMBIT_TOKEN"  # env var with the bearer token (unset: no auth)
    model: str = ""  # target model folder ("" = the shipped target)
    scorer: str = ""  # scorer folder ("" = the shipped MLP scorer)
    num_blocks: int = 0  # KV blocks per Target (0 = from the memory budget)
    solve_defaults: tuple[tuple[str, int], ...] = SOLVE_DEFAULTS  # SolveConfig defaults of a run
    deployments: tuple[DeploymentSpec, ...] = field(default_factory=lambda: (
        DeploymentSpec("Target", max_ongoing_requests=64),
        DeploymentSpec("Coordinator", max_ongoing_requests=256),
        DeploymentSpec("Scorer", max_ongoing_requests=32),
    ))

    def __post_init__(self):
        for port in (self.grpc_port, self.http_port):
            if not 1 <= port <= 65535:
                raise ValueError(f"port must be in 1..65535, got {port}")
        if self.grpc_port == self.http_port:
            raise ValueError("grpc_port and http_port must differ")
        names = sorted(d.name for d in self.deployments)
        if names != ["Coordinator", "Scorer", "Target"]:
            raise ValueError(f"deployments must be Target, Coordinator, Scorer; got {names}")

    def deployment(self, name: str) -> DeploymentSpec:
        return next(d for d in self.deployments if d.name == name)


def profile(name: str, spec: ServeAppSpec | None = None) -> ServeAppSpec:
    """``local``: the spec as is. ``kubernetes``: Target on a GPU, the rest on the CPU worker group."""
    spec = spec or ServeAppSpec()
    if name == "local":
        return spec
    if name != "kubernetes":
        raise ValueError(f"profile must be local or kubernetes, got {name!r}")
    deps = tuple(
        replace(d, num_cpus=1.0, num_gpus=1.0) if d.name == "Target"
        else replace(d, num_cpus=1.0, resources=((CPU_GROUP_RESOURCE, 0.01),))
        for d in spec.deployments
    )
    return replace(spec, deployments=deps, tree="redis://gambit-redis:6379/0")


def serve_config(spec: ServeAppSpec) -> dict:
    """A Serve deploy config (the `serve deploy` / KubeRay serveConfigV2 format)."""
    target = spec.deployment("Target")
    gambit_args = {
        "tree": spec.tree, "prefix": spec.prefix, "token_env": spec.token_env,
        "target_replicas": target.num_replicas,
        "coordinator_replicas": spec.deployment("Coordinator").num_replicas,
        "target_gpus": target.num_gpus,
        "target": {"model": spec.model, "scorer": spec.scorer, "num_blocks": spec.num_blocks,
                   "scorer_address": f"127.0.0.1:{spec.grpc_port}"},
        "defaults": dict(spec.solve_defaults),
    }
    apps = [
        {"name": "scorer", "route_prefix": None, "import_path": "gambit.deployments.app:build_scorer",
         "args": {"scorer": spec.scorer, "token_env": spec.token_env},
         "deployments": [spec.deployment("Scorer").to_dict()]},
        {"name": "gambit", "route_prefix": None, "import_path": "gambit.deployments.app:build_gambit",
         "args": gambit_args,
         "deployments": [spec.deployment("Target").to_dict(), spec.deployment("Coordinator").to_dict()]},
    ]
    return {
        "proxy_location": "EveryNode",
        "http_options": {"host": "0.0.0.0", "port": spec.http_port},
        "grpc_options": {"port": spec.grpc_port, "grpc_servicer_functions": list(GRPC_SERVICER_FUNCTIONS)},
        "applications": apps,
    }
