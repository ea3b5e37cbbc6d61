"""Reproducible training runs: fixed seed and thread count, environment facts, loss histories.

A shipped model is reproducible by its command when a rerun with the same seed, steps and thread
count gives the same loss history. Float results of CPU kernels depend on the thread count (how a
reduction is split) and on the torch build and CPU instruction set (which kernels run), so every
card records them (``environment()``) and every rerun pins the threads (``setup()``). A test
retrains the first steps and compares the history entry by entry (``compare_history``).
"""

from __future__ import annotations

import json
import os
import platform
import random
import subprocess
import sys

import torch

from gambit.cpu_info import cpu_flags, cpu_vendor


def setup(seed: int, threads: int) -> random.Random:
    """Pin the intra-op thread count and seed torch; returns a ``random.Random(seed)`` for data."""
    if threads <= 0:
        raise ValueError(f"threads must be a positive thread count (the card records it), got {threads}")
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    return random.Random(seed)


def environment() -> dict:
    """What a rerun must match to give the same floats: torch build, threads, CPU instruction set."""
    return {"torch_version": torch.__version__, "torch_threads": torch.get_num_threads(), **cpu_environment(),
            "python": platform.python_version(), "machine": platform.machine()}


def cpu_environment() -> dict:
    """The CPU facts a card's floats depend on (recorded with it: a rerun elsewhere may differ)."""
    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu_amx": cpu_amx(),
            "cpu_vendor": cpu_vendor()}


def cpu_amx() -> bool:
    """Whether this CPU has AMX tiles (Intel Sapphire Rapids and later). Such CPUs report the same
    torch capability ("AVX512") as earlier AVX-512 ones but MKL/oneDNN run other fp32 code paths on
    them: a scorer card made on an AVX-512 machine without AMX and a rerun on one with it differed in
    the first epoch's train loss by 5e-8 relative."""
    return "amx_tile" in cpu_flags()


def close(a: float, b: float, rtol: float) -> bool:
    return a == b or abs(a - b) <= rtol * max(abs(a), abs(b))


def compare_history(card: list[dict], fresh: list[dict], upto: int, key: str = "loss", rtol: float = 0.0
                    ) -> list[str]:
    """Mismatches between a card's loss history and a rerun's, for entries with step <= ``upto``.

    Entries are ``{"step": int, key: float, ...}``; with ``rtol`` 0 values must be equal exactly (they
    are written rounded, so equality of the rounded values is what "the same loss history" means),
    else within that relative difference. An empty list means they agree; a step
    missing from either side is a mismatch.
    """
    a = {h["step"]: h[key] for h in card if h["step"] <= upto}
    b = {h["step"]: h[key] for h in fresh if h["step"] <= upto}
    if not a:
        return [f"the card has no loss history up to step {upto}"]
    out = []
    for step in sorted(set(a) | set(b)):
        if a.get(step) is None or b.get(step) is None or not close(a[step], b[step], rtol):
            out.append(f"step {step}: card {a.get(step)} rerun {b.get(step)}")
    return out


def environment_note(env: dict) -> str:
    """One line for a model card."""
    return (f"torch {env['torch_version']}, {env['torch_threads']} CPU threads "
            f"(CPU capability {env.get('cpu_capability', '?')}); a rerun with another thread count, torch "
            "build or instruction set gives slightly different floats and so a different loss history")


# Each ``isa`` names the libraries' own switches, read once when a process loads them, so a pinned run
# needs its own process. "compatible": ATen's scalar kernels, MKL's conditional-numerical-reproducibility
# branch for every x86 CPU (its other branches hold on Intel only; on AMD they fall back to AUTO), oneDNN
# capped at SSE4.1. Measured (tools/target_repro_dtype.py --isa compatible): the target's step-200 loss
# is 1.45465 on a 2-core AMD EPYC with AVX2 only and on one with AVX-512, where the machine's own
# kernels give 1.46379 and 1.51775; it costs ~2.1x the time of a training step (--time-switches there).
# An Intel Xeon gives 1.45004 under the same switches (stop 43): MKL's compatible branch is documented as
# the same on every x86 CPU, yet some last bits differ by vendor (gambit.train.vendor_history).
# It also turns off the project's own C++ kernels (built with -march=native, so their floats follow the
# CPU): the engine that writes drafter data and scorer rollouts then runs its PyTorch path.
LIBRARY_SWITCHES = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41"}
# The engine's own GEMM choice follows the CPU vendor (gambit.engine.linear.packing_backend): pinned to
# the AMD one, where every card was made, so Intel writes the same drafter data and rollouts (stop 43).
ISA_ENV = {"machine": {}, "compatible": {**LIBRARY_SWITCHES, "GAMBIT_NO_CPU_KERNEL": "1",
                                         "GAMBIT_GEMM_VENDOR": "AuthenticAMD"}}


