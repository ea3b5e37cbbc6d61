"""The engine thread's check for a second OpenMP pool (``gambit.engine.torch_threads``): another thread
of the process that ran torch parallel work makes every step's OpenMP workers sleep and wake, 2-3x slower.
It counts the engine thread's voluntary context switches between two steps and warns once per process."""

from __future__ import annotations

import logging
import threading

import torch

from gambit.engine.torch_threads import voluntary_switches

log = logging.getLogger("gambit.serving.target_service")  # its warning was the service's: same logger

# engine steps between which the engine thread's voluntary context switches are counted, again every
# SWITCH_PERIOD steps (a second pool can appear at any time: a thread that runs torch work only for
# large batches), and the count per step above which it is reported (0-1 with one pool, ~30 with two)
SWITCH_CHECK = (16, 80)
SWITCH_PERIOD = 2048
SWITCH_WARN_PER_STEP = 8.0


class PoolWatch:
    """Called by the engine thread after each step (``after_step``)."""

    def __init__(self, thread: threading.Thread) -> None:
        self.thread = thread
        self.warned = False
        self._at = (0, 0)  # (step, engine-thread voluntary switches) when the check began

    def after_step(self, steps: int) -> None:
        """``steps``: the engine steps so far; a check begins or ends at ``SWITCH_CHECK`` of each period."""
        if steps % SWITCH_PERIOD in SWITCH_CHECK and not self.warned:
            self._check(steps)

    def _check(self, steps: int) -> None:
        """Warn when the engine thread sleeps at nearly every parallel region of its steps."""
        n = voluntary_switches(self.thread.native_id)
        if steps % SWITCH_PERIOD == SWITCH_CHECK[0] or n < 0:
            self._at = (steps, n)
            return
        per_step = (n - self._at[1]) / max(1, steps - self._at[0])
        if per_step > SWITCH_WARN_PER_STEP and torch.get_num_threads() > 1:
            self.warned = True
            log.warning("the engine thread slept %.0f times per step: another thread of this process ran "
                        "torch parallel work, so OpenMP workers sleep between regions (a second pool; "
                        "see gambit.engine.torch_threads) and steps run 2-3x slower", per_step)
