"""Helpers shared by the ops tests (imported as ``ops_util``; tests/ops is on sys.path)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "gambit"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
# CRD schemas (RayService, PodMonitor, ServiceMonitor, PrometheusRule) live in shared/ beside the repository.
CRDS = Path(os.environ.get("GAMBIT_K8S_CRDS", REPO.parent / "shared" / "k8s-crds"))


def tool(name: str) -> str:
    """Path of a CLI tool: $GAMBIT_TOOLS_BIN, then .tools/bin (make ops-tools), then PATH."""
    for d in (os.environ.get("GAMBIT_TOOLS_BIN"), REPO / ".tools" / "bin"):
        if d and (Path(d) / name).is_file():
            return str(Path(d) / name)
    found = shutil.which(name)
    if not found:
        pytest.fail(f"{name} not found: run `make ops-tools` (make test does it) or set GAMBIT_TOOLS_BIN")
    return found


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)


def render(helm: str, *args: str) -> list[dict]:
    r = run([helm, "template", "gambit", str(CHART), "--namespace", "serving", *args])
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]
