"""Stop 69: training settings and output folders refused before the work, cards whose command parses,
checkpoints beside the output, a pinned child's errors and printed lines, reduced-vocabulary acceptance."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from gambit.paths import ASSETS, TARGET
from gambit.train import drafter_eval, repro
from gambit.train.card import command_line
from gambit.train.drafter import TrainDrafterConfig
from gambit.train.drafter_data import TraceSet
from gambit.train.target import TrainTargetConfig, checkpoint_dir, train_target


def test_topk_widths_beyond_the_draft_vocabulary_are_refused():
    """hass_topk 200 on the 100-token target crashed in topk after the data phase; fresh_k >= the
    vocabulary left the reconsideration nothing to learn (or crashed the same way)."""
    with pytest.raises(ValueError, match=r"hass_topk must be <= the draft vocabulary \(100 tokens\), "
                                         r"got 101"):
        TrainDrafterConfig(method="hass", hass_topk=101)
    with pytest.raises(ValueError, match=r"hass_topk .*\(40 tokens\), got 41"):
        TrainDrafterConfig(method="hass+pr", hass_topk=41, draft_vocab=40)
    with pytest.raises(ValueError, match=r"fresh_k must be < the draft vocabulary \(100 tokens.*got 100"):
        TrainDrafterConfig(method="pr", reconsider_loss="fresh", fresh_k=100)
    TrainDrafterConfig(method="hass", hass_topk=100)
    TrainDrafterConfig(method="pr", reconsider_loss="fresh", fresh_k=99)


def test_a_drafter_and_a_target_do_not_replace_each_others_folders(tmp_path):
    """--out the target's folder wrote the drafter's config.json and weights over the target's."""
    with pytest.raises(ValueError, match=r"out: .*target holds a model \(not a drafter\); training a "
                                         r"drafter there"):
        TrainDrafterConfig(out=str(TARGET))
    with pytest.raises(ValueError, match=r"drafter-pr holds an EAGLE-3 drafter; training a target"):
        TrainTargetConfig(out=str(ASSETS / "drafter-pr"))
    with pytest.raises(ValueError, match=r"scorer-mlp holds a boundary scorer; training a drafter"):
        TrainDrafterConfig(out=str(ASSETS / "scorer-mlp"))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="holds an unreadable config.json"):
        TrainTargetConfig(out=str(tmp_path / "bad"))
    TrainDrafterConfig(out=str(tmp_path / "new"))  # new, empty or the same kind: taken
    TrainDrafterConfig(method="pr", out=str(ASSETS / "drafter-eagle3.1"))
    TrainTargetConfig(out=str(tmp_path))


def test_card_command_spells_a_switch_as_its_flag():
    """The card said `--spell-products True`, which the parser refuses."""
    from gambit.cli import build_parser

    cfg = {**json.loads((TARGET / "training.json").read_text())["config"], "spell_products": True}
    cmd = command_line(cfg, TARGET)
    assert cmd == "gambit train target --spell-products --isa compatible" and "True" not in cmd
    args = build_parser().parse_args(cmd.split()[1:])
    assert args.spell_products is True and args.isa == "compatible"


def test_checkpoints_go_beside_the_output_folder(tmp_path):
    """--out DIR/ put them inside it, as DIR/-step1; a stop= run (the repro tests) saved them too."""
    assert checkpoint_dir(f"{tmp_path}/t/", 100) == tmp_path / "t-step100"
    tiny = dict(steps=3, batch_size=1, hidden_size=16, num_heads=2, num_kv_heads=2, intermediate_size=32,
                threads=1, eval_samples=0, checkpoint_every=1)
    train_target(TrainTargetConfig(out=f"{tmp_path}/r/", **tiny), stop=3)
    assert list(tmp_path.iterdir()) == []
    train_target(TrainTargetConfig(out=f"{tmp_path}/t/", **tiny))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t", "t-step1", "t-step2"]
    assert not [p for p in (tmp_path / "t").iterdir() if p.is_dir()]


CHILD = '''
from dataclasses import dataclass


@dataclass
class Cfg:
    n: int = 1


def work(cfg: Cfg) -> dict:
    print("step 0: held-out", cfg.n)
    if cfg.n < 0:
        raise ValueError(f"n must be >= 0, got {cfg.n}")
    if cfg.n == 99:
        print("step 1: held-out", cfg.n)
        raise SystemExit(1)
    return {"n": cfg.n}
'''


def test_pinned_child_shows_its_lines_and_says_its_error_in_one(tmp_path, monkeypatch, capsys):
    """The child's stdout (a drafter's held-out lines) was swallowed, and its ValueError came back as
    its traceback and then a RuntimeError traceback of the parent's."""
    (tmp_path / "s69_child.py").write_text(CHILD)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.delenv(repro.PINNED_CHILD, raising=False)
    assert repro.run_pinned("compatible", "s69_child", "work", {"n": 2}) == {"n": 2}
    assert capsys.readouterr().out == "step 0: held-out 2\n"
    with pytest.raises(ValueError, match=r"^n must be >= 0, got -1 \(s69_child.work under isa=compatible "
                                         r"exited with 3\)$") as e:
        repro.run_pinned("compatible", "s69_child", "work", {"n": -1})
    assert isinstance(e.value, RuntimeError)  # what callers caught before
    assert "Traceback" not in capsys.readouterr().err
    with pytest.raises(RuntimeError, match="exited with 1"):  # no result: its last line is shown too
        repro.run_pinned("compatible", "s69_child", "work", {"n": 99})
    assert capsys.readouterr().out == "step 0: held-out 99\nstep 1: held-out 99\n"


def test_reduced_vocabulary_acceptance_counts_the_traces_token(monkeypatch):
    """The recorded logits span the draft ids only: where the greedy token lies outside them, their
    argmax is another token, and a draft agreeing with it was counted as accepted."""
    data = TraceSet(tokens=torch.tensor([1, 2, 3, 4, 5]), offsets=torch.tensor([0, 5]),
                    prompt_len=torch.tensor([1]), taps=torch.zeros(5, 3, dtype=torch.half),
                    logits=torch.zeros(5, 4, dtype=torch.half), draft_ids=torch.tensor([1, 2, 3, 4]))
    # rows 0, 1, 2 predict the trace's 3, 4, 5 (5: no draft id); the target's best draft ids 2, 3, 3
    best = torch.nn.functional.one_hot(torch.tensor([[2, 3, 3, 0]]), 4).float()
    valid = torch.tensor([[True, True, True, False]])

    def unroll(drafter, batch, n_steps, pad_id, select):
        assert torch.equal(batch["ids"], data.tokens[None])
        yield 0, best.clone(), best.clone(), valid, None

    monkeypatch.setattr(drafter_eval, "unroll", unroll)
    out = drafter_eval.heldout_acceptance(torch.nn.Linear(1, 1), data, 0, 1, 0.25, None)
    assert out["top1"] == round(2 / 3, 4) and out["tau_chain"] == round(1 + 2 / 3, 4)
    full = TraceSet(**{**data.__dict__, "draft_ids": None})  # the whole vocabulary: the logits' argmax
    assert drafter_eval.heldout_acceptance(torch.nn.Linear(1, 1), full, 0, 1, 0.25, None)["top1"] == 1.0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
