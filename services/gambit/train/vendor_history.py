"""Reference loss histories per CPU vendor, for the tests that retrain a shipped model and compare.

Under ``isa="compatible"`` every shipped model's first steps give the same floats on every AMD CPU
tried (an AVX2-only and an AVX-512 EPYC), where the cards were made. On an Intel Xeon (stop 43) they do
not: with the engine's GEMM choice pinned too (``GAMBIT_GEMM_VENDOR``) the MLP scorer's probe matches
its card exactly, but MKL's compatible branch and vector math (``exp``, ``log``, ``tanh`` … go through
MKL's VML) still round some last bits differently on the two vendors, and from there the histories
part: the target at step 200 (1.45004 against the card's 1.45465), the drafters from step 1-12, two
scorer probes in a loss's 8th digit. No library switch tried closed that (``MKL_CBWR`` AVX / AVX2 /
SSE4_2 / AVX512 / AUTO / COMPATIBLE,STRICT, ``MKL_DYNAMIC``; docs/notes/training.md, "Stop 43"), and
new cards in another arithmetic would re-ship every model. So beside its card a model folder keeps the
same retraining's history on each other vendor (``repro-<vendor>.json``, written by
``tools/record_vendor_history.py``), and a test compares a rerun exactly with its own vendor's history:
the card's where the card was made, the record elsewhere.
"""

from __future__ import annotations

import json
import platform
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from gambit.cpu_info import cpu_model, cpu_vendor
from gambit.paths import ASSETS, TARGET

if TYPE_CHECKING:
    from gambit.train.target import TrainTargetConfig

RECORD = "repro-{}.json"


def record_path(folder: Path, vendor: str) -> Path:
    return Path(folder) / RECORD.format(vendor or "unknown")


def reference(folder: Path, card_history: list[dict], card_vendor: str, vendor: str | None = None
              ) -> tuple[list[dict] | None, str]:
    """The history a rerun on ``vendor`` (default: this CPU's) must equal exactly, and where it comes
    from; ``None`` when neither the card nor a record was made on that vendor."""
    vendor = cpu_vendor() if vendor is None else vendor
    if vendor == card_vendor:
        return card_history, f"the card ({card_vendor})"
    path = record_path(folder, vendor)
    if not path.is_file():
        return None, f"no history for {vendor or 'this CPU'} (card: {card_vendor}); write {path.name} " \
                     "with tools/record_vendor_history.py"
    return json.loads(path.read_text())["loss_history"], f"{path.name}"


def write_record(folder: Path, history: list[dict], command: str, card_vendor: str) -> Path:
    """Save this CPU's rerun history next to a card made on another vendor."""
    vendor = cpu_vendor()
    if vendor == card_vendor:
        raise ValueError(f"{folder}: the card itself was made on {vendor}; it is the reference here")
    path = record_path(folder, vendor)
    keep = ("step", "loss", "epoch", "train_loss", "val_loss", "val_auc", "steps")
    rec = {"cpu_vendor": vendor, "cpu_model": cpu_model(), "card_vendor": card_vendor,
           "torch_version": torch.__version__, "machine": platform.machine(), "command": command,
           "loss_history": [{k: h[k] for k in keep if k in h} for h in history]}
    path.write_text(json.dumps(rec, indent=1) + "\n")
    return path


def card(folder: Path) -> dict:
    return json.loads((Path(folder) / "training.json").read_text())


def card_vendor(info: dict) -> str:
    """The vendor a card was made on (target and drafter cards at the top, scorer cards in
    ``environment``)."""
    return info.get("cpu_vendor") or info.get("environment", {}).get("cpu_vendor", "")


def target_config(out: str) -> TrainTargetConfig:
    """The shipped target's card config (``TrainTargetConfig``) with its thread count, writing to ``out``."""
    from gambit.train.target import TrainTargetConfig

    info = card(TARGET)
    known = {f.name for f in fields(TrainTargetConfig)}
    cfg = {k: v for k, v in info["config"].items() if k in known}
    cfg.update(out=out, threads=info["torch_threads"])
    return TrainTargetConfig(**cfg)


def rerun_target(out: str, steps: int = 200) -> dict:
    """The shipped target's card config, retrained for ``steps`` (+ the step-0 entry) under its isa."""
    from gambit.train.target import train_target

    return train_target(target_config(out), stop=steps + 1)


def rerun_drafter(name: str, steps: int, cache_dir: str) -> dict:
    """A shipped drafter's (or ablation's) card config, retrained for ``steps`` with its data
    regenerated into ``cache_dir`` (an empty folder: never an earlier run's data)."""
    from gambit.train.drafter import TrainDrafterConfig, train_drafter

    info = card(ASSETS / name)
    known = {f.name for f in fields(TrainDrafterConfig)}
    cfg = TrainDrafterConfig(**{k: v for k, v in info["config"].items()
                                if k in known and k not in ("target", "cache_dir")},
                             target=str(TARGET), cache_dir=cache_dir)
    return train_drafter(cfg, stop=steps)


def rerun_probe(folder: Path) -> list[dict]:
    """A shipped scorer's reproducibility probe (its first rollout chunk and epochs) from scratch."""
    from gambit.scoring.train import TrainScorerConfig, probe_history

    info = card(folder)
    return probe_history(TrainScorerConfig(**{**info["config"], "model": str(TARGET)}))
