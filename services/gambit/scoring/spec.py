"""One way to name a scorer, for `gambit run`, the benchmarks and the services alike.

A spec is one of:

* ``process`` (also ``""``): the shipped process scorer (hidden state + the target's sampled-token
  confidence, per-thought labels): the default everywhere;
* ``mlp`` / ``sequence``: the shipped STEP probe / history-aware GRU (hidden state alone);
* ``confidence[:<hidden>]``: the training-free ``ConfidenceScorer``;
* ``random[:<kind>[:<hidden>[:<seed>]]]``: a seeded untrained scorer (tests; no signal);
* anything else: a scorer folder (config.json + model.safetensors), which must fit the model: one
  of another width is refused where the model's width is known.

A shipped name wins over a folder of that name in the working directory: give ``./mlp`` for the folder
(``load_scorer_spec`` notes it when both exist).

A shipped scorer reads the shipped target's width. For a model of another width (a real checkpoint)
``process`` falls back to the confidence scorer (the signal it leans on, untrained) and ``mlp`` /
``sequence`` to a random scorer of their kind, with a note saying so.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from gambit.serving.limits import MAX_KEYS, MAX_STATE_MB

SHIPPED = ("process", "mlp", "sequence")
DEFAULT_HIDDEN = 192  # the shipped target's width: what a spec without one means


def _stderr(message: str) -> None:
    print(f"note: {message}", file=sys.stderr)


def shipped_folder(name: str) -> Path:
    """The asset folder of a shipped scorer (``process`` | ``mlp`` | ``sequence``)."""
    from gambit import paths

    return {"process": paths.SCORER_PROCESS, "mlp": paths.SCORER_MLP,
            "sequence": paths.SCORER_SEQUENCE}[name]


def _fields(spec: str) -> tuple[str, list[str]]:
    """(``process`` | ``mlp`` | ``sequence`` | ``confidence`` | ``random`` | ``folder``, its arguments)."""
    if spec in ("", *SHIPPED):
        return spec or "process", []
    head, *args = spec.split(":")
    if head in ("confidence", "random"):
        return head, args
    return "folder", [spec]


def _int(spec: str, text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"scorer {spec!r}: {what} {text!r} is not an integer") from None
    low = 1 if what == "hidden size" else 0
    if value < low:
        raise ValueError(f"scorer {spec!r}: {what} must be >= {low}, got {value}")
    return value


def check_scorer_spec(spec: str, hidden_size: int = 0) -> None:
    """ValueError for a spec ``load_scorer_spec`` refuses: a command checks it before its model loads,
    whether or not its method scores (a typo went unnoticed under ``--method sc``). A folder is loaded
    (a small network): missing weights or another width than ``hidden_size`` (0: unknown) surfaced
    only after `gambit serve` had started Ray, as "Failed to update the deployments ['Scorer']"."""
    kind, _ = _checked(spec, hidden_size or DEFAULT_HIDDEN)
    if kind == "folder":
        try:
            load_scorer_spec(spec, hidden_size, note=None)
        except OSError as e:  # a folder without weights
            raise ValueError(str(e)) from None


def _checked(spec: str, width: int) -> tuple[str, list]:
    """``(kind, arguments)`` of a valid spec: confidence [hidden], random [net, hidden, seed], folder
    [path], a shipped name []; else ValueError saying what was wrong."""
    kind, args = _fields(spec)
    if kind == "confidence":
        if len(args) > 1:
            raise ValueError(f"scorer {spec!r}: confidence takes at most a hidden size (confidence:<hidden>)")
        return kind, [_int(spec, args[0], "hidden size") if args else width]
    if kind == "random":
        net = args[0] if args and args[0] else "mlp"
        if net not in ("mlp", "sequence"):
            raise ValueError(f"scorer {spec!r}: random kind must be mlp or sequence, got {net!r}")
        hidden = _int(spec, args[1], "hidden size") if len(args) > 1 else width
        return kind, [net, hidden, _int(spec, args[2], "seed") if len(args) > 2 else 0]
    if kind == "folder" and not (Path(args[0]) / "config.json").is_file():
        raise ValueError(f"scorer {spec!r}: no scorer folder there (need config.json); a spec is "
                         f"{' | '.join(SHIPPED)} | confidence[:H] | random[:kind[:H[:seed]]] | a folder")
    return kind, args


def load_scorer_spec(spec: str = "process", hidden_size: int = 0, invariant: bool = True,
                     note: Callable[[str], None] | None = _stderr, max_keys: int = MAX_KEYS,
                     max_state_mb: int = MAX_STATE_MB):
    """The scorer ``spec`` names (module docstring). ``hidden_size``: the model's width (0: unknown,
    no fallback, the shipped target's for specs that need one); ``invariant``: a trained scorer's
    batch-invariant scoring (False: the batched network, for comparisons); ``note``: told of a
    fallback (None: silent); ``max_keys`` / ``max_state_mb``: a ``BoundaryScorer``'s history bounds,
    set as it is built (a served scorer was briefly unbounded, and a start path that forgot to set
    them kept the defaults; the confidence scorer keeps no history: unused there)."""
    import gambit.scoring as scoring

    width = hidden_size or DEFAULT_HIDDEN
    bounds = {"max_keys": max_keys, "max_state_mb": max_state_mb}
    kind, args = _checked(spec, width)
    if kind == "confidence":
        return scoring.ConfidenceScorer(args[0])
    if kind == "random":
        return scoring.random_scorer(args[0], args[1], seed=args[2], invariant=invariant, **bounds)
    if kind == "folder":
        scorer = scoring.load_scorer(Path(args[0]), invariant=invariant, **bounds)
        if hidden_size and scorer.hidden_size != hidden_size:  # served, every call fell back to 0.5
            raise ValueError(f"--scorer {spec!r}: this scorer folder reads hidden states of width "
                             f"{scorer.hidden_size}, the model's hidden size is {hidden_size}; give a scorer "
                             "trained for this model (gambit train scorer --model M --out DIR)")
        return scorer
    if spec and note and (Path(spec) / "config.json").is_file():
        note(f"--scorer {spec!r} is the shipped {kind} scorer; the folder {spec!r} here is not read "
             f"(give ./{spec} for it)")
    folder = shipped_folder(kind)
    if (folder / "config.json").is_file():
        scorer = scoring.load_scorer(folder, invariant=invariant, **bounds)
        if not hidden_size or scorer.hidden_size == hidden_size:
            return scorer
        why = f"the shipped {kind} scorer reads width {scorer.hidden_size}, this model has {hidden_size}"
    else:
        why = f"no shipped {kind} scorer at {folder}"
    if kind == "process":
        if note:
            note(f"{why}; scoring with the target's own confidence (ConfidenceScorer, untrained)")
        return scoring.ConfidenceScorer(width)
    if note:
        note(f"{why}; using a random one (no signal)")
    return scoring.random_scorer(kind, width, invariant=invariant, **bounds)


def reads_confidence(spec: str) -> bool:
    """Whether the scorer ``spec`` names reads the target's confidence features (a Target that calls a
    ScorerService running it sends them, ``ScoreRequest.features``). Read from the folder's
    config.json; nothing is loaded. A shipped name whose folder is missing falls back as
    ``load_scorer_spec`` does (``process``: the confidence scorer)."""
    from gambit.scoring.config import ScorerConfig

    kind, args = _fields(spec)
    if kind in ("confidence", "random"):
        return kind == "confidence"
    folder = Path(args[0]) if kind == "folder" else shipped_folder(kind)
    if not (folder / "config.json").is_file():
        return kind == "process"  # a folder that is not there: load_scorer_spec names what is missing
    return ScorerConfig.from_file(folder / "config.json").confidence


def keeps_history(spec: str) -> bool:
    """Whether the scorer ``spec`` names keeps per-trace history (a sequence scorer): a ScorerService
    running it must be one replica, since a trace's boundaries scored on two replicas would each see
    half of its history. Read from the folder's config.json (no torch import: the config builders
    call it); nothing is loaded."""
    kind, args = _fields(spec)
    if kind in ("confidence", "random"):
        return kind == "random" and bool(args) and args[0] == "sequence"
    folder = Path(args[0]) if kind == "folder" else shipped_folder(kind)
    if not (folder / "config.json").is_file():
        return kind == "sequence"  # a shipped name without its folder falls back to a random one of its kind
    return json.loads((folder / "config.json").read_text()).get("kind") == "sequence"
