"""`examples/solve_from_a_backend.py`'s own checks, with no server: its build step as its docstring
writes it, and the bad inputs that were tracebacks (a stubs folder without stubs, a capacity outside
the request's uint32)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "solve_from_a_backend.py"
ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GAMBIT_TOKEN")}  # grpc alone


def call(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-I", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=60, env=ENV, cwd=cwd)


def test_a_stubs_folder_without_stubs_is_one_line_naming_the_build_step(tmp_path):
    r = call("--stubs", str(tmp_path / "nonexist"), "Compute 1+1.", cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"--stubs {tmp_path / 'nonexist'}: no reasoning_pb2.py there (generate it: "
                               "mkdir -p gen && python -m grpc_tools.protoc")


@pytest.mark.parametrize("value", ["-1", str(2**32), "many"])
def test_a_capacity_the_request_cannot_carry_is_refused_by_argparse(tmp_path, value):
    r = call("--stubs", str(tmp_path), "--capacity", value, "Compute 1+1.", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "argument --capacity:" in r.stderr


def test_the_docstrings_build_step_works_in_a_fresh_checkout(tmp_path):
    """protoc does not create ``gen/``: the docstring's command failed until ``mkdir gen``."""
    shutil.copytree(ROOT / "protos", tmp_path / "protos")
    doc = SCRIPT.read_text().split('"""')[1]
    command = " ".join(line.strip().rstrip("\\") for line in doc.splitlines()
                       if "mkdir -p gen" in line or line.strip().startswith("--grpc_python_out"))
    assert command.startswith("mkdir -p gen && python -m grpc_tools.protoc")
    command = command.replace("python -m", f"{sys.executable} -m", 1)
    r = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "gen" / "reasoning_pb2.py").is_file()
    assert (tmp_path / "gen" / "reasoning_pb2_grpc.py").is_file()
    # the stubs load and the call is made: nothing listens at port 1, so the RPC's own error, rc 2
    r = call("--stubs", "gen", "--address", "127.0.0.1:1", "Compute 1+1.", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("UNAVAILABLE"), r.stderr


def test_the_example_speaks_tls_to_a_proxy_with_tls_ca(tmp_path, self_signed_cert):
    """Its channel was plaintext only. A TLS ScorerService stands in for a TLS proxy: UNIMPLEMENTED (it
    serves no ReasoningService) means the handshake and the call got through."""
    from gambit.scoring import random_scorer
    from gambit.serving.scorer_server import ScorerServerConfig, start_scorer_server

    crt, key = self_signed_cert("gambit.internal")
    cfg = ScorerServerConfig(port=0, metrics_port=-1, token_env="", tls_cert=str(crt), tls_key=str(key))
    srv = start_scorer_server(cfg, scorer=random_scorer("mlp", 16, seed=3))
    try:
        address = ["--address", f"127.0.0.1:{srv.port}"]
        r = call(*address, "--tls-ca", str(crt), "--tls-server-name", "gambit.internal", "Compute 1+1.",
                 cwd=tmp_path)
        assert r.returncode == 2 and r.stderr.startswith("UNIMPLEMENTED"), r.stderr
        r = call(*address, "Compute 1+1.", cwd=tmp_path)  # plaintext: the TLS server closes the socket
        assert r.returncode == 2 and r.stderr.startswith("UNAVAILABLE"), r.stderr
        r = call(*address, "--tls-ca", str(tmp_path / "none.pem"), "Compute 1+1.", cwd=tmp_path)
        assert r.returncode == 2 and "--tls-ca" in r.stderr and "no such file" in r.stderr
    finally:
        srv.stop()
