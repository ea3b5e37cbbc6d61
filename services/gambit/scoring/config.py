"""What a scorer is: one dataclass, saved as the scorer folder's ``config.json``."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

KINDS = ("mlp", "sequence")
ARCHS = ("gru", "attn")


@dataclass
class ScorerConfig:
    """A boundary scorer over ``hidden_size``-wide post-final-norm states of the target.

    ``mlp`` is STEP's probe ``Linear(d, mlp_hidden)-ReLU-Linear(mlp_hidden, 1)``, one state at a time.
    ``sequence`` reads a trace's boundary history: an input projection to ``model_dim``, then a
    one-layer GRU (``arch="gru"``) or one causal pre-norm attention block (``arch="attn"``, learned
    position per thought index up to ``max_thoughts``, later thoughts share the last), then a linear
    head; its score at boundary j depends on boundaries 1..j only.
    """

    kind: str = "mlp"
    hidden_size: int = 192  # width d of the target's hidden state (the scorer's input)
    mlp_hidden: int = 512  # mlp: width of the hidden layer (STEP: 512)
    arch: str = "gru"  # sequence: "gru" | "attn"
    model_dim: int = 128  # sequence: width of the projected states / GRU / attention
    num_heads: int = 4  # sequence attn: attention heads
    max_thoughts: int = 64  # sequence attn: learned thought-index positions
    target: str = ""  # the target model this scorer reads (informational)
    label: str = "final"  # what the score estimates: final | process | path (see labels.py; informational)
    confidence: bool = False  # input also holds the target's sampled-token confidence (confidence.py)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {ARCHS}, got {self.arch!r}")
        for name in ("hidden_size", "mlp_hidden", "model_dim", "num_heads", "max_thoughts"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not isinstance(self.confidence, bool):
            raise ValueError(f"confidence must be true or false, got {self.confidence!r}")
        if self.model_dim % self.num_heads:
            raise ValueError(f"model_dim {self.model_dim} is not divisible by num_heads {self.num_heads}")

    @property
    def input_size(self) -> int:
        """Width of one input row: the hidden state, plus the confidence features when used."""
        from gambit.scoring.confidence import FEATURES

        return self.hidden_size + (FEATURES if self.confidence else 0)

    def to_json(self) -> dict:
        return {"architectures": [f"BoundaryScorer{self.kind.upper()}"], **asdict(self)}

    @classmethod
    def from_file(cls, path: str | Path) -> ScorerConfig:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: scorer config.json does not exist")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: malformed JSON: {e}") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: expected a JSON object")
        archs = raw.pop("architectures", None) or []
        if "model_type" in raw or any(not str(a).startswith("BoundaryScorer") for a in archs):
            # a target or drafter folder read as an MLP scorer failed later on 57 unexpected tensors
            raise ValueError(f"{path.parent} is a model folder (model_type {raw.get('model_type', '?')}, "
                             f"architectures {archs}), not a scorer (its config.json names BoundaryScorer*)")
        unknown = sorted(set(raw) - {f.name for f in fields(cls)})
        if unknown:  # a typo (hidden_sise) fell back to the default silently
            raise ValueError(f"{path}: unknown keys {unknown}; a scorer config.json has "
                             f"{[f.name for f in fields(cls)]}")
        try:
            return cls(**raw)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
