"""How many threads a CPU step's forward gets: fewer when the step is small.

A decode step of a few rows of a small model is a chain of small matmuls; split over two threads,
each parallel region pays a fork and a barrier that cost more than the halved work saves, and the
second core is held (spinning) the whole step. So a plain step gets as many threads as give each at
least ``min_macs_per_thread`` multiply-adds of the model's weights (rows x weights per row / threads),
at least one and at most the process's setting. The unit is the work, not the rows, because a real
checkpoint's single row is already worth both threads. Measured on a 2-core AMD EPYC, bare engine,
one thread against two (``tools/step_threads_curve.py``): the shipped target (2.67M weights a row)
steps 0.90-1.07x as long on one at 1-8 rows (a wash) and 1.14x at 16; SmolLM2-135M (134.5M) steps
1.25-1.85x as long on one at every batch. A core left free also serves the machine's other
processes: under Ray Serve on two cores the Coordinator, proxy and Scorer otherwise preempt one of
the Target's two threads, which stalls the other at every barrier. llama.cpp's separate
``--threads`` / ``--threads-batch`` exist for the same reason.

The process's own setting (``torch.set_num_threads``, e.g. the Target's ``threads``) stays the
maximum: it is read back whenever the count is not the one a policy set last, so a caller that
changes it is followed. OpenMP's count is per calling thread, so this runs on the engine's thread,
and what a policy set last is kept per thread, shared by every engine stepping on it: kept per
engine, a second engine in the process (the engine benchmark's next batch, the serve benchmark's
bare-engine baseline beside the embedded wiring, a test) took the one thread the first one had
set for its last small step as the process's setting, and never used the second core.
"""

from __future__ import annotations

import threading

import torch

from gambit.model.config import ModelConfig

_THREAD = threading.local()  # per OS thread: ``full`` (the caller's setting), ``set`` (a policy's last)


def macs_per_row(mc: ModelConfig) -> int:
    """Multiply-adds of one row through the model's matmuls: every layer's projections and the head."""
    h, q, kv = mc.hidden_size, mc.num_attention_heads * mc.head_dim, mc.num_key_value_heads * mc.head_dim
    return mc.num_hidden_layers * (2 * h * q + 2 * h * kv + 3 * h * mc.intermediate_size) + mc.vocab_size * h


class StepThreads:
    def __init__(self, macs_per_row: int, min_macs_per_thread: int, enabled: bool = True) -> None:
        self.macs_per_row = macs_per_row
        self.min_macs = min_macs_per_thread if enabled else 0

    @property
    def full(self) -> int | None:
        """The caller's setting on this thread, the most a step gets (None: no policy stepped yet)."""
        return getattr(_THREAD, "full", None)

    def count(self, rows: int | None, full: int) -> int:
        if rows is None or self.min_macs <= 0:
            return full
        return max(1, min(full, rows * self.macs_per_row // self.min_macs))

    def apply(self, rows: int | None) -> int:
        """Set the thread count for a forward of ``rows`` rows (None: all threads) and return it."""
        now = torch.get_num_threads()
        full, last = getattr(_THREAD, "full", None), getattr(_THREAD, "set", None)
        if self.min_macs <= 0:  # off (or switched off since): give back what a policy took
            if last is not None and now == last and full is not None and now != full:
                torch.set_num_threads(now := full)
            _THREAD.set = None
            return now
        if full is None or now != last:
            full = _THREAD.full = now  # first step, or changed by someone else since: the new maximum
        want = self.count(rows, full)
        if want != now:
            torch.set_num_threads(want)
        _THREAD.set = want
        return want
