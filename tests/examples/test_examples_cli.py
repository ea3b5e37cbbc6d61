"""The examples as a newcomer runs them: ``--help`` gives each flag's default (it gave none: which server
does the script call when no --address is given?), and a call with nothing listening says which server to
start, in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = {**{k: v for k, v in os.environ.items() if k != "GAMBIT_TOKEN"}, "PYTHONPATH": str(ROOT / "services")}


def call(script: str, *args: str, cwd: Path = ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "examples" / script), *args], capture_output=True,
                          text=True, timeout=120, env={**ENV, **(env or {})}, cwd=cwd)


@pytest.mark.parametrize("script, defaults", [
    ("solve_from_a_backend.py", ["(default: 127.0.0.1:9000, where `gambit serve` listens)", "(default: 8)",
                                 "(default: gambit)"]),
    ("score_states.py", ["(default: 127.0.0.1:50061, where `gambit scorer serve` listens)", "(default: 3)"]),
])
def test_help_gives_each_flags_default(script, defaults):
    r = call(script, "--help")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert all(d in text for d in defaults), text


@pytest.mark.parametrize("script, server", [("solve_from_a_backend.py", "`gambit serve`, port 9000"),
                                            ("score_states.py", "`gambit scorer serve`, port 50061")])
def test_nothing_listening_names_the_server_to_start(tmp_path, script, server):
    """Also: the stubs solve_from_a_backend.py generates (no --stubs) are removed; each run left a
    gambit-stubs-* folder in the temporary directory."""
    args = ["--address", "127.0.0.1:1"] + (["Compute 1+1."] if script.startswith("solve") else [])
    (tmp := tmp_path / "tmp").mkdir()
    r = call(script, *args, cwd=tmp_path, env={"TMPDIR": str(tmp)})
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    hint = f"(no server at --address: start {server} by default)"
    assert r.stderr.startswith("UNAVAILABLE: ") and hint in r.stderr, r.stderr
    assert not list(tmp.iterdir())
