"""How well a scorer separates correct from wrong traces on held-out problems.

Every boundary is labelled with its trace's final correctness. Reported: boundary AUC overall and by
thought index; the AUC of the running mean of a trace's scores (what the tournament ranks by); and
the within-problem AUC (pairs of traces of the same problem only — the ranking a search needs, free
of the easy "hard problems fail more" signal), with the problem's difficulty as a reference.

When the rollouts carry per-thought labels, the same scores are also judged against the process
label (every thought so far right, ``labels.py``): boundary AUC overall and by thought, and the
within-problem process AUC over groups of one problem's traces at the same thought index (the
tournament compares traces of one problem at about the same depth). The trace-level figures are
given for two rankings, the running mean of the scores (the paper's rule) and the last score.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from gambit.scoring.auc import auc
from gambit.scoring.labels import boundary_labels

MAX_THOUGHT_ROW = 9  # thoughts >= this share one row


@torch.no_grad()
def predict(net: nn.Module, kind: str, data: dict, traces: torch.Tensor | None = None,
            chunk: int = 256) -> torch.Tensor:
    """Scores in [0, 1] for every boundary of ``data`` (its order), each from its trace's prefix."""
    net.eval()
    if kind == "mlp":
        return torch.sigmoid(net(data["states"]))
    out = torch.empty(len(data["states"]))
    ids = torch.arange(len(data["correct"])) if traces is None else traces
    for c in range(0, len(ids), chunk):
        x, mask, rows, _ = pad_traces(data, ids[c:c + chunk])
        out[rows] = torch.sigmoid(net(x))[mask]
    return out


def trace_offsets(data: dict) -> torch.Tensor:
    """First boundary row of each trace (rows are grouped by trace, in order)."""
    counts = torch.bincount(data["trace"], minlength=len(data["correct"]))
    return torch.cumsum(counts, 0) - counts


def pad_traces(data: dict, traces: torch.Tensor):
    """``x [B, T, d]`` (right-padded), ``mask [B, T]``, the rows of the valid entries, labels ``[B]``."""
    counts = torch.bincount(data["trace"], minlength=len(data["correct"]))
    starts = torch.cumsum(counts, 0) - counts
    lens = counts[traces]
    T = max(int(lens.max()), 1) if len(traces) else 1
    mask = torch.arange(T)[None] < lens[:, None]
    rows = (starts[traces][:, None] + torch.arange(T)[None])[mask]
    x = torch.zeros(len(traces), T, data["states"].shape[1])
    x[mask] = data["states"][rows]
    return x, mask, rows, data["correct"][traces]


def running_mean(scores: torch.Tensor, data: dict) -> torch.Tensor:
    """Per boundary: the mean of its trace's scores so far."""
    csum = torch.cumsum(scores.double(), 0)
    starts = trace_offsets(data)[data["trace"]]
    before = torch.where(starts > 0, csum[(starts - 1).clamp(min=0)], torch.zeros_like(csum))
    return ((csum - before) / data["thought"].double()).float()


def within_problem_auc(trace_scores: torch.Tensor, data: dict) -> tuple[float, int]:
    """Mean over problems with both outcomes of the AUC among that problem's traces; and their count."""
    vals = []
    for p in torch.unique(data["problem"]).tolist():
        sel = data["problem"] == p
        a = auc(trace_scores[sel], data["correct"][sel])
        if not math.isnan(a):
            vals.append(a)
    return (sum(vals) / len(vals) if vals else float("nan")), len(vals)


def grouped_auc(scores: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor,
                by_pairs: bool = False) -> tuple[float, int]:
    """Mean AUC over the groups (integer ids) that hold both outcomes; and how many did.

    ``by_pairs``: each group weighted by its positive x negative pairs, i.e. the share of all
    within-group pairs ranked right (what a search's rounds compare), not the mean over groups."""
    vals, weights = [], []
    order = torch.argsort(groups, stable=True)
    ids, counts = torch.unique_consecutive(groups[order], return_counts=True)
    for sel in torch.split(order, counts.tolist()):
        a = auc(scores[sel], labels[sel])
        if not math.isnan(a):
            pos = int(labels[sel].sum())
            vals.append(a)
            weights.append(pos * (len(sel) - pos) if by_pairs else 1)
    mean = sum(v * w for v, w in zip(vals, weights, strict=True)) / sum(weights) if vals else float("nan")
    return mean, len(vals)


