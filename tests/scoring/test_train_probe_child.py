"""``probe_history`` under another ``--isa`` runs in a ``run_pinned`` child, which must answer a JSON
object: the bare list of epochs it answered was refused ("exited with 0"), so the card's
reproducibility check (and ``test_reproducible``) failed on every shipped scorer."""

import json

import gambit.scoring.train as train


def test_the_pinned_probe_answers_an_object_and_returns_its_history(monkeypatch):
    history = [{"epoch": 1, "train_loss": 0.5, "val_loss": float("nan"), "val_auc": 0.5, "steps": 2}]
    calls = []

    def child(isa, module, function, config, **kwargs):
        """What the real child does with the function's result: one JSON line, an object required."""
        calls.append((isa, module, function))
        monkeypatch.setattr(train, "isa_pinned", lambda isa: True)  # inside the pinned child
        result = getattr(train, function)(train.TrainScorerConfig(**config), **kwargs)
        line = json.dumps(result)
        assert line.startswith("{"), f"run_pinned refuses {line[:20]}..."  # repro.run_pinned's check
        return json.loads(line)

    monkeypatch.setattr(train, "isa_pinned", lambda isa: False)
    monkeypatch.setattr(train, "run_pinned", child)
    monkeypatch.setattr(train, "collect_rollouts", lambda rc, cache_dir, quiet: {"rollouts": rc.n_problems})
    monkeypatch.setattr(train, "repro_probe", lambda cfg, chunk: history)
    cfg = train.TrainScorerConfig(isa="compatible", out="unused")
    got = train.probe_history(cfg)
    assert calls == [("compatible", "gambit.scoring.train", calls[0][2])]
    assert json.dumps(got) == json.dumps(history)

