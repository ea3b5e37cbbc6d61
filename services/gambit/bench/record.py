"""What every ``gambit bench`` JSON records so a figure can be rerun (the command line, the machine, the
versions, the seeds), the pair-ratio summary the benches share, and their Ctrl-C rule: an interrupted
run writes what it finished to ``<json>.partial`` or says it wrote nothing."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path


def command_line(name: str, argv: list[str] | None = None) -> str:
    """The command as a user types it: ``gambit bench NAME FLAGS``. ``argv``: the flags main() parsed
    (None: this process's own, after ``gambit bench NAME`` or ``python -m gambit.bench.x``)."""
    if argv is None:
        argv = sys.argv[1:]
        if argv[:2] == ["bench", name]:  # `gambit bench NAME ...`
            argv = argv[2:]
    return shlex.join(["gambit", "bench", name, *map(str, argv)])


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine() -> dict:
    """The CPU (model, vendor, cores this process may use), torch's thread count and the versions that
    move a timing: a figure from another machine or release is told apart."""
    import torch

    from gambit.cpu_info import cpu_model, cpu_vendor

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu_model() or platform.processor(), "vendor": cpu_vendor(), "cores": os.cpu_count(),
            "usable_cores": usable, "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(), "torch": torch.__version__,
            "transformers": _version("transformers"), "numpy": _version("numpy"),
            "gambit": _version("gambit"), "platform": platform.platform()}


def provenance(name: str, argv: list[str] | None = None, seeds: dict | None = None) -> dict:
    """The ``provenance`` block of a bench's JSON: command, machine, versions, seeds, when."""
    return {"command": command_line(name, argv), "machine": machine(), "seeds": seeds or {},
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def write_json(result: dict, path: str | Path) -> Path:
    """``result`` at ``path`` (its folders made), through a temporary file: a stopped write leaves the
    previous file, not half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str))
    tmp.replace(path)
    return path


def spread(xs: list[float]) -> dict:
    """Median, min-max and IQR of repetitions (one value: its own spread)."""
    xs = sorted(xs)
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return {"median": statistics.median(xs), "min": xs[0], "max": xs[-1], "iqr": [q[0], q[2]], "n": len(xs)}


def pair_ratios(num: list[float | None], den: list[float | None]) -> dict | None:
    """``num[i] / den[i]`` per repetition i (the two ran next to each other), summarised by ``spread``:
    a ratio of the medians lets a slow spell under one side's repetitions move it. None: no pair."""
    rs = [a / b for a, b in zip(num, den, strict=False) if a and b]
    return spread(rs) if rs else None


@contextlib.contextmanager
def on_interrupt(name: str, json_path: str | Path | None,
                 partial: Callable[[], dict | None]) -> Iterator[None]:
    """Ctrl-C inside: ``partial()`` (what the run finished; None or {} = nothing) goes to
    ``<json_path>.partial`` marked ``"interrupted": true``, and one line says so or says that nothing
    was written; the KeyboardInterrupt goes on (exit 130)."""
    try:
        yield
    except KeyboardInterrupt:
        try:
            got, what = partial(), ""
        except Exception as e:  # noqa: BLE001 — the interrupt is what the user must see
            got, what = None, f"its partial results failed: {type(e).__name__}: {e}"
        if got and json_path:
            where = write_json({**got, "interrupted": True}, str(json_path) + ".partial")
            print(f"gambit bench {name}: interrupted; wrote what it finished to {where}", file=sys.stderr)
        else:
            what = what or ("nothing finished yet" if not got else "no --json given")
            print(f"gambit bench {name}: interrupted; nothing written ({what})", file=sys.stderr)
        raise
