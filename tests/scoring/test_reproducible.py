"""The shipped scorers' training is reproducible: regenerating their first rollout chunk from scratch
and retraining the card's probe, under the card's ``--isa compatible``, gives the loss history recorded
in ``training.json`` exactly, whatever x86 CPU runs the test."""


import pytest
import torch
from scoring_util import SHIPPED, shipped_config, shipped_training

from gambit.train import vendor_history


def test_chunk_is_the_start_of_the_training_data(train_chunk):
    cfg = shipped_config("mlp")
    assert len(torch.unique(train_chunk["problem"])) == cfg.repro_problems
    assert len(train_chunk["correct"]) == cfg.repro_problems * cfg.samples


@pytest.mark.parametrize("kind", ["mlp", "sequence", "process"])
def test_shipped_probe_reproduces_exactly_on_any_cpu(kind):
    """The shipped scorers (``--isa compatible``): the probe's rollouts and epochs, rerun under the same
    switches in a child process, give their vendor's history exactly (the card's on AMD, the
    Intel record elsewhere: ``gambit.train.vendor_history``)."""
    info = shipped_training(kind)
    assert info["config"]["isa"] == "compatible" and info["environment"]["cpu_capability"] == "DEFAULT"
    expected, source = vendor_history.reference(SHIPPED[kind], info["repro"]["loss_history"],
                                                info["environment"]["cpu_vendor"])
    if expected is None:
        pytest.skip(source)
    assert vendor_history.rerun_probe(SHIPPED[kind]) == expected, source  # exact floats

