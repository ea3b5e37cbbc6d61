"""`gambit cluster status|wait` with the official kubernetes client against a local API stand-in that
serves objects of the real shapes (checked here against the strict RayService CRD schema)."""

from __future__ import annotations

import time

import pytest
from fake_apiserver import FakeApiServer, pod
from k8s_schemas import crd_errors
from kubernetes import client

from gambit.cli import main
from gambit.ops.cluster import ClusterConfig, api_client, fetch_status, wait_ready


@pytest.fixture(scope="module")
def rayservice(rendered) -> dict:
    (rs,) = [d for d in rendered["default"] if d["kind"] == "RayService"]
    return rs


def _cli(server, tmp_path, *args):
    return main(["cluster", *args, "--kubeconfig", server.kubeconfig(tmp_path), "--name", "gambit",
                 "--namespace", "serving"])


@pytest.mark.parametrize("step", ["starting", "deploying", "ready"])
def test_served_objects_have_the_real_shapes(rayservice, step):
    srv = FakeApiServer(rayservice, [step])
    assert crd_errors(srv.rayservice_object()) == []
    pod_dict = client.ApiClient().sanitize_for_serialization(pod("p", "gpu-workers", True, True))
    assert pod_dict["status"]["conditions"][1] == {"type": "Ready", "status": "True"}


def test_status_ready(rayservice, tmp_path, capsys):
    with FakeApiServer(rayservice, ["ready"]) as srv:
        assert _cli(srv, tmp_path, "status") == 0
    out = capsys.readouterr().out
    assert "Ready                True     NonZeroServeEndpoints" in out
    assert "gambit               RUNNING" in out and "Target             HEALTHY" in out
    assert "GPU worker pods (1/1 ready):" in out and "gpu-workers-abcde" in out
    assert "cpu-workers" not in out.split("GPU worker pods")[1]  # CPU pods are not GPU workers
    assert out.rstrip().endswith("READY")
    assert any(r.startswith("/api/v1/namespaces/serving/pods?") for r in srv.requests)


def test_status_not_ready_names_what(rayservice, tmp_path, capsys):
    with FakeApiServer(rayservice, ["deploying"], gpu_ready_from=99) as srv:
        assert _cli(srv, tmp_path, "status") == 1
    out = capsys.readouterr().out
    assert "NOT READY:" in out
    for part in ("RayService condition Ready=False (ServeApplicationsNotReady",
                 "Serve application gambit is DEPLOYING: Deploying app 'gambit'",
                 "Serve deployment gambit/Target is UPDATING",
                 "GPU worker pods ready 0/1",
                 "GPU worker pod gambit-raycluster-x7k2p-gpu-workers-abcde not Ready (phase Pending, "
                 "ContainersNotReady)"):
        assert part in out


def test_status_missing_rayservice(rayservice, tmp_path, capsys):
    with FakeApiServer(rayservice, []) as srv:
        assert _cli(srv, tmp_path, "status") == 1
    assert "RayService not found" in capsys.readouterr().out


def test_old_operator_without_ready_condition(rayservice, tmp_path):
    with FakeApiServer(rayservice, ["ready"]) as srv:
        cfg = ClusterConfig(namespace="serving", kubeconfig=srv.kubeconfig(tmp_path))
        st = fetch_status(cfg, api_client(cfg))
        st.conditions = []  # KubeRay < 1.3 sets only serviceStatus
        assert st.ready
        st.service_status = "WaitForServeDeploymentReady"
        assert st.problems() == ["RayService serviceStatus is 'WaitForServeDeploymentReady', not 'Running'"]


def test_wait_blocks_until_ready(rayservice, tmp_path):
    steps = ["starting", "starting", "deploying", "deploying", "ready"]
    with FakeApiServer(rayservice, steps, gpu_ready_from=3) as srv:
        cfg = ClusterConfig(namespace="serving", kubeconfig=srv.kubeconfig(tmp_path), timeout_s=20,
                            poll_s=0.05)
        t0 = time.monotonic()
        st = wait_ready(cfg, api_client(cfg))
        assert st.ready and srv.gets == 5  # returned at the first ready poll, not before
        assert time.monotonic() - t0 < 10


def test_wait_times_out_naming_what_is_not_ready(rayservice, tmp_path, capsys):
    with FakeApiServer(rayservice, ["deploying"], gpu_ready_from=10**6) as srv:
        kc = srv.kubeconfig(tmp_path)
        t0 = time.monotonic()
        rc = main(["cluster", "wait", "--kubeconfig", kc, "--namespace", "serving", "--timeout-s", "0.5",
                   "--poll-s", "0.1"])
        took = time.monotonic() - t0
    assert rc == 1 and 0.5 <= took < 5
    err = capsys.readouterr().err
    assert "RayService serving/gambit not ready after 0.5 s" in err
    assert "Serve application gambit is DEPLOYING" in err and "GPU worker pods ready 0/1" in err


@pytest.mark.parametrize("field, value", [("timeout_s", 0), ("timeout_s", float("nan")),
                                          ("poll_s", -1.0), ("poll_s", float("inf"))])
def test_bad_config_is_refused(field, value):
    # NaN passed `<= 0`: a deadline that never came, `gambit cluster wait` waiting for ever
    with pytest.raises(ValueError, match=f"^{field} must be a number of seconds > 0, got"):
        ClusterConfig(**{field: value})


def test_no_configuration_or_no_api_server_is_a_clear_error(tmp_path, monkeypatch, capsys):
    """A traceback before (kubernetes' ConfigException, urllib3's MaxRetryError); now one line and exit 2."""
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config either
    assert main(["cluster", "status"]) == 2
    said = capsys.readouterr().err
    assert "gambit cluster status: error: no Kubernetes configuration: no kubeconfig" in said
    assert main(["cluster", "status", "--kubeconfig", str(tmp_path / "none")]) == 2
    assert f"gambit cluster status: error: --kubeconfig {tmp_path / 'none'}" in capsys.readouterr().err
    import json
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kc = tmp_path / "kubeconfig"
    kc.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    t = time.monotonic()
    assert main(["cluster", "wait", "--kubeconfig", str(kc)]) == 2
    said = capsys.readouterr().err
    assert f"gambit cluster wait: error: the Kubernetes API at http://127.0.0.1:{port}: MaxRetryError" in said
    assert time.monotonic() - t < 60


def test_an_api_server_that_never_answers_ends_the_wait(tmp_path, capsys):
    """It took the connection and said nothing: `cluster wait --timeout-s 0.2` waited for ever (the
    client reads with no timeout); now each read is bounded by the time left and the error is named."""
    import json
    import socket
    import threading

    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(16)  # the kernel accepts; nobody ever reads or answers
    port = lsock.getsockname()[1]
    kc = tmp_path / "kubeconfig"
    kc.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    got = []
    t = threading.Thread(target=lambda: got.append(main(["cluster", "wait", "--kubeconfig", str(kc),
                                                         "--timeout-s", "0.2", "--poll-s", "0.1"])),
                         daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(20)
    lsock.close()
    assert got == [2], "cluster wait still waiting on an API server that never answers"
    assert time.monotonic() - t0 < 20
    assert f"the Kubernetes API at http://127.0.0.1:{port}: " in capsys.readouterr().err
