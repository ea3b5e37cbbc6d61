"""The shipped scorers' training is reproducible: regenerating their first rollout chunk from scratch
and retraining the card's probe gives the loss history recorded in ``training.json`` (exactly on the
CPU instruction set the card records, within ``CROSS_ISA_RTOL`` on another)."""

import json

import pytest
import torch
from scoring_util import shipped_config, shipped_training

from gambit.paths import CANDIDATE, TARGET_COMPATIBLE
from gambit.scoring.repro import fixed_threads
from gambit.scoring.train import TrainScorerConfig, fit, probe_history
from gambit.train.repro import close, history_rtol


@pytest.mark.parametrize("kind", ["mlp", "sequence", "process"])
def test_probe_loss_history_matches_card(kind, train_chunk):
    info = shipped_training(kind)
    cfg = shipped_config(kind)
    assert info["torch_version"] == torch.__version__
    with fixed_threads(info["torch_threads"]):
        _, history, _ = fit(cfg, train_chunk, quiet=True, max_epochs=info["repro"]["epochs"])
    card = info["repro"]["loss_history"]
    env = info["environment"]
    rtol = history_rtol(env.get("cpu_capability"), env.get("cpu_amx", False), env.get("cpu_vendor"))
    if rtol == 0:
        assert history == card  # exact floats, not approximately
    assert [sorted(h) for h in history] == [sorted(h) for h in card]
    for got, want in zip(history, card, strict=True):
        for k, v in want.items():
            if k.endswith("auc") and rtol > 0:
                # a rank statistic: scores 1e-8 apart can swap on another ISA, each swap moving the
                # AUC by 1 / (positives x negatives), ~0.005 on this validation split
                assert abs(got[k] - v) <= 0.03, (k, got[k], v)
                continue
            assert close(got[k], v, rtol) if isinstance(v, float) else got[k] == v, (k, got[k], v)


def test_chunk_is_the_start_of_the_training_data(train_chunk):
    cfg = shipped_config("mlp")
    assert len(torch.unique(train_chunk["problem"])) == cfg.repro_problems
    assert len(train_chunk["correct"]) == cfg.repro_problems * cfg.samples


@pytest.mark.parametrize("kind", ["mlp", "sequence", "process"])
def test_candidate_probe_reproduces_exactly_on_any_cpu(kind):
    """The re-ship candidate's scorers (``--isa compatible``): the probe's rollouts and epochs, rerun
    under the same switches in a child process, give the card's history exactly on any x86 CPU."""
    path = CANDIDATE / f"scorer-{kind}" / "training.json"
    if not path.is_file():
        pytest.skip(f"candidate scorer-{kind} not trained yet")
    info = json.loads(path.read_text())
    assert info["config"]["isa"] == "compatible" and info["environment"]["cpu_capability"] == "DEFAULT"
    cfg = TrainScorerConfig(**{**info["config"], "model": str(TARGET_COMPATIBLE)})
    assert probe_history(cfg) == info["repro"]["loss_history"]  # exact floats

