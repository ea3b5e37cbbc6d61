"""A bounded stand-in for the Kubernetes API server on 127.0.0.1: serves a RayService (the chart's
rendered object plus a status of the CRD's shape) and the worker pods (built from the kubernetes
client's own models). `readiness` advances one step per RayService GET, so `wait` can be tested."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from kubernetes import client

CLUSTER = "gambit-raycluster-x7k2p"
T0 = "2026-11-30T00:00:00Z"


def rayservice_status(step: str) -> dict:
    """`step`: "starting" (nothing up), "deploying" (cluster up, app deploying), "ready"."""
    if step == "starting":
        return {"serviceStatus": "", "conditions": [
            {"type": "Ready", "status": "False", "reason": "Initializing", "message": "cluster is starting",
             "lastTransitionTime": T0, "observedGeneration": 1}]}
    deploying = step == "deploying"
    deps = {"Target": {"status": "UPDATING" if deploying else "HEALTHY", "message": ""},
            "Scorer": {"status": "HEALTHY", "message": ""},
            "Coordinator": {"status": "HEALTHY", "message": ""}}
    return {
        "serviceStatus": "" if deploying else "Running",
        "numServeEndpoints": 0 if deploying else 2,
        "observedGeneration": 1,
        "conditions": [
            {"type": "Ready", "status": "False" if deploying else "True",
             "reason": "ServeApplicationsNotReady" if deploying else "NonZeroServeEndpoints",
             "message": "Serve applications are deploying" if deploying else "Number of serve endpoints is 2",
             "lastTransitionTime": T0, "observedGeneration": 1},
            {"type": "UpgradeInProgress", "status": "False", "reason": "NoActiveCluster" if deploying
             else "NoPendingCluster", "message": "", "lastTransitionTime": T0, "observedGeneration": 1}],
        "activeServiceStatus": {
            "rayClusterName": CLUSTER,
            "applicationStatuses": {"gambit": {
                "status": "DEPLOYING" if deploying else "RUNNING",
                "message": "Deploying app 'gambit'" if deploying else "",
                "serveDeploymentStatuses": deps}},
        },
    }


def pod(name: str, group: str, ready: bool, gpu: bool) -> client.V1Pod:
    limits = {"cpu": "8", "memory": "48Gi", **({"nvidia.com/gpu": "1"} if gpu else {})}
    return client.V1Pod(
        api_version="v1", kind="Pod",
        metadata=client.V1ObjectMeta(name=name, namespace="serving", labels={
            "ray.io/cluster": CLUSTER, "ray.io/group": group, "ray.io/node-type": "worker",
            "app.kubernetes.io/instance": "gambit"}),
        spec=client.V1PodSpec(containers=[client.V1Container(
            name="ray-worker", image="gambit:0.1.0",
            resources=client.V1ResourceRequirements(limits=limits, requests=limits))]),
        status=client.V1PodStatus(phase="Running" if ready else "Pending", conditions=[
            client.V1PodCondition(type="PodScheduled", status="True"),
            client.V1PodCondition(type="Ready", status="True" if ready else "False",
                                  reason=None if ready else "ContainersNotReady")]))


class FakeApiServer:
    def __init__(self, rayservice: dict, steps: list[str], gpu_ready_from: int = 0):
        self.rayservice, self.steps, self.gpu_ready_from = rayservice, steps, gpu_ready_from
        self.gets = 0
        self.requests: list[str] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                outer.requests.append(self.path)
                code, body = outer.route(self.path)
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    def step(self) -> str:
        return self.steps[min(self.gets, len(self.steps) - 1)] if self.steps else "missing"

    def rayservice_object(self) -> dict:
        obj = json.loads(json.dumps(self.rayservice))
        obj["metadata"].update(namespace="serving", uid="5f0c1c1e-0000-4000-8000-000000000001",
                               resourceVersion="42", generation=1, creationTimestamp=T0)
        obj["status"] = rayservice_status(self.step())
        return obj

    def route(self, path: str):
        url = urlparse(path)
        with self.lock:
            if url.path == "/apis/ray.io/v1/namespaces/serving/rayservices/gambit":
                if self.step() == "missing":
                    return 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                 "reason": "NotFound", "code": 404,
                                 "message": 'rayservices.ray.io "gambit" not found'}
                obj = self.rayservice_object()
                self.gets += 1
                return 200, obj
            if url.path == "/api/v1/namespaces/serving/pods":
                sel = parse_qs(url.query).get("labelSelector", [""])[0]
                assert sel == f"ray.io/cluster={CLUSTER},ray.io/node-type=worker", sel
                gpu_ready = self.gets > self.gpu_ready_from
                items = [pod("gambit-raycluster-x7k2p-gpu-workers-abcde", "gpu-workers", gpu_ready, True),
                         pod("gambit-raycluster-x7k2p-cpu-workers-fghij", "cpu-workers", False, False)]
                body = client.ApiClient().sanitize_for_serialization(
                    client.V1PodList(api_version="v1", kind="PodList", items=items,
                                     metadata=client.V1ListMeta(resource_version="43")))
                return 200, body
        return 404, {"kind": "Status", "apiVersion": "v1", "code": 404, "message": f"no route {path}"}

    def kubeconfig(self, folder) -> str:
        path = folder / "kubeconfig"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
            "users": [{"name": "u", "user": {"token": "test-token"}}],
            "contexts": [{"name": "fake",
                          "context": {"cluster": "fake", "user": "u", "namespace": "serving"}}]}))
        return str(path)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)
