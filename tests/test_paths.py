"""Training into a shipped model's folder says so (it is the reproduction path, but replaces an asset)."""

from __future__ import annotations

from gambit.paths import ASSETS, DRAFTER_PR, SCORER_MLP, TARGET, overwrite_note


def test_a_shipped_folder_is_named_and_another_is_not(tmp_path):
    for folder in (TARGET, DRAFTER_PR, SCORER_MLP, ASSETS / "ablations" / "drafter-pr-beta0"):
        note = overwrite_note(str(folder))
        assert note.startswith(f"note: this writes over the shipped model in {folder}") and "--out" in note
    assert overwrite_note(str(tmp_path / "mine")) == ""
    assert overwrite_note(str(ASSETS)) == ""  # not a model's folder
