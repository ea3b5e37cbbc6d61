"""The shipped scorers' training is reproducible: regenerating their first rollout chunk from scratch
and retraining the card's probe, under the card's ``--isa compatible``, gives the loss history recorded
in ``training.json`` exactly, whatever x86 CPU runs the test."""


import pytest
import torch
from scoring_util import shipped_config, shipped_training

from gambit.paths import TARGET
from gambit.scoring.train import TrainScorerConfig, probe_history


def test_chunk_is_the_start_of_the_training_data(train_chunk):
    cfg = shipped_config("mlp")
    assert len(torch.unique(train_chunk["problem"])) == cfg.repro_problems
    assert len(train_chunk["correct"]) == cfg.repro_problems * cfg.samples


@pytest.mark.parametrize("kind", ["mlp", "sequence", "process"])
def test_shipped_probe_reproduces_exactly_on_any_cpu(kind):
    """The shipped scorers (``--isa compatible``): the probe's rollouts and epochs, rerun under the same
    switches in a child process, give the card's history exactly on any x86 CPU."""
    info = shipped_training(kind)
    assert info["config"]["isa"] == "compatible" and info["environment"]["cpu_capability"] == "DEFAULT"
    cfg = TrainScorerConfig(**{**info["config"], "model": str(TARGET)})
    assert probe_history(cfg) == info["repro"]["loss_history"]  # exact floats

