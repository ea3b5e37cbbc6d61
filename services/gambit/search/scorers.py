"""Pick the scorer a run uses: a shipped trained one when present, else a seeded random one."""

from __future__ import annotations

import sys
from pathlib import Path


def load_default_scorer(kind_or_path: str = "mlp", hidden_size: int = 192, quiet: bool = False,
                        invariant: bool = True):
    """``process`` / ``mlp`` / ``sequence`` → the shipped scorer folder; ``confidence`` → the training-free
    ``ConfidenceScorer`` (the target's own sampled-token confidence); any other value is a folder.
    Where the shipped scorer does not fit the model's width (a real checkpoint), ``process`` falls back
    to the confidence scorer (the signal it leans on, untrained), ``mlp`` / ``sequence`` to a random one
    of their kind. ``invariant``: ``BoundaryScorer``'s (False: the batched network, for comparisons)."""
    from gambit import paths
    from gambit.scoring import ConfidenceScorer, load_scorer, random_scorer

    if kind_or_path == "confidence":
        return ConfidenceScorer(hidden_size)

    names = {"mlp": getattr(paths, "SCORER_MLP", None), "sequence": getattr(paths, "SCORER_SEQUENCE", None),
             "process": getattr(paths, "SCORER_PROCESS", None)}
    folder = names.get(kind_or_path, Path(kind_or_path))
    if folder is not None and (Path(folder) / "config.json").is_file():
        scorer = load_scorer(folder, invariant=invariant)
        if scorer.hidden_size == hidden_size or kind_or_path not in names:
            return scorer  # a folder given by path must fit (scoring refuses the wrong width)
        why = (f"the shipped {kind_or_path} scorer reads width {scorer.hidden_size}, "
               f"this model has {hidden_size}")
    elif kind_or_path not in names:
        raise ValueError(f"scorer {kind_or_path!r}: no scorer folder there (need config.json)")
    else:
        why = f"no shipped {kind_or_path} scorer at {folder}"
    if kind_or_path == "process":
        if not quiet:
            print(f"note: {why}; scoring with the target's own confidence (ConfidenceScorer, untrained)",
                  file=sys.stderr)
        return ConfidenceScorer(hidden_size)
    if not quiet:
        print(f"note: {why}; using a random one (no signal)", file=sys.stderr)
    kind = "sequence" if kind_or_path == "sequence" else "mlp"
    return random_scorer(kind, hidden_size, invariant=invariant)
