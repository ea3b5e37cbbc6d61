"""Pick the scorer a run uses: a shipped trained one when present, else a seeded random one."""

from __future__ import annotations

import sys
from pathlib import Path


def load_default_scorer(kind_or_path: str = "mlp", hidden_size: int = 192, quiet: bool = False):
    """``mlp`` / ``sequence`` → the shipped scorer folder; any other value is a scorer folder."""
    from gambit import paths
    from gambit.scoring import load_scorer, random_scorer

    folder = {"mlp": getattr(paths, "SCORER_MLP", None),
              "sequence": getattr(paths, "SCORER_SEQUENCE", None)}.get(kind_or_path, Path(kind_or_path))
    if folder is not None and (Path(folder) / "config.json").is_file():
        return load_scorer(folder)
    if kind_or_path not in ("mlp", "sequence"):
        raise ValueError(f"scorer {kind_or_path!r}: no scorer folder there (need config.json)")
    if not quiet:
        print(f"note: no shipped {kind_or_path} scorer at {folder}; using a random one (no signal)",
              file=sys.stderr)
    return random_scorer(kind_or_path, hidden_size)
