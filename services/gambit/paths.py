"""Where the shipped assets and the local cache live."""

import os
import sys
import tempfile
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


def overwrite_note(out: str) -> str:
    """A line for a training command whose output folder is a shipped model's ("" otherwise): that is
    the reproduction path, but a run with other settings replaces what the project ships."""
    p = Path(out).resolve()
    if p == ASSETS or not p.is_relative_to(ASSETS):
        return ""
    return (f"note: this writes over the shipped model in {p} (`git checkout -- {p}` restores it; "
            f"--out DIR trains into another folder)")


def say_if_overwriting(out: str) -> None:
    """Print ``overwrite_note`` to stderr, before a training command starts."""
    if note := overwrite_note(out):
        print(note, file=sys.stderr)


# what matplotlib writes (Agg backends); a picture path without a suffix gets ".png"
IMAGE_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg", ".tif", ".tiff", ".webp", ".eps", ".ps")


def check_output(path: str, field: str, image: bool = False) -> None:
    """An output file refused before the work that fills it, not after: a directory, a picture suffix
    nothing writes, a file where a folder of its path must be, or a folder nothing can be written in
    (probed as ``check_output_dir`` does; nothing is created) ("" = no output)."""
    if not path:
        return
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{field}: {path} is a directory; give a file path")
    if image and p.suffix and p.suffix.lower() not in IMAGE_SUFFIXES:
        raise ValueError(f"{field}: {path}: a picture is written as {' | '.join(IMAGE_SUFFIXES)}, "
                         f"not {p.suffix}")
    check_writable(nearest_existing((image_path(p) if image else p).absolute().parent), f"{field}: {path}")


def check_output_dir(path: str, field: str = "out", beside: bool = False) -> None:
    """A training's output folder refused before the training, not when it is saved: a file there, or
    a folder that cannot be created or written (``beside``: also its parent, where an atomic save puts
    its temporary folder). A probe file is made and removed: ``os.access`` says yes to root on a
    read-only mount."""
    p = Path(path).absolute()
    if p.exists() and not p.is_dir():
        raise ValueError(f"{field}: {path} is a file; give a folder")
    writes = {nearest_existing(p)} | ({nearest_existing(p.parent)} if beside else set())
    for folder in sorted(writes):
        check_writable(folder, f"{field}: {path}")


def check_cache_dir(path: str, field: str = "cache_dir") -> None:
    """A training's data cache (``path``; "" = ``cache_dir()``) refused before the data is generated:
    a file there, or a missing folder that cannot be made (the data was generated, then its save
    failed: "[Errno 2] No such file or directory"). A folder that exists passes unprobed: the cached
    data may be all a run reads, from a read-only shared cache."""
    p = Path(path) if path else cache_dir()
    if p.exists():
        if not p.is_dir():
            raise ValueError(f"{field}: {path or p} is a file; give a folder")
        return
    check_writable(nearest_existing(p.absolute()), f"{field}: {path or p}")


def check_writable(folder: Path, what: str) -> None:
    """``folder`` (an existing path) is a folder a file can be made in, probed with one: ``os.access``
    says yes to root on a read-only mount. ``what`` starts the error line."""
    if not folder.is_dir():
        raise ValueError(f"{what}: {folder} is a file, not a folder")
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        raise ValueError(f"{what}: cannot write in {folder} ({e.strerror})") from None


def nearest_existing(p: Path) -> Path:
    """``p`` or its closest ancestor that exists (what a mkdir -p would create inside)."""
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def image_path(path: str | Path) -> Path:
    """The file a picture at ``path`` is written to: matplotlib adds ".png" to a bare path, and the
    command then named a file that was not there."""
    p = Path(path)
    return p if p.suffix else p.with_name(p.name + ".png")
