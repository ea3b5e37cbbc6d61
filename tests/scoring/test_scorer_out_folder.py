"""``gambit train scorer --out`` a model's or a drafter's folder wrote the scorer's config.json and weights
over theirs (the target no longer loaded); refused before the rollouts, as drafters and targets are."""

import pytest

import gambit.scoring.train as train
from gambit.paths import ASSETS, TARGET


@pytest.mark.parametrize("out, held", [(TARGET, "a model"), (ASSETS / "drafter-pr", "an EAGLE-3 drafter")])
def test_a_scorer_is_not_trained_over_a_model_or_a_drafter(monkeypatch, out, held):
    monkeypatch.setattr(train, "collect_rollouts", lambda *a, **k: pytest.fail("rolled out"))
    monkeypatch.setattr(train, "run_pinned", lambda *a, **k: pytest.fail("ran a child"))
    with pytest.raises(ValueError, match=f"holds {held}.*training a scorer there"):
        train.train_scorer(train.TrainScorerConfig(out=str(out)))


def test_a_scorer_folder_is_taken(tmp_path):
    from gambit.train.out_folder import check_out_kind, folder_kind

    assert folder_kind(ASSETS / "scorer-sequence") == "scorer"
    check_out_kind(str(ASSETS / "scorer-mlp"), "scorer")
    check_out_kind(str(tmp_path / "new"), "scorer")
