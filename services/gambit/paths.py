"""Where the shipped assets live."""

from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "assets"
TARGET = ASSETS / "target"
SCORER_MLP = ASSETS / "scorer-mlp"
SCORER_SEQUENCE = ASSETS / "scorer-sequence"
