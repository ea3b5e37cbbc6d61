"""Shipped drafters retrained in one background process, one after another, each result to a file.

The reproducibility tests retrain the drafters on one torch thread (the cards' count): data ~2.5 min, PR's
200 steps ~2 min on 2 cores. Run in line they leave the second core idle; started when the test session
starts (tests/conftest.py), niced so the tests in front keep their priority, they run beside the session's
other tests and each drafter's test only reads its result. The floats are the same: the same pinned child
(``repro.run_pinned``), the same thread count. (The target's rerun, on two threads, stays in line: beside
the other tests its OpenMP threads waited on each other and it ran several times slower.)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

NICE = 10  # the background process's niceness: the tests in front of it keep the CPU first
PARENT = "GAMBIT_REPRO_PARENT"  # the starting process's pid: when it is gone, the reruns end themselves


def _file(out_dir: Path, name: str) -> Path:
    return out_dir / (name.replace("/", "__") + ".json")


@dataclass
class ReproReruns:
    """A running background process and where its results land."""

    proc: subprocess.Popen
    out_dir: Path
    names: tuple[str, ...]

    def result(self, name: str, timeout_s: float = 3600.0) -> dict:
        """Block until ``name``'s rerun is written (its training info); an error in the background
        comes back as a RuntimeError with its traceback, a process that died with its log's tail."""
        if name not in self.names:
            raise KeyError(f"{name} is not among the background reruns {self.names}")
        path, deadline = _file(self.out_dir, name), time.monotonic() + timeout_s
        while not path.exists():
            if self.proc.poll() is not None and not path.exists():
                tail = (self.out_dir / "log.txt").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"the repro reruns exited ({self.proc.returncode}) before {name}:\n"
                                   f"{tail}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no rerun of {name} after {timeout_s:.0f} s")
            time.sleep(0.5)
        info = json.loads(path.read_text())
        if "error" in info:
            raise RuntimeError(f"the background rerun of {name} failed:\n{info['error']}")
        return info

    def stop(self) -> None:
        """Kill the process group (the pinned training child too) if it still runs."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)


def start(steps: dict[str, int], cache_dir: str | Path, out_dir: str | Path) -> ReproReruns:
    """Start retraining each ``name: steps`` in order (the first one writes the data into ``cache_dir``,
    an empty folder, for the rest) in its own process group, its output in ``out_dir/log.txt``."""
    if not steps:
        raise ValueError("no drafter to rerun")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "gambit.train.repro_reruns", str(cache_dir), str(out)]
    argv += [f"{name}={n}" for name, n in steps.items()]
    with open(out / "log.txt", "w") as log:
        proc = subprocess.Popen(argv, env={**os.environ, PARENT: str(os.getpid())}, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=lambda: os.nice(NICE))
    return ReproReruns(proc, out, tuple(steps))


def _kill_group_but_me() -> None:
    """SIGKILL the other processes of this process group (the pinned training child)."""
    me, group = os.getpid(), os.getpgid(0)
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            try:
                if os.getpgid(int(entry)) == group:
                    os.kill(int(entry), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _watch_parent(parent: int, dirs: tuple[Path, ...], orphaned: threading.Event, every_s: float) -> None:
    """A test session killed without its finish hook (``timeout``'s SIGTERM, SIGKILL) cannot stop us (we
    are in our own session): when the parent is gone, end the training child, remove our folders, exit."""
    while os.getppid() == parent:
        time.sleep(every_s)
    orphaned.set()  # the main loop starts no further drafter
    _kill_group_but_me()
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    os._exit(1)


def main(argv: list[str], watch_every_s: float = 0.5) -> None:
    cache_dir, out = argv[0], Path(argv[1])
    orphaned = threading.Event()
    parent = int(os.environ.get(PARENT, os.getppid()))
    threading.Thread(target=_watch_parent, args=(parent, (Path(cache_dir), out), orphaned, watch_every_s),
                     daemon=True).start()
    from gambit.train.vendor_history import rerun_drafter

    for spec in argv[2:]:
        if orphaned.is_set():
            break
        name, n = spec.rsplit("=", 1)
        try:
            info = rerun_drafter(name, int(n), cache_dir)
        except Exception:  # written for the waiting test; the next drafter still runs
            info = {"error": traceback.format_exc()}
        tmp = _file(out, name).with_suffix(".tmp")
        tmp.write_text(json.dumps(info))
        tmp.rename(_file(out, name))  # whole or not there: the test polls for it
        print(f"[repro reruns] {name}: done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
