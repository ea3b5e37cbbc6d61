"""The Ray Serve application, described once in Python; `serve_config` turns it into a config that
``ray.serve.schema.ServeDeploySchema`` accepts (deploy/serve*.yaml and the chart's serveConfigV2).

Two profiles: ``local`` (one machine, no GPU: every deployment on CPUs) and ``kubernetes`` (the
Target asks for a GPU, so it lands on the GPU worker group; the Scorer and Coordinator ask for the
custom resource that only the CPU worker group advertises).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

CPU_GROUP_RESOURCE = "gambit_cpu_worker"  # advertised by the chart's CPU worker group
GRPC_SERVICER_FUNCTIONS = (
    "gambit.protos_gen.reasoning_pb2_grpc.add_ReasoningServiceServicer_to_server",
)


@dataclass(frozen=True)
class DeploymentSpec:
    name: str
    num_replicas: int = 1  # replicas of this deployment
    num_cpus: float = 1.0  # CPUs reserved per replica
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
    name: str = "gambit"  # Serve application name (gRPC clients send it as `application` metadata)
    import_path: str = "gambit.deployments.app:build_app"  # application builder
    route_prefix: str = "/"
    grpc_port: int = 9000  # Serve's gRPC proxy
    http_port: int = 8000  # Serve's HTTP proxy (health checks)
    args: tuple[tuple[str, object], ...] = ()  # builder arguments
    deployments: tuple[DeploymentSpec, ...] = field(default_factory=lambda: (
        DeploymentSpec("Target", num_cpus=1.0, max_ongoing_requests=64),
        DeploymentSpec("Scorer", num_cpus=1.0, max_ongoing_requests=128),
        DeploymentSpec("Coordinator", num_cpus=1.0, max_ongoing_requests=256),
    ))

    def __post_init__(self):
        for port in (self.grpc_port, self.http_port):
            if not 1 <= port <= 65535:
                raise ValueError(f"port must be in 1..65535, got {port}")
        if self.grpc_port == self.http_port:
            raise ValueError("grpc_port and http_port must differ")
        names = [d.name for d in self.deployments]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate deployment names: {names}")


def profile(name: str, spec: ServeAppSpec | None = None) -> ServeAppSpec:
    """``local``: the spec as is. ``kubernetes``: Target on a GPU, the rest on the CPU worker group."""
    spec = spec or ServeAppSpec()
    if name == "local":
        return spec
    if name != "kubernetes":
        raise ValueError(f"profile must be local or kubernetes, got {name!r}")
    deps = tuple(
        replace(d, num_gpus=1.0) if d.name == "Target"
        else replace(d, resources=((CPU_GROUP_RESOURCE, 0.01),))
        for d in spec.deployments
    )
    return replace(spec, deployments=deps)


def serve_config(spec: ServeAppSpec) -> dict:
    """A Serve deploy config (the `serve deploy` / KubeRay serveConfigV2 format)."""
    app = {"name": spec.name, "route_prefix": spec.route_prefix, "import_path": spec.import_path}
    if spec.args:
        app["args"] = dict(spec.args)
    app["deployments"] = [d.to_dict() for d in spec.deployments]
    return {
        "proxy_location": "EveryNode",
        "http_options": {"host": "0.0.0.0", "port": spec.http_port},
        "grpc_options": {"port": spec.grpc_port,
                         "grpc_servicer_functions": list(GRPC_SERVICER_FUNCTIONS)},
        "applications": [app],
    }
