"""Training into a shipped model's folder says so (it is the reproduction path, but replaces an asset)."""

from __future__ import annotations

from gambit.paths import ASSETS, DRAFTER_PR, SCORER_MLP, TARGET, overwrite_note


def test_a_shipped_folder_is_named_and_another_is_not(tmp_path):
    for folder in (TARGET, DRAFTER_PR, SCORER_MLP, ASSETS / "ablations" / "drafter-pr-beta0"):
        note = overwrite_note(str(folder))
        assert note.startswith(f"note: this writes over the shipped model in {folder}") and "--out" in note
    assert overwrite_note(str(tmp_path / "mine")) == ""
    assert overwrite_note(str(ASSETS)) == ""  # not a model's folder


def test_an_output_file_that_cannot_be_written_is_refused_before_the_work(tmp_path, capsys):
    """`gambit run --save /proc/s.json` solved its problems and then failed on the save; `--png
    /dev/null/r.png` said only "[Errno 17] File exists: '/dev/null'". The folder is probed now, as
    ``check_output_dir`` does (``os.access`` says yes to root on a read-only mount), and nothing is
    created by the check."""
    import pytest

    from gambit.cli import main
    from gambit.paths import check_output

    with pytest.raises(ValueError, match=r"^save: /proc/s\.json: cannot write in /proc"):
        check_output("/proc/s.json", "save")
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match=r"^png: .*/f/r\.png: .*/f is a file, not a folder"):
        check_output(str(tmp_path / "f" / "r.png"), "png", image=True)
    with pytest.raises(ValueError, match=r"/f is a file, not a folder"):
        check_output(str(tmp_path / "f" / "deeper" / "r"), "png", image=True)  # r -> r.png
    check_output(str(tmp_path / "new" / "sub" / "s.json"), "save")  # a folder to be made: fine
    assert not (tmp_path / "new").exists()
    with pytest.raises(SystemExit, match="save: /proc/s.json: cannot write in /proc"):
        main(["run", "--save", "/proc/s.json"])  # before the model loads
    assert main(["inspect", "p1", "--store", str(tmp_path / "none.json"), "--png", "/proc/x.png"]) == 2
    assert "png: /proc/x.png: cannot write in /proc" in capsys.readouterr().err  # before the store is read
