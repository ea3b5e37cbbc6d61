"""Every ``tools/*.py`` answers ``--help`` with its usage and exit 0: seven of them read "--help" as a
positional number (a ValueError traceback), and ``serve_cpu_per_solve.py`` ignored it and started a Ray
Serve app. All of them run in one child process (``runpy``, argv patched): torch is imported once, not
once per tool (42 imports took 81 s of CI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = sorted(p.name for p in (ROOT / "tools").glob("*.py"))
LIMIT_S = 240  # every tool's --help together; a tool that starts work instead runs far past it

DRIVER = """
import contextlib, io, json, runpy, sys, traceback
sys.path.insert(0, "tools")  # a script's own folder, as `python tools/x.py` has it
out = {}
for tool in sys.argv[1:]:
    buf, err = io.StringIO(), io.StringIO()
    sys.argv = [f"tools/{tool}", "--help"]
    code = 0
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(f"tools/{tool}", run_name="__main__")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            code, _ = 1, traceback.print_exc()
    out[tool] = [code, buf.getvalue()[:2000], err.getvalue()[-2000:]]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def helps() -> dict[str, list]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "services"))
    proc = subprocess.run([sys.executable, "-c", DRIVER, *TOOLS], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=LIMIT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("tool", TOOLS)
def test_help_prints_the_usage_and_exits_0(helps, tool):
    rc, out, err = helps[tool]
    assert rc == 0, f"{tool} --help: rc {rc}\n{err}"
    assert "usage" in out.lower(), out[:500]
    assert "Traceback" not in err


def test_serve_cpu_per_solve_refuses_an_argument_it_does_not_take():
    """Anything but ``quick`` ran the full settings' Ray app, the argument ignored."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "services"))
    proc = subprocess.run([sys.executable, "tools/serve_cpu_per_solve.py", "qiuck"], cwd=ROOT, env=env,
                          text=True, capture_output=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.startswith("usage: tools/serve_cpu_per_solve.py [quick] (got 'qiuck')"), proc.stderr