def check_isa(isa: str) -> None:
    """A config's ``isa`` field, validated."""
    if isa not in ISA_ENV:
        raise ValueError(f"isa must be one of {', '.join(ISA_ENV)}, got {isa!r}")


PINNED_CHILD = "GAMBIT_ISA_CHILD"  # set in a run_pinned child's environment


def isa_pinned(isa: str) -> bool:
    """Whether this process runs under ``isa``'s switches (set before torch loaded: ATen reports it)."""
    env = ISA_ENV[isa]
    if not env:
        return True
    return (all(os.environ.get(k) == v for k, v in env.items())
            and torch.backends.cpu.get_cpu_capability() == env["ATEN_CPU_CAPABILITY"].upper())


class PinnedRunError(RuntimeError, ValueError):
    """A ``run_pinned`` child that stopped on a bad value or a missing file: its one-line message (a
    ValueError too, so a command says it in one line, not as two tracebacks: the child's and this)."""


# the child: the result as the last stdout line; a bad value or a missing file as {"error": ...}, exit 3
_CHILD = """import json, sys, importlib
m = importlib.import_module(sys.argv[1]); fn = getattr(m, sys.argv[2])
cls = fn.__annotations__['cfg']
cls = getattr(m, cls) if isinstance(cls, str) else cls
try:
    r = fn(cls(**json.loads(sys.argv[3])), **json.loads(sys.argv[4]))
except (ValueError, OSError) as e:
    print('\\n' + json.dumps({'error': str(e)}))
    sys.exit(3)
except KeyboardInterrupt:
    sys.exit(130)
print('\\n' + json.dumps(r))
"""


def run_pinned(isa: str, module: str, function: str, config: dict, **kwargs) -> dict:
    """Run ``module.function(Config(**config), **kwargs)`` in a child process under ``isa``'s switches
    and return its JSON result. The child's progress (stderr) and its printed lines (stdout: a
    drafter's held-out figures) show through as they come; its ValueError or OSError comes back as a
    ``PinnedRunError`` with its message."""
    if os.environ.get(PINNED_CHILD):  # the switches did not take effect here: do not spawn forever
        raise RuntimeError(f"isa={isa}: this CPU or torch build ignores {sorted(ISA_ENV[isa])}")
    env = {**os.environ, **ISA_ENV[isa], PINNED_CHILD: "1", "PYTHONUNBUFFERED": "1"}  # lines as printed
    argv = [sys.executable, "-c", _CHILD, module, function, json.dumps(config), json.dumps(kwargs)]
    pending: list[str] = []  # the last two lines: the result and the blank line before it
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True) as child:
        try:
            for line in child.stdout:
                pending.append(line)
                if len(pending) > 2:
                    sys.stdout.write(pending.pop(0))
                    sys.stdout.flush()
            child.wait()
        except BaseException:  # Ctrl-C here (the child got it too) or an error: no orphan keeps training
            child.kill()
            raise
    if pending and pending[0].strip() and len(pending) == 2:
        sys.stdout.write(pending.pop(0))
    last = pending[-1].strip() if pending else ""
    try:
        result = json.loads(last) if last.startswith("{") else None
    except json.JSONDecodeError:
        result = None
    if result is None and last:  # no result: the child stopped, and its last line is its own (shown)
        sys.stdout.write(pending[-1])
    what = f"{module}.{function} under isa={isa} exited with {child.returncode}"
    if child.returncode == 3 and isinstance(result, dict) and "error" in result:
        raise PinnedRunError(f"{result['error']} ({what})")
    if child.returncode or result is None:
        raise RuntimeError(what)
    return result
