"""Reproducible training runs: fixed seed and thread count, environment facts, loss histories.

A shipped model is reproducible by its command when a rerun with the same seed, steps and thread
count gives the same loss history. Float results of CPU kernels depend on the thread count (how a
reduction is split) and on the torch build and CPU instruction set (which kernels run), so every
card records them (``environment()``) and every rerun pins the threads (``setup()``). A test
retrains the first steps and compares the history entry by entry (``compare_history``).
"""

from __future__ import annotations

import platform
import random

import torch


def setup(seed: int, threads: int) -> random.Random:
    """Pin the intra-op thread count and seed torch; returns a ``random.Random(seed)`` for data."""
    if threads <= 0:
        raise ValueError(f"threads must be a positive thread count (the card records it), got {threads}")
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    return random.Random(seed)


def environment() -> dict:
    """What a rerun must match to give the same floats: torch build, threads, CPU instruction set."""
    return {"torch_version": torch.__version__, "torch_threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "python": platform.python_version(),
            "machine": platform.machine()}


def compare_history(card: list[dict], fresh: list[dict], upto: int, key: str = "loss") -> list[str]:
    """Mismatches between a card's loss history and a rerun's, for entries with step <= ``upto``.

    Entries are ``{"step": int, key: float, ...}``; values must be equal exactly (they are written
    rounded, so equality of the rounded values is what "the same loss history" means). An empty
    list means they agree; a step missing from either side is a mismatch.
    """
    a = {h["step"]: h[key] for h in card if h["step"] <= upto}
    b = {h["step"]: h[key] for h in fresh if h["step"] <= upto}
    if not a:
        return [f"the card has no loss history up to step {upto}"]
    out = []
    for step in sorted(set(a) | set(b)):
        if a.get(step) != b.get(step):
            out.append(f"step {step}: card {a.get(step)} rerun {b.get(step)}")
    return out


def environment_note(env: dict) -> str:
    """One line for a model card."""
    return (f"torch {env['torch_version']}, {env['torch_threads']} CPU threads "
            f"(CPU capability {env.get('cpu_capability', '?')}); a rerun with another thread count, torch "
            "build or instruction set gives slightly different floats and so a different loss history")
