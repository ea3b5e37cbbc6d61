"""What a training's output folder already holds. A drafter and a model share file names
(``config.json``, ``model.safetensors``, ``README.md``), so a drafter trained into a model's folder (the
shipped target's, or ``--target``'s own) replaced its weights and config, and the model no longer loaded."""

from __future__ import annotations

import json
from pathlib import Path

NO_MODEL = "a config.json that is no model's"


def folder_kind(folder: str | Path) -> str | None:
    """"drafter" (an EAGLE-3 config), "model" (a causal LM's), "scorer" (a boundary scorer's), what else
    its config names, or None where the folder has no ``config.json`` (a new or an empty folder)."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return "an unreadable config.json"
    if not isinstance(raw, dict):
        return NO_MODEL
    archs = raw.get("architectures") or []
    archs = [str(a) for a in (archs if isinstance(archs, list) else [archs])]
    if any("eagle" in a.lower() for a in archs):
        return "drafter"
    if any(a.startswith("BoundaryScorer") for a in archs):
        return "scorer"
    if archs and not any(a.endswith("ForCausalLM") for a in archs):
        return f"a {archs[0]} model"
    return "model" if "num_hidden_layers" in raw and "vocab_size" in raw else NO_MODEL


def check_out_kind(out: str, kind: str) -> None:
    """``out`` is new, empty of a config, or holds a ``kind`` ("drafter" | "model" | "scorer"), else
    ValueError naming what it holds: refused before the training, not found broken after it."""
    found = folder_kind(out)
    if found is None or found == kind:
        return
    held = {"drafter": "an EAGLE-3 drafter", "model": "a model (not a drafter)",
            "scorer": "a boundary scorer"}.get(found, found)
    raise ValueError(f"out: {out} holds {held}; training a {'target' if kind == 'model' else kind} "
                     "there would replace its config.json and weights: give another folder")
