"""Reproducibility: a fixed thread count (float sums depend on it) and one seed for torch."""

from __future__ import annotations

import contextlib

import torch

from gambit.train.repro import cpu_environment


@contextlib.contextmanager
def fixed_threads(threads: int):
    """Run the block with ``threads`` intra-op threads, then restore the previous count."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def environment() -> dict:
    """What a loss history depends on besides the config: recorded in ``training.json``."""
    return {"torch": torch.__version__, "threads": torch.get_num_threads(),
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(), **cpu_environment()}
