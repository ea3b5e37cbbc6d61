"""Every shipped model card is what its generator renders today from the files beside it: a wording
change in a card module (or a hand edit of a card) shows here, not in a user's retrained copy."""

from __future__ import annotations

import json
import shutil

import pytest

from gambit.paths import ASSETS, TARGET
from gambit.scoring.card import write_card as write_scorer_card
from gambit.train.card import card_text as target_card
from gambit.train.drafter_card import card_text as drafter_card


def test_shipped_target_card_is_rendered():
    assert (TARGET / "README.md").read_text() == target_card(TARGET)


@pytest.mark.parametrize("name", ["drafter-eagle3.1", "drafter-pr", "drafter-hass", "drafter-hass-pr"])
def test_shipped_drafter_card_is_rendered(name):
    folder = ASSETS / name
    info = json.loads((folder / "training.json").read_text())
    assert drafter_card(info) in (folder / "README.md").read_text()


@pytest.mark.parametrize("name", ["scorer-mlp", "scorer-process", "scorer-sequence"])
def test_shipped_scorer_card_is_rendered(name, tmp_path):
    for sibling in ("scorer-mlp", "scorer-process", "scorer-sequence"):  # a card compares with the MLP's
        shutil.copytree(ASSETS / sibling, tmp_path / sibling)
    assert write_scorer_card(tmp_path / name).read_text() == (ASSETS / name / "README.md").read_text()


def test_card_notes_are_kept_at_the_end(tmp_path):
    """The shipped target's history section lives in card_notes.md: regenerating the card keeps it."""
    copy = tmp_path / "target"
    shutil.copytree(TARGET, copy, ignore=shutil.ignore_patterns("*.safetensors"))
    (copy / "model.safetensors").write_bytes(b"x")
    (copy / "card_notes.md").write_text("## Notes\n\nkept\n")
    assert target_card(copy).endswith("\n## Notes\n\nkept\n")
