"""Checks of the bench commands' own flags, run before any model loads or any work starts: each error
is a ValueError naming one flag and its value (``gambit.checks`` says why one flag a message), which
``gambit`` prints as "error: ..."."""

from __future__ import annotations

import re
from pathlib import Path

DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


def device(flag: str, value: str) -> str:
    """``value`` if it names a device the engine takes (auto | cpu | cuda | cuda:N) and, for cuda:N, one
    this host has (N below ``torch.cuda.device_count()``)."""
    if not DEVICE.fullmatch(value):
        raise ValueError(f"{flag} must be auto, cpu, cuda or cuda:N, got {value!r}")
    if value.startswith("cuda"):  # else the model's .to() ends in a traceback after the other checks
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if int(value.partition(":")[2] or 0) >= n:
            raise ValueError(f"{flag} {value}: no such CUDA device here (torch {torch.__version__}, "
                             f"{n} GPU{'' if n == 1 else 's'})")
    return value


def model(flag: str, value: str) -> Path:
    """The model folder ``value`` names: a folder with config.json, or a registered name once fetched."""
    from gambit.model.registry import resolve_model

    try:
        folder = resolve_model(value)
    except FileNotFoundError as e:  # a registered name not fetched yet: its message says how to fetch
        raise ValueError(f"{flag} {value}: {e}") from None
    if not (folder / "config.json").is_file():
        raise ValueError(f"{flag} {value}: no model folder there (need config.json) nor a registered "
                         "model name (gambit models list)")
    return folder


def scorer(flag: str, spec: str) -> str:
    """``spec`` if it names a scorer that loads (``gambit.scoring.spec``; a small network, no model)."""
    from gambit.scoring.spec import load_scorer_spec

    try:
        load_scorer_spec(spec, note=None)
    except (OSError, ValueError) as e:  # a folder without weights, weights that do not fit
        raise ValueError(f"{flag}: {e}") from None  # e names the spec
    return spec


def out_path(flag: str, value: str | None, image: bool = False, folder: bool = False) -> None:
    """An output a bench writes after its run (``--json``, ``--plot``; ``folder``: ``--plots``), refused
    before the run, not after it (a mistyped or read-only target once cost the whole measurement): a
    directory given for a file (a file for a folder), a file where one of its folders must be, a folder
    nothing can be written in, a picture suffix matplotlib does not write. Nothing is created: the
    writes make the missing folders. A probe file is made and removed: ``os.access`` says yes to root
    on a read-only mount. None or "" = no output."""
    from gambit.paths import IMAGE_SUFFIXES, check_writable, nearest_existing

    if not value:
        return
    p = Path(value)
    if folder and p.exists() and not p.is_dir():
        raise ValueError(f"{flag} {value}: a file; give a folder (the pictures are written into it)")
    if not folder and p.is_dir():
        raise ValueError(f"{flag} {value}: a directory; give a file path")
    if image and p.suffix and p.suffix.lower() not in IMAGE_SUFFIXES:
        raise ValueError(f"{flag} {value}: a picture is written as {' | '.join(IMAGE_SUFFIXES)}, not "
                         f"{p.suffix}")
    check_writable(nearest_existing(p.absolute() if folder else p.absolute().parent), f"{flag} {value}")