def process_metrics(scores: torch.Tensor, data: dict, label: str = "process") -> dict:
    """Boundary ``scores`` against the per-thought ``label``: overall, by thought, within problem."""
    y = boundary_labels(data, label)
    thought = data["thought"].clamp(max=MAX_THOUGHT_ROW)
    groups = data["problem"][data["trace"]] * (MAX_THOUGHT_ROW + 1) + thought
    wp, n = grouped_auc(scores, y, groups)
    by = {(f"{t}+" if t == MAX_THOUGHT_ROW else str(t)): auc(scores[thought == t], y[thought == t])
          for t in range(1, MAX_THOUGHT_ROW + 1) if int((thought == t).sum())}
    return {"positive": float(y.float().mean()) if len(y) else float("nan"), "auc": auc(scores, y),
            "within_problem_auc": wp, "mixed_groups": n, "auc_by_thought": by}


def evaluate(scores: torch.Tensor, data: dict) -> dict:
    """AUC table for boundary ``scores`` of ``data`` (see the module docstring)."""
    label = data["correct"][data["trace"]]
    mean = running_mean(scores, data)
    last = trace_offsets(data) + torch.bincount(data["trace"], minlength=len(data["correct"])) - 1
    has = last >= trace_offsets(data)  # traces with at least one boundary
    final = torch.full((len(data["correct"]),), 0.5)
    final[has] = mean[last[has]]
    final_last = torch.full((len(data["correct"]),), 0.5)
    final_last[has] = scores[last[has]]
    wp, n_mixed = within_problem_auc(final, data)
    by = {}
    for t in range(1, MAX_THOUGHT_ROW + 1):
        sel = data["thought"] >= t if t == MAX_THOUGHT_ROW else data["thought"] == t
        if int(sel.sum()) == 0:
            continue
        by[f"{t}+" if t == MAX_THOUGHT_ROW else str(t)] = {
            "boundaries": int(sel.sum()), "positive": float(label[sel].float().mean()),
            "auc": auc(scores[sel], label[sel]), "auc_running_mean": auc(mean[sel], label[sel])}
    difficulty = -data["n_ops"][data["trace"]].float()
    extra = {}
    if "step_ok" in data:
        extra = {"process": process_metrics(scores, data, "process"),
                 "path": process_metrics(scores, data, "path"),
                 "trace_auc_last": auc(final_last, data["correct"]),
                 "within_problem_auc_last": within_problem_auc(final_last, data)[0]}
    return {**extra, "boundaries": len(scores), "traces": len(data["correct"]),
            "problems": len(torch.unique(data["problem"])),
            "positive": float(label.float().mean()) if len(label) else float("nan"),
            "auc": auc(scores, label), "auc_running_mean": auc(mean, label),
            "trace_auc": auc(final, data["correct"]), "within_problem_auc": wp,
            "mixed_problems": n_mixed, "difficulty_auc": auc(difficulty, label), "by_thought": by}


def format_table(ev: dict) -> str:
    lines = ["AUC against the trace's final correctness (final ok: boundaries whose trace is right)",
             f"{'thought':>8} {'boundaries':>10} {'final ok':>8} {'AUC':>7} {'AUC mean':>9}"]
    for t, r in ev["by_thought"].items():
        lines.append(f"{t:>8} {r['boundaries']:>10} {r['positive']:>8.1%} {r['auc']:>7.3f} "
                     f"{r['auc_running_mean']:>9.3f}")
    lines.append(f"{'all':>8} {ev['boundaries']:>10} {ev['positive']:>8.1%} {ev['auc']:>7.3f} "
                 f"{ev['auc_running_mean']:>9.3f}")
    lines.append(f"trace AUC (mean score at the end) {ev['trace_auc']:.3f}; within-problem AUC "
                 f"{ev['within_problem_auc']:.3f} over {ev['mixed_problems']} problems with both outcomes; "
                 f"difficulty alone (-ops) {ev['difficulty_auc']:.3f}")
    if "process" in ev:
        lines.append(f"ranked by the last score instead: trace AUC {ev['trace_auc_last']:.3f}, "
                     f"within-problem AUC {ev['within_problem_auc_last']:.3f}")
        for name in ("process", "path"):
            m = ev[name]
            by = " ".join(f"{t}:{a:.3f}" for t, a in m["auc_by_thought"].items())
            lines.append(f"{name} label ({m['positive']:.1%} positive): AUC {m['auc']:.3f}, within problem "
                         f"and thought {m['within_problem_auc']:.3f} over {m['mixed_groups']} groups; "
                         f"by thought {by}")
    return "\n".join(lines)
