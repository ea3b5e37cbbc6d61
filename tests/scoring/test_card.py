"""The scorer model cards: what they claim, and that their snippet loads the scorer from anywhere."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from gambit.paths import ASSETS
from gambit.scoring.card import write_card
from gambit.scoring.spec import load_scorer_spec

NAMES = ("scorer-mlp", "scorer-process", "scorer-sequence")


@pytest.fixture
def cards(tmp_path):
    """Copies of the three shipped scorer folders (a card compares with its sibling MLP)."""
    for name in NAMES:
        if not (ASSETS / name / "training.json").is_file():
            pytest.skip(f"{name} not shipped")
        shutil.copytree(ASSETS / name, tmp_path / name)
    return tmp_path


def edit(folder, change) -> None:
    path = folder / "training.json"
    info = json.loads(path.read_text())
    change(info)
    path.write_text(json.dumps(info))


def test_sequence_card_states_the_figures_without_a_claim(cards):
    """It said the GRU "was kept for its validation AUC" beside the MLP's higher 0.623, and named
    "this session's CPU budget"."""
    text = write_card(cards / "scorer-sequence").read_text()
    assert "| selection | validation AUC at the best epoch 0.590 (the MLP on the same split: 0.623) |" in text
    assert "kept for" not in text and "session" not in text
    # an MLP trained on other rollouts is not "the same split": no comparison then
    edit(cards / "scorer-mlp", lambda i: i["data"]["train_rollouts"].update(n_problems=16))
    assert "the MLP on the same split" not in write_card(cards / "scorer-sequence").read_text()


@pytest.mark.parametrize("name, spec", [("scorer-mlp", "mlp"), ("scorer-process", "process"),
                                        ("scorer-sequence", "sequence")])
def test_snippet_loads_the_scorer_from_any_directory(cards, name, spec, monkeypatch):
    """`load_scorer("scorer-process")` raised FileNotFoundError anywhere but the assets folder."""
    text = write_card(cards / name).read_text()
    m = re.search(r'scorer = load_scorer_spec\("([^"]+)"\)', text)
    assert m and m[1] == spec and "from gambit.scoring.spec import load_scorer_spec" in text
    monkeypatch.chdir(cards)  # not the assets folder
    cfg = json.loads((cards / name / "config.json").read_text())
    scorer = load_scorer_spec(m[1])
    assert scorer.hidden_size == cfg["hidden_size"] and scorer.config.kind == cfg["kind"]


def test_users_card_loads_its_folder_and_names_its_model(cards, tmp_path, monkeypatch):
    """A scorer of one's own model: the snippet named the shipped folder's name, the first line "the
    shipped target"."""
    mine = tmp_path / "runs" / "mine"
    shutil.copytree(cards / "scorer-mlp", mine)

    def own(info):
        info["config"].update(out="runs/mine", model="smollm2")
        info["scorer"]["target"] = "smollm2"
    edit(mine, own)
    text = write_card(mine).read_text()
    assert "shipped target" not in text and "Scores a reasoning trace of the model `smollm2`" in text
    spec = re.search(r'load_scorer_spec\("([^"]+)"\)', text)[1]
    assert spec == str(mine.resolve())
    monkeypatch.chdir(cards / "scorer-mlp")
    assert load_scorer_spec(spec).hidden_size == 192


def test_process_card_names_the_label_its_table_grades_against(cards):
    """Its table ("correct", "AUC") graded the final correctness, not the process label it was trained on,
    and did not say so."""
    text = write_card(cards / "scorer-process").read_text()
    assert "Boundary AUC against the trace's final correctness" in text
    assert "trained on the process label: its AUC against that label is the `process label` line" in text
    table = text.split("## Held-out AUC")[1].split("```\n")[1]
    assert table.startswith("AUC against the trace's final correctness (final ok:")
    assert " thought boundaries final ok     AUC  AUC mean\n" in table
    assert "trained on the" not in write_card(cards / "scorer-mlp").read_text()  # its label is the table's
