"""The model card (``README.md``) of a shipped scorer, rendered from its ``training.json``."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

from gambit.paths import ASSETS, REPO, TARGET
from gambit.scoring.evaluate import format_table
from gambit.scoring.spec import SHIPPED, shipped_folder
from gambit.scoring.train import TrainScorerConfig


def command(cfg: dict) -> str:
    """The ``gambit train scorer`` command line that reproduces ``cfg`` (non-default flags only)."""
    default = TrainScorerConfig(kind=cfg["kind"])
    parts = ["gambit train scorer", f"--kind {cfg['kind']}"]
    for f in fields(TrainScorerConfig):
        if f.name in ("kind", "cache_dir"):
            continue
        d = getattr(default, f.name)
        v = cfg.get(f.name, d)  # cards that predate a field ran its default
        if v != d:
            if f.name in ("out", "model"):
                try:
                    v = str(Path(v).resolve().relative_to(ASSETS.parent.parent.parent))
                except ValueError:
                    pass
            flag = f.name.replace('_', '-')
            parts.append((f"--{flag}" if v else f"--no-{flag}") if isinstance(v, bool) else f"--{flag} {v}")
    return " ".join(parts)


def _is(path: str, asset: Path) -> bool:
    """Whether ``path`` as recorded in training.json (the Makefile's is relative to the checkout)
    names ``asset``."""
    p = Path(path)
    return p == asset.relative_to(REPO) or p.resolve() == asset.resolve()


def scorer_spec(folder: Path, cfg: dict) -> str:
    """What the card's snippet loads: a shipped scorer by its name (``load_scorer_spec("mlp")`` works
    from any directory), any other by its folder's absolute path."""
    return next((n for n in SHIPPED if _is(cfg.get("out", ""), shipped_folder(n))), str(folder.resolve()))


