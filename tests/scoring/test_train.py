"""Scorer training on synthetic rollouts: split by problem, batching, determinism, evaluation maths."""

import pytest
import torch

from gambit.scoring.evaluate import evaluate, pad_traces, predict, running_mean
from gambit.scoring.rollouts import cache_path, chunk_dir, collect_rollouts
from gambit.scoring.train import TrainScorerConfig, batches, fit, select_traces, split_fit_val


def synthetic(n_problems=40, samples=6, d=16, seed=0) -> dict:
    """Traces of 1-6 boundaries; correct traces' states lean along a fixed direction."""
    g = torch.Generator().manual_seed(seed)
    direction = torch.randn(d, generator=g)
    states, trace, thought, problem, correct = [], [], [], [], []
    for p in range(n_problems):
        for _ in range(samples):
            t = len(correct)
            ok = bool(torch.rand(1, generator=g) < 0.4)
            n = int(torch.randint(1, 7, (1,), generator=g))
            states.append(torch.randn(n, d, generator=g) + (0.8 if ok else -0.8) * direction)
            trace += [t] * n
            thought += list(range(1, n + 1))
            problem.append(p)
            correct.append(ok)
    return {"states": torch.cat(states), "trace": torch.tensor(trace), "thought": torch.tensor(thought),
            "problem": torch.tensor(problem), "correct": torch.tensor(correct),
            "n_ops": torch.tensor(problem) % 7 + 2, "tokens": torch.full((len(correct),), 50),
            "exprs": [f"{p}+1" for p in range(n_problems)]}


def test_split_is_by_problem():
    data = synthetic()
    fit_d, val_d = split_fit_val(data, 25)
    fp = {data["exprs"][p] for p in fit_d["problem"].tolist()}
    vp = {data["exprs"][p] for p in val_d["problem"].tolist()}
    assert fp and vp and not fp & vp
    assert len(fit_d["correct"]) + len(val_d["correct"]) == len(data["correct"])
    assert len(fit_d["states"]) + len(val_d["states"]) == len(data["states"])
    # rows stay grouped by trace and keep their states
    t = int(torch.nonzero(~torch.isin(data["problem"], val_d["problem"]))[0])
    sub = select_traces(data, torch.tensor([t]))
    assert torch.equal(sub["states"], data["states"][data["trace"] == t])


def test_sequence_batches_pack_whole_traces():
    data = synthetic()
    cfg = TrainScorerConfig(kind="sequence", batch_size=20, out="/tmp/unused")
    bs = batches(cfg, data, torch.Generator().manual_seed(0))
    seen = torch.cat(bs)
    assert sorted(seen.tolist()) == list(range(len(data["correct"])))
    counts = torch.bincount(data["trace"])
    assert all(int(counts[b].sum()) >= 20 for b in bs[:-1])
    x, mask, rows, y = pad_traces(data, bs[0])
    assert torch.equal(x[mask], data["states"][rows])


def test_fit_learns_and_is_deterministic(tmp_path):
    data = synthetic()
    for kind in ("mlp", "sequence"):
        cfg = TrainScorerConfig(kind=kind, lr=3e-3, max_epochs=4, out=str(tmp_path / kind))
        net, hist, split = fit(cfg, data, quiet=True)
        _, hist2, _ = fit(cfg, data, quiet=True)
        assert hist == hist2  # identical loss history, exactly
        assert hist[-1]["val_auc"] > 0.8
        assert split["fit_problems"] + split["val_problems"] == 40


def test_running_mean_and_evaluate():
    data = {"states": torch.zeros(5, 2), "trace": torch.tensor([0, 0, 0, 1, 1]),
            "thought": torch.tensor([1, 2, 3, 1, 2]), "problem": torch.tensor([0, 0]),
            "correct": torch.tensor([True, False]), "n_ops": torch.tensor([3, 3])}
    s = torch.tensor([0.2, 0.4, 0.9, 0.6, 0.0])
    torch.testing.assert_close(running_mean(s, data), torch.tensor([0.2, 0.3, 0.5, 0.6, 0.3]))
    ev = evaluate(s, data)
    # boundaries: positives 0.2 0.4 0.9, negatives 0.6 0.0 → wins 1+1+2 = 4 of 6
    assert abs(ev["auc"] - 4 / 6) < 1e-12
    assert ev["trace_auc"] == 1.0 and ev["within_problem_auc"] == 1.0  # 0.5 > 0.3
    assert ev["by_thought"]["1"]["auc"] == 0.0 and ev["by_thought"]["3"]["boundaries"] == 1


