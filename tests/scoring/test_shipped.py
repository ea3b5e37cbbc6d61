"""The shipped scorers load, match their config, and separate right from wrong traces on held-out
problems (a small fixed set regenerated here from the dev split: its first 16 problems) better than
chance, scored through the stateful API as the tournament does."""

import pytest
import torch
from scoring_util import SHIPPED, shipped_training

from gambit.model.config import ModelConfig
from gambit.paths import TARGET
from gambit.scoring import auc, load_scorer
from gambit.scoring.evaluate import evaluate


@pytest.mark.parametrize("kind", ["mlp", "sequence"])
def test_shipped_scorer_heldout_auc(kind, heldout_chunk):
    shipped_training(kind)
    scorer = load_scorer(SHIPPED[kind])
    assert scorer.kind == kind
    assert scorer.hidden_size == ModelConfig.from_file(TARGET / "config.json").hidden_size
    data = heldout_chunk
    # score every trace through the stateful API, as the tournament does
    scores = torch.empty(len(data["states"]))
    for t in range(len(data["correct"])):
        rows = torch.nonzero(data["trace"] == t).flatten()
        for r in rows.tolist():
            scores[r] = scorer.score([("trace", t)], data["states"][r:r + 1])[0]
        scorer.drop(("trace", t))
    assert scorer.num_keys == 0
    labels = data["correct"][data["trace"]]
    a = auc(scores, labels)
    # on these 16 problems (192 traces, ~1,000 boundaries) the shipped scorers measure 0.626 (mlp) and
    # 0.591 (sequence) boundary AUC, 0.649 / 0.615 trace AUC; on all 128 held-out problems 0.604 / 0.589
    # and 0.671 / 0.614 (their cards)
    assert a > 0.56, f"held-out boundary AUC {a:.3f}"
    assert evaluate(scores, data)["trace_auc"] > 0.58


def test_shipped_process_scorer_ranks_within_problems(heldout_chunk):
    """The default search scorer reads the confidence features too; unlike the final-label scorers
    on hidden states alone (at chance within a problem), it separates one problem's traces."""
    from gambit.scoring.confidence import with_confidence
    from gambit.scoring.evaluate import process_metrics

    shipped_training("process")
    scorer = load_scorer(SHIPPED["process"])
    assert scorer.confidence and scorer.input_size == scorer.hidden_size + 2
    data = heldout_chunk
    with pytest.raises(ValueError, match="confidence features"):
        scorer.score(["x"], data["states"][:1])  # hidden states alone are refused, saying why
    scores = scorer.score(list(range(len(data["states"]))), with_confidence(data["states"], data["conf"]))
    ev = evaluate(scores, data)
    # on these 16 problems: see the card (whole held-out set: within-problem final / process AUC)
    assert ev["within_problem_auc"] > 0.65, ev["within_problem_auc"]
    assert process_metrics(scores, data)["within_problem_auc"] > 0.7
