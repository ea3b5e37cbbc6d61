"""`gambit cluster status|wait`: is the RayService serving? Read with the official kubernetes client.

Ready means: the RayService's ``Ready`` condition is True (KubeRay >= 1.3; older operators only set
``serviceStatus: Running``), every Serve application of the active cluster is RUNNING with HEALTHY
deployments, and every GPU worker pod the spec asks for exists and is Ready. `problems()` names
whatever is not, so `wait` can say what it was waiting for when it gives up.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import ClassVar

GPU_RESOURCE = "nvidia.com/gpu"
# one read of the API at most (the client's default is none: an API server that took the connection and
# never answered held `cluster status`, and `cluster wait` past its --timeout-s, for ever)
REQUEST_TIMEOUT_S = 30.0


@dataclass
class ClusterConfig:
    FLAG_ERRORS: ClassVar[bool] = True  # gambit.config_cli: its errors name the flags, exit 2
    name: str = "gambit"  # RayService name (the Helm release's fullname)
    namespace: str = "default"  # Kubernetes namespace
    kubeconfig: str | None = None  # kubeconfig file (default: $KUBECONFIG or ~/.kube/config, else in-cluster)
    context: str | None = None  # kubeconfig context (default: current)
    timeout_s: float = 600.0  # seconds to wait for the RayService to serve before giving up (exit 1)
    poll_s: float = 5.0  # seconds between two reads of the RayService's status

    def __post_init__(self):
        for name in ("name", "namespace"):
            if not getattr(self, name).strip():
                raise ValueError(f"{name} must be non-empty, got {getattr(self, name)!r}")
        for name in ("timeout_s", "poll_s"):  # NaN is refused too: a deadline it set never passed
            if not 0 < getattr(self, name) < float("inf"):
                raise ValueError(f"{name} must be a number of seconds > 0, got {getattr(self, name)}")


@dataclass
class PodState:
    name: str
    ready: bool
    phase: str
    reason: str = ""


@dataclass
class ClusterStatus:
    found: bool
    conditions: list[dict] = field(default_factory=list)  # type, status, reason, message
    service_status: str = ""
    cluster_name: str = ""
    applications: dict[str, dict] = field(default_factory=dict)  # name -> {status, message, deployments}
    gpu_pods: list[PodState] = field(default_factory=list)
    gpu_pods_expected: int = 0

    def problems(self) -> list[str]:
        if not self.found:
            return ["RayService not found"]
        out = []
        ready = next((c for c in self.conditions if c.get("type") == "Ready"), None)
        if ready is not None:
            if ready.get("status") != "True":
                out.append(f"RayService condition Ready={ready.get('status')} "
                           f"({ready.get('reason', '')}: {ready.get('message', '')})")
        elif self.service_status != "Running":
            out.append(f"RayService serviceStatus is {self.service_status or 'unset'!r}, not 'Running'")
        if not self.applications:
            out.append("no Serve application reported yet")
        for app, st in sorted(self.applications.items()):
            if st.get("status") != "RUNNING":
                msg = st.get("message", "")
                out.append(f"Serve application {app} is {st.get('status')}" + (f": {msg}" if msg else ""))
            for dep, ds in sorted(st.get("deployments", {}).items()):
                if ds.get("status") != "HEALTHY":
                    out.append(f"Serve deployment {app}/{dep} is {ds.get('status')}: {ds.get('message', '')}"
                               .rstrip(": "))
        ready_pods = sum(p.ready for p in self.gpu_pods)
        if ready_pods < self.gpu_pods_expected:
            out.append(f"GPU worker pods ready {ready_pods}/{self.gpu_pods_expected}")
        for p in self.gpu_pods:
            if not p.ready:
                why = f", {p.reason}" if p.reason else ""
                out.append(f"GPU worker pod {p.name} not Ready (phase {p.phase}{why})")
        return out

    @property
    def ready(self) -> bool:
        return not self.problems()

    def format(self) -> str:
        if not self.found:
            return "RayService not found"
        lines = [f"RayService conditions (cluster {self.cluster_name or '?'}, serviceStatus "
                 f"{self.service_status or '-'}):"]
        lines += [f"  {c.get('type'):<20} {c.get('status'):<8} {c.get('reason', '')}: {c.get('message', '')}"
                  for c in self.conditions] or ["  (none)"]
        lines.append("Serve applications:")
        for app, st in sorted(self.applications.items()):
            lines.append(f"  {app:<20} {st.get('status')}")
            deps = sorted(st.get("deployments", {}).items())
            lines += [f"    {dep:<18} {ds.get('status')}" for dep, ds in deps]
        if not self.applications:
            lines.append("  (none)")
        n_ready = sum(p.ready for p in self.gpu_pods)
        lines.append(f"GPU worker pods ({n_ready}/{self.gpu_pods_expected} ready):")
        lines += [f"  {p.name:<40} {'Ready' if p.ready else 'NotReady':<9} {p.phase} {p.reason}".rstrip()
                  for p in self.gpu_pods] or ["  (none)"]
        lines.append("READY" if self.ready else "NOT READY: " + "; ".join(self.problems()))
        return "\n".join(lines)


class ClusterUnreachable(RuntimeError):
    """No Kubernetes API to ask: no configuration, or the API server did not answer."""


def api_client(cfg: ClusterConfig):
    """A kubernetes ApiClient from the kubeconfig (or the in-cluster service account); none of them:
    ClusterUnreachable saying where it looked."""
    from kubernetes import client, config

    try:
        return config.new_client_from_config(config_file=cfg.kubeconfig, context=cfg.context)
    except (config.ConfigException, OSError) as e:
        if cfg.kubeconfig:
            raise ClusterUnreachable(f"--kubeconfig {cfg.kubeconfig}: {e}") from None
        try:
            config.load_incluster_config()
        except config.ConfigException:
            why = ("no Kubernetes configuration: no kubeconfig ($KUBECONFIG, ~/.kube/config or --kubeconfig) "
                   "and not running inside a cluster")
            raise ClusterUnreachable(why) from None
        return client.ApiClient()


def api_errors() -> tuple[type[BaseException], ...]:
    """What a call to an API server that is down, refuses or forbids raises (the CLI names it)."""
    from kubernetes.client.rest import ApiException
    from urllib3.exceptions import HTTPError

    return ApiException, HTTPError


def _wants_gpu(container: dict) -> bool:
    limits = ((container.get("resources") or {}).get("limits") or {})
    return str(limits.get(GPU_RESOURCE, "0")) not in ("0", "")


def fetch_status(cfg: ClusterConfig, api, timeout_s: float = REQUEST_TIMEOUT_S) -> ClusterStatus:
    """The RayService's status and its GPU worker pods; each API read bounded by ``timeout_s``."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        rs = client.CustomObjectsApi(api).get_namespaced_custom_object(
            "ray.io", "v1", cfg.namespace, "rayservices", cfg.name, _request_timeout=timeout_s)
    except ApiException as e:
        if e.status == 404:
            return ClusterStatus(found=False)
        raise
    status = rs.get("status") or {}
    active = status.get("activeServiceStatus") or {}
    apps = {name: {"status": a.get("status", ""), "message": a.get("message", ""),
                   "deployments": a.get("serveDeploymentStatuses") or {}}
            for name, a in (active.get("applicationStatuses") or {}).items()}
    groups = (rs.get("spec", {}).get("rayClusterConfig") or {}).get("workerGroupSpecs") or []
    gpu_groups = {g["groupName"]: int(g.get("replicas", g.get("minReplicas", 0)) or 0)
                  * int(g.get("numOfHosts", 1))
                  for g in groups
                  if any(_wants_gpu(c) for c in g.get("template", {}).get("spec", {}).get("containers", []))}
    cluster = active.get("rayClusterName", "")
    pods = []
    if cluster and gpu_groups:
        listed = client.CoreV1Api(api).list_namespaced_pod(
            cfg.namespace, label_selector=f"ray.io/cluster={cluster},ray.io/node-type=worker",
            _request_timeout=timeout_s)
        for pod in listed.items:
            if (pod.metadata.labels or {}).get("ray.io/group") not in gpu_groups:
                continue
            conds = {c.type: c for c in (pod.status.conditions or [])}
            ready = conds.get("Ready")
            pods.append(PodState(pod.metadata.name, bool(ready and ready.status == "True"),
                                 pod.status.phase or "Unknown", (ready.reason or "") if ready else ""))
    return ClusterStatus(found=True, conditions=status.get("conditions") or [],
                         service_status=status.get("serviceStatus", ""), cluster_name=cluster,
                         applications=apps, gpu_pods=sorted(pods, key=lambda p: p.name),
                         gpu_pods_expected=sum(gpu_groups.values()))


def wait_ready(cfg: ClusterConfig, api, clock=time.monotonic, sleep=time.sleep) -> ClusterStatus:
    """Poll until ready; TimeoutError naming what is still not ready after `cfg.timeout_s`. A read
    is bounded by the time left (0.25 s at least), so an API server that never answers ends the wait too
    (the client's error: the CLI names it, exit 2)."""
    deadline = clock() + cfg.timeout_s
    while True:
        st = fetch_status(cfg, api, min(REQUEST_TIMEOUT_S, max(0.25, deadline - clock())))
        if st.ready:
            return st
        if clock() >= deadline:
            raise TimeoutError(f"RayService {cfg.namespace}/{cfg.name} not ready after {cfg.timeout_s:g} s: "
                               + "; ".join(st.problems()))
        sleep(min(cfg.poll_s, max(0.0, deadline - clock())))
