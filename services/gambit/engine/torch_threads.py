"""One OpenMP pool per process: where a serving process may run torch's parallel work.

libgomp (torch's OpenMP) gives every thread that runs a parallel region a pool of worker threads,
kept until that thread exits. Once a process has more such threads than CPUs, libgomp spins only
~100 times (instead of ~300,000) before a waiting worker sleeps, so every parallel region of an
engine step pays a futex wake-up of the other core: on 2 cores a batch-4 search step took 4.1 ms
instead of 1.4 ms, with ~65 context switches per step (``tests/engine/test_torch_threads.py``).
A thread that built the model and stays alive (a replica's event loop, a test's main thread) is
enough to cause it. So a serving process runs its torch work on its engine thread only, and set-up
that has to run before that thread exists runs on a thread that exits (its pool goes with it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def on_fresh_thread(fn: Callable[[], T], name: str = "torch-setup") -> T:
    """``fn()`` on a new thread that exits when it returns; its result, or its exception re-raised."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 — re-raised in the caller
            box["error"] = e

    t = threading.Thread(target=run, name=name)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def voluntary_switches(native_id: int) -> int:
    """Voluntary context switches of one thread of this process so far (Linux; -1 elsewhere): the
    count that a sleeping OpenMP worker drives up, once per parallel region."""
    try:
        with open(f"/proc/self/task/{native_id}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1
