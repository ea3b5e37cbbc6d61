"""`gambit inspect --png` refuses a path it cannot draw to before it reads the store, as `gambit run
--png` does: a directory was written as a sibling ``DIR.png`` with rc 0."""

from __future__ import annotations

import pytest

from gambit.cli import main
from gambit.search.lineage import inspect_run, lineage_png


def test_inspect_refuses_a_directory_png_before_reading_the_store(tmp_path, capsys):
    out = tmp_path / "results"
    out.mkdir()
    missing = str(tmp_path / "no_store.json")  # never opened: the png is checked first
    with pytest.raises(ValueError, match="png: .*results is a directory; give a file path"):
        inspect_run("p2", missing, png=str(out))
    assert main(["inspect", "p2", "--store", missing, "--png", str(out)]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert not (tmp_path / "results.png").exists()


def test_inspect_refuses_a_bare_png_path_whose_png_is_a_directory_and_a_non_picture_suffix(tmp_path):
    (tmp_path / "pic.png").mkdir()
    with pytest.raises(ValueError, match=r"pic is written to .*pic\.png, a directory"):
        inspect_run("p2", str(tmp_path / "s.json"), png=str(tmp_path / "pic"))
    with pytest.raises(ValueError, match=r"a picture is written as .* not \.txt"):
        inspect_run("p2", str(tmp_path / "s.json"), png=str(tmp_path / "tree.txt"))


def test_lineage_png_checks_its_path_before_drawing(tmp_path):
    with pytest.raises(ValueError, match="is a directory"):
        lineage_png("r", {}, tmp_path)  # no data needed: refused before it is read
