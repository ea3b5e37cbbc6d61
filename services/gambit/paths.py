"""Where the shipped assets and the local cache live."""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the checkout: services/gambit/paths.py -> repo root
ASSETS = Path(__file__).resolve().parent / "assets"
TARGET = ASSETS / "target"
DRAFTER_EAGLE31 = ASSETS / "drafter-eagle3.1"
DRAFTER_PR = ASSETS / "drafter-pr"
DRAFTER_HASS = ASSETS / "drafter-hass"
DRAFTER_HASS_PR = ASSETS / "drafter-hass-pr"
# Table 3 ablation drafters: drafter-pr-beta0, drafter-pr-noselfq, drafter-eagle3.1-2layer
ABLATIONS = ASSETS / "ablations"
SCORER_MLP = ASSETS / "scorer-mlp"
SCORER_SEQUENCE = ASSETS / "scorer-sequence"
# per-thought (process) labels + the target's sampled-token confidence: the search's default scorer
SCORER_PROCESS = ASSETS / "scorer-process"


def cache_dir() -> Path:
    """Downloads, generated training data and rollouts: ``$GAMBIT_CACHE`` or ``~/.cache/gambit``."""
    return Path(os.environ.get("GAMBIT_CACHE") or Path.home() / ".cache" / "gambit")
