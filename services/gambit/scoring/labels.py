"""What a scorer is trained to predict at a boundary (``gambit train scorer --label``).

* ``final``: the trace's final correctness (STEP's recipe): every boundary of a trace gets one label,
  so within one problem the label says nothing about *where* a trace went wrong.
* ``process``: every thought so far is a correct ``a op b = c`` line (the task's own checker) — a
  per-thought label that turns false at the first arithmetic slip, so traces of one problem at the
  same depth differ in it.
* ``path``: every thought so far is the reference solution's step (right operands too, not only
  right arithmetic): the trace can still end right without a lucky correction.
"""

from __future__ import annotations

import torch

LABELS = ("final", "process", "path")


def prefix_all(ok: torch.Tensor, trace: torch.Tensor) -> torch.Tensor:
    """Per boundary row: ``ok`` held at every row of its trace up to and including this one.

    Rows are grouped by trace in order (as in rollouts), so a cumulative count of failures minus the
    count before the trace's first row is the trace's failures so far.
    """
    bad = torch.cumsum((~ok).long(), 0)
    counts = torch.bincount(trace, minlength=int(trace.max()) + 1 if len(trace) else 0)
    starts = torch.cumsum(counts, 0) - counts
    first = starts[trace]
    before = torch.where(first > 0, bad[(first - 1).clamp(min=0)], torch.zeros_like(bad))
    return (bad - before) == 0


def boundary_labels(data: dict, label: str) -> torch.Tensor:
    """Bool label per boundary row of rollout ``data`` under ``label`` (one of ``LABELS``)."""
    if label not in LABELS:
        raise ValueError(f"label must be one of {LABELS}, got {label!r}")
    if label == "final":
        return data["correct"][data["trace"]]
    if "step_ok" not in data:
        raise ValueError("these rollouts carry no per-thought labels (cached before they existed); "
                         "delete the cache under ~/.cache/gambit and roll out again")
    return prefix_all(data["step_ok"] if label == "process" else data["step_ref"], data["trace"])