def test_predict_sequence_matches_scorer():
    from gambit.scoring import random_scorer

    data = synthetic(n_problems=3, d=16)
    s = random_scorer("sequence", hidden_size=16, seed=2)
    p = predict(s.net, "sequence", data)
    for t in range(len(data["correct"])):
        hist = data["states"][data["trace"] == t]
        torch.testing.assert_close(p[data["trace"] == t], s.score_history(hist), atol=1e-5, rtol=0)


def test_isa_is_validated_and_keys_the_rollout_cache(tmp_path):
    with pytest.raises(ValueError, match="isa must be one of machine, compatible"):
        TrainScorerConfig(isa="avx9")
    rc = TrainScorerConfig().rollouts("train")
    assert "isa" not in rc.key()  # the machine's rollouts keep the cache names they had before the field
    pinned = TrainScorerConfig(isa="compatible").rollouts("train")
    assert pinned.isa == "compatible" and pinned.key()["isa"] == "compatible"
    assert cache_path(pinned) != cache_path(rc) and chunk_dir(pinned) != chunk_dir(rc)
    with pytest.raises(RuntimeError, match="pinned to it"):  # pytest runs the machine's kernels
        collect_rollouts(pinned, cache_dir=str(tmp_path), quiet=True)


@pytest.mark.parametrize("values, field", [
    ({"heldout_problems": 0}, "heldout_problems"), ({"repro_problems": 0}, "repro_problems"),
    ({"repro_epochs": -1}, "repro_epochs"), ({"temperature": 0.0}, "temperature")])
def test_bad_values_are_refused_before_the_rollouts(values, field):
    """Refused when the config is built, naming the field: not after rollouts or training."""
    with pytest.raises(ValueError, match=rf"{field} must be .*, got {list(values.values())[0]!r}"):
        TrainScorerConfig(**values)
    TrainScorerConfig()  # the defaults (the shipped cards') still construct
    no_probe = TrainScorerConfig(repro_problems=0, repro_epochs=0, out="/tmp/unused")  # not the recipe
    assert no_probe.repro_problems == 0  # no probe: unused


def test_a_split_without_validation_problems_is_refused_before_the_rollouts(tmp_path):
    """"0 validation boundaries": no early stopping or model selection, the last epoch saved and the
    card saying "best epoch 1 kept" (NaN losses: ``min`` over them named the first)."""
    with pytest.raises(ValueError, match="val_percent 1 leaves no validation problems of n_problems 16"):
        TrainScorerConfig(val_percent=1, n_problems=16, out=str(tmp_path))
    with pytest.raises(ValueError, match="val_percent 99 leaves no fit problems of n_problems 4"):
        TrainScorerConfig(val_percent=99, n_problems=4, repro_problems=4, out=str(tmp_path))
    cfg = TrainScorerConfig(lr=3e-3, max_epochs=3, out=str(tmp_path))
    cfg.val_percent = 1  # what fit itself does with such data (the probe's few problems may have none)
    data = synthetic(n_problems=5)
    assert not split_fit_val(data, 1)[1]["states"].numel()
    with pytest.raises(ValueError, match="no validation boundaries"):
        fit(cfg, data, quiet=True)
    _, hist, split = fit(cfg, data, quiet=True, need_val=False)
    assert len(hist) == 3 and split["best_epoch"] == 3  # every epoch run, the last kept and named


def test_a_probe_larger_than_the_data_is_refused():
    """--repro-problems 100 with --n-problems 16: the probe trained on all 16 without a word."""
    with pytest.raises(ValueError, match=r"repro_problems must be <= n_problems \(16\), got 100"):
        TrainScorerConfig(repro_problems=100, n_problems=16)


def test_default_folder_is_the_shipped_scorer_of_these_labels():
    """--label process --confidence wrote over scorer-mlp; `gambit run --scorer process` reads
    scorer-process."""
    from gambit.paths import SCORER_MLP, SCORER_PROCESS, SCORER_SEQUENCE

    assert TrainScorerConfig(label="process", confidence=True).out == str(SCORER_PROCESS)
    assert TrainScorerConfig().out == str(SCORER_MLP)
    assert TrainScorerConfig(kind="sequence").out == str(SCORER_SEQUENCE)
    with pytest.raises(ValueError, match="give --out: no shipped scorer is --kind mlp --label path"):
        TrainScorerConfig(label="path")
    assert TrainScorerConfig(label="path", out="/tmp/x").out == "/tmp/x"