def write_card(folder: str | Path) -> Path:
    folder = Path(folder)
    info = json.loads((folder / "training.json").read_text())
    cfg, sc, d, ev = info["config"], info["scorer"], info["data"], info["heldout"]
    size = (folder / "model.safetensors").stat().st_size
    label = cfg.get("label", "final")
    width = sc["hidden_size"] + (2 if sc.get("confidence") else 0)
    conf = bool(sc.get("confidence"))
    labelled = {"final": "with its trace's final correctness",
                "process": "with whether every thought so far is a correct `a op b = c` line (the task's "
                           "checker; a per-thought label)",
                "path": "with whether every thought so far is the reference solution's step"}[label]
    reads = (" plus 2 confidence features (the lowest log-probability of a token the target sampled in "
             "the thought this boundary closes, and in the trace so far; `gambit.scoring.confidence`)"
             if conf else "")
    estimates = {"final": "the estimated probability that the trace ends with the right answer",
                 "process": "the estimated probability that every thought so far is right",
                 "path": "the estimated probability that every thought so far is the reference step"}[label]
    if sc["kind"] == "mlp":
        arch = (f"STEP probe `Sequential(Linear({width}, {sc['mlp_hidden']}), ReLU, "
                f"Linear({sc['mlp_hidden']}, 1))`, sigmoid; one boundary state at a time")
    elif sc["arch"] == "gru":
        arch = (f"history-aware: LayerNorm → Linear({width}, {sc['model_dim']}) → ReLU → "
                f"GRU({sc['model_dim']}) → LayerNorm → Linear({sc['model_dim']}, 1), sigmoid; the score at "
                "boundary j reads boundaries 1..j of the trace (state per trace: one GRU vector)")
    else:
        arch = (f"history-aware: LayerNorm → Linear({width}, {sc['model_dim']}) → one causal "
                f"attention block ({sc['num_heads']} heads, learned thought-index positions) → "
                f"Linear({sc['model_dim']}, 1), sigmoid; the score at boundary j reads boundaries 1..j")
    hist = "\n".join(f"| {h['epoch']} | {h['train_loss']:.5f} | {h['val_loss']:.5f} | {h['val_auc']:.4f} |"
                     for h in info["loss_history"])
    tr, ho = d["train_rollouts"], d["heldout_rollouts"]
    best_val = info["loss_history"][d["best_epoch"] - 1]["val_auc"]
    choice = f"validation AUC at the best epoch {best_val:.3f}"
    mlp_json = folder.parent / "scorer-mlp" / "training.json"
    m = json.loads(mlp_json.read_text()) if sc["kind"] == "sequence" and mlp_json.is_file() else None
    same_split = m and m["data"]["train_rollouts"] == tr and m["config"]["val_percent"] == cfg["val_percent"]
    if same_split and not conf:
        m_val = m["loss_history"][m["data"]["best_epoch"] - 1]["val_auc"]
        choice += f" (the MLP on the same split: {m_val:.3f})"
    model = (f"the shipped target (`{sc['target']}`)" if _is(cfg.get("model", ""), TARGET)
             else f"the model `{sc['target']}`")
    spec = scorer_spec(folder, cfg)
    graded = ("" if label == "final" else f"\nThis scorer was trained on the {label} label: its AUC against "
              f"that label is the `{label} label` line\nbelow the table.")
    text = f"""# Boundary scorer: {sc['kind']}{'' if sc['kind'] == 'mlp' else f" ({sc['arch']})"}

Scores a reasoning trace of {model} at every thought boundary (`\\n\\n`)
from the target's post-final-norm last-layer hidden state (width {sc['hidden_size']}){reads}: {estimates}.
Gambit's tournament ranks traces by these scores (by default their mean).

```python
from gambit.scoring.spec import load_scorer_spec
scorer = load_scorer_spec("{spec}")   # kind={sc['kind']!r}, hidden_size={sc['hidden_size']}
scores = scorer.score(keys, states)   # states: float [N, {width}], one row per boundary
scorer.fork(parent_key, child_key); scorer.drop(key)
```

| | |
|---|---|
| architecture | {arch} |
| parameters | {info['params']:,} (`model.safetensors`, fp32, {size / 1e3:.0f} kB) |
| data | rollouts of the target on {tr['n_problems']} train-split problems × {tr['samples']} samples, \
T = {tr['temperature']}, ≤ {tr['max_tokens']} tokens, {tr['min_ops']}–{tr['max_ops']} operations; \
every boundary labelled {labelled} ({d['train_correct']:.1%} of traces correct) |
| split | by problem: {d['fit_problems']} problems fit ({d['fit_boundaries']} boundaries), \
{d['val_problems']} validation ({d['val_boundaries']} boundaries; early stopping), fixed by a hash of \
the problem text; held-out: {ho['n_problems']} dev-split problems × {ho['samples']} samples \
({ev['boundaries']} boundaries), never used in training or selection |
| loss | class-weighted BCE, pos_weight = neg/pos = {d['pos_weight']:.3f} |
| optimiser | Adam lr {cfg['lr']}, weight decay {cfg['weight_decay']}, batch {cfg['batch_size']} \
boundaries{'' if sc['kind'] == 'mlp' else ' (whole traces packed)'}, ≤ {cfg['max_epochs']} epochs, \
patience {cfg['patience']} on validation loss; best epoch {d['best_epoch']} kept; seed {cfg['seed']} |
| selection | {choice} |
| time | {info['train_seconds']} s of training (rollouts are cached) |
| environment | torch {info['torch_version']}; training on {info['torch_threads']} CPU thread(s), \
rollouts on {tr['threads']} (the engine's numerics depend on it){_isa(cfg)} |
| command | `{command(cfg)}` |

## Held-out AUC (dev-split problems)

Boundary AUC against the trace's final correctness ("final ok": the share of boundaries whose trace
ends with the right answer), overall and by thought index; "AUC mean" uses the running mean of the
trace's scores up to that boundary (what the tournament ranks by).{graded}

```
{format_table(ev)}
```

The within-problem AUC compares only traces of the same problem (what a search over one problem's
traces needs); "difficulty alone" is the AUC of the problem's operation count, a signal any scorer
gets for free from the prompt, for reference. The process / path lines judge the same scores against
the per-thought labels (within problem: traces of one problem at the same thought index).

## Loss history

| epoch | train loss | validation loss | validation AUC |
|---:|---:|---:|---:|
{hist}

Reproducibility: the same command with the same seed and {info['torch_threads']} threads gives the same
history. `training.json` also holds a short probe ({info['repro']['epochs']} epochs on the first
{info['repro']['problems']} problems, one rollout chunk) that `tests/scoring/test_reproducible.py`
regenerates from scratch and matches exactly.
"""
    path = folder / "README.md"
    path.write_text(text)
    return path


def _isa(cfg: dict) -> str:
    from gambit.train.card import ISA_NOTE

    return f"; {ISA_NOTE[cfg['isa']]}" if cfg.get("isa") in ISA_NOTE else ""
