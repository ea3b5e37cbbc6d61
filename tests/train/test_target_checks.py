"""``gambit train target`` settings refused before the training, and the folder it leaves: a card that
describes the new weights, files another user can read."""

from __future__ import annotations

import json
import os
import random
import stat

import pytest

from gambit.cli import main
from gambit.paths import TARGET
from gambit.train.card import command_line
from gambit.train.target import TrainTargetConfig, longest_sequence

TINY = ["--steps", "1", "--batch-size", "1", "--hidden-size", "16", "--num-heads", "2", "--num-kv-heads", "2",
        "--intermediate-size", "32", "--threads", "1", "--eval-samples", "0"]


def test_retraining_replaces_the_card_and_drops_the_old_evaluation(tmp_path, capsys):
    """save_model kept an earlier model's README.md and eval_test.json beside new weights: the card
    claimed the old steps, command and accuracy. Folder and weights were 0700 / 0600 (mkdtemp,
    safetensors): unreadable to a serving user."""
    out = tmp_path / "t"
    out.mkdir()
    (out / "README.md").write_text("# Shipped target\n\n3 steps x 2 problems, pass@1 55.8%\n")
    (out / "eval_test.json").write_text('{"samples": 16}')
    old = os.umask(0o022)
    try:
        assert main(["train", "target", "--out", str(out), *TINY]) == 0
    finally:
        os.umask(old)
    card = (out / "README.md").read_text()
    assert not (out / "eval_test.json").exists()
    assert card.startswith("# Target: ") and "55.8%" not in card and "1 steps x 1 problems" in card
    assert "Not evaluated" in card and "--eval-samples 0" in card and f"--out {out}" in card
    assert f"model card: {out / 'README.md'}" in capsys.readouterr().out
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert stat.S_IMODE((out / "model.safetensors").stat().st_mode) == 0o644


def test_card_command_reproduces_the_model():
    """The command had no --out (rerun, it wrote over the shipped target) and no --eval-samples."""
    cfg = {**json.loads((TARGET / "training.json").read_text())["config"], "eval_samples": 4}
    assert command_line(cfg, TARGET) == "gambit train target --isa compatible --eval-samples 4"
    assert command_line({**cfg, "eval_samples": 16}, TARGET / "../x").endswith("--isa compatible --out "
                                                                                 "services/gambit/assets/x")


def test_eval_samples_is_read_from_a_config_file(tmp_path):
    """`eval_samples:` in --config was an unknown option (a flag added beside the dataclass)."""
    cfg = tmp_path / "t.yaml"
    cfg.write_text(f"eval_samples: -1\nout: {tmp_path / 't'}\n")
    with pytest.raises(SystemExit, match="eval_samples must be >= 0"):
        main(["train", "target", "--config", str(cfg)])


def test_max_positions_below_a_training_sequence_is_refused():
    """An IndexError traceback from the position table once a long problem came up."""
    with pytest.raises(ValueError, match=r"max_positions must be >= 155 \(the longest prompt \+ solution "
                                         r"with max_ops 8\), got 146"):
        TrainTargetConfig(max_positions=146)
    TrainTargetConfig(max_positions=155, max_ops=8)
    TrainTargetConfig(max_positions=80, min_ops=1, max_ops=2)  # the bound follows the task


@pytest.mark.parametrize("max_ops, spell", [(1, False), (8, False), (12, False), (4, True)])
def test_longest_sequence_bounds_the_generated_ones(max_ops, spell):
    from gambit.model import build_char_tokenizer
    from gambit.tasks.arithmetic import make_problem

    tok, rng = build_char_tokenizer(), random.Random(0)
    problems = (make_problem(rng, max_ops, spell) for _ in range(500))
    longest = max(len(tok.encode(p.prompt)) + len(tok.encode(p.solution, add_bos=False)) + 1
                  for p in problems)
    assert longest <= longest_sequence(max_ops, spell) <= 2 * longest


def test_a_bad_output_folder_is_refused_before_the_training(tmp_path):
    from gambit.train.target import train_target

    (tmp_path / "afile").write_text("")
    for out, said in [(tmp_path / "afile", "is a file; give a folder"),
                      (tmp_path / "afile" / "t", "afile is a file, not a folder"),
                      ("/proc/gambit-out", "cannot write in /proc")]:
        with pytest.raises(ValueError, match=f"out: {out}.*{said}"):
            train_target(TrainTargetConfig(out=str(out), steps=1))