def test_bad_output_paths_are_refused_before_the_rollouts(tmp_path, capsys):
    """A file as --out, or a directory as --json, failed after the rollouts and training."""
    from gambit.cli import main

    (tmp_path / "afile").write_text("")
    small = ["train", "scorer", "--n-problems", "16", "--heldout-problems", "2", "--samples", "2",
             "--cache-dir", str(tmp_path / "cache")]
    cases = [(["--out", str(tmp_path / "afile")], "out: {tmp}/afile is a file; give a folder"),
             (["--out", str(tmp_path / "s"), "--json", str(tmp_path)], "json: {tmp} is a directory")]
    for extra, said in cases:
        try:
            code, err = main([*small, *extra]), capsys.readouterr().err
        except SystemExit as e:
            code, err = e.code, capsys.readouterr().err
        assert code == 2 and err.startswith("gambit train scorer: error: --")
        assert said.format(tmp=tmp_path) in err
    assert not (tmp_path / "cache").exists()  # nothing rolled out


@pytest.mark.parametrize("values, said", [
    ({"model": "smollm2"}, "--model smollm2"), ({"kind": "sequence", "arch": "attn"}, "--arch attn"),
    ({"n_problems": 16, "samples": 2}, "--n-problems 16, --samples 2"),
    ({"repro_epochs": 0}, "--repro-epochs 0")])
def test_other_settings_need_out_rather_than_the_shipped_folder(values, said, tmp_path):
    """A quick run, another model or architecture wrote over the shipped scorer by default (then
    `--scorer mlp` read a SmolLM2 scorer and fell back to a random one for the shipped target)."""
    with pytest.raises(ValueError, match=rf"^give --out DIR: {said} is not the shipped scorer-\w+'s recipe"):
        TrainScorerConfig(**values)
    assert TrainScorerConfig(**values, out=str(tmp_path)).out == str(tmp_path)


def test_the_shipped_recipe_keeps_its_default_folder(monkeypatch):
    """Each shipped training.json's settings (relative --model, --isa compatible: the Makefile's) still
    write their own folder without --out; so do the defaults under other threads or kernels."""
    from scoring_util import SHIPPED, shipped_training

    from gambit.paths import REPO

    monkeypatch.chdir(REPO)  # where the Makefile runs: --model services/gambit/assets/target
    for name, folder in SHIPPED.items():
        cfg = shipped_training(name)["config"]
        assert TrainScorerConfig(**{**cfg, "out": ""}).out == str(folder)
    assert TrainScorerConfig(threads=4, train_threads=2, isa="compatible").out == str(SHIPPED["mlp"])


def test_cli_without_out_for_other_settings_names_out(tmp_path, capsys):
    from gambit.cli import main

    try:
        code, err = main(["train", "scorer", "--n-problems", "16", "--cache-dir", str(tmp_path / "c")]), ""
    except SystemExit as e:
        code, err = e.code, str(e.code) + capsys.readouterr().err
    assert code and "error: give --out DIR: --n-problems 16 is not the shipped scorer-mlp's recipe" in err
    assert not (tmp_path / "c").exists()


def test_model_dim_not_a_multiple_of_the_heads_names_the_flag():
    """It said "not divisible by num_heads 4", and there is no --num-heads."""
    with pytest.raises(ValueError, match=r"^--model-dim must be a multiple of 4 \(the scorer's fixed number "
                                         r"of attention heads\), got 130$"):
        TrainScorerConfig(kind="sequence", arch="attn", model_dim=130, out="/tmp/unused")


def test_kernels_are_built_before_the_rollout_bars(tmp_path, monkeypatch):
    """Another process compiling the CPU kernels was timed as the first trace (`1/96 [00:27<43:25]`)."""
    import gambit.scoring.train as train
    from gambit.engine import cpu_attention

    calls = []
    monkeypatch.setattr(cpu_attention, "kernel", lambda: calls.append("kernel"))

    def rollouts(*a, **k):
        calls.append("rollouts")
        raise KeyboardInterrupt  # stop here: the order is what is checked
    monkeypatch.setattr(train, "collect_rollouts", rollouts)
    cfg = TrainScorerConfig(n_problems=16, out=str(tmp_path / "s"), cache_dir=str(tmp_path / "c"))
    with pytest.raises(KeyboardInterrupt):
        train.train_scorer(cfg, quiet=True)
    assert calls == ["kernel", "rollouts"]
