"""Smoke test of ``gambit bench spec``'s parts on a tiny model with random drafters."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from gambit.bench.spec_cells import BASE, _pool_analysis, measure
from gambit.bench.spec_report import plots
from gambit.engine import Engine, EngineConfig
from gambit.engine.config import SpecConfig
from gambit.model import CausalLM, ModelConfig, build_char_tokenizer
from gambit.speculative import random_drafter


class _Bar:
    n = 0

    def update(self, k):
        self.n += k


def test_spec_bench_parts(tmp_path: Path) -> None:
    tok = build_char_tokenizer()
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                      tie_word_embeddings=True, bos_token_id=tok.bos_id, eos_token_id=tok.eos_ids[0])
    torch.manual_seed(0)
    eng = Engine(CausalLM(cfg).eval(), tok, EngineConfig(device="cpu", num_blocks=256))
    eng.register_drafter("eagle3.1", random_drafter(eng.model, seed=1))
    eng.register_drafter("pr", random_drafter(eng.model, seed=2, method="pr"))
    small = SpecConfig(gamma=2, budget=6, grow_width=2, offer_width=2, reconsider=1)
    prompts = [tok.encode("Compute 1+2.\nSolution:\n"), tok.encode("Compute 7*3.\n")]
    bar = _Bar()
    res = measure(eng, prompts, 2, {"eagle3.1": ("eagle3.1", small), "pr": ("pr", small)}, 2, 12, {}, bar)
    assert bar.n == 6
    for k in ("eagle3.1", "pr"):
        r = res[k]
        assert r["lossless"] and r["tau"] >= 1 and r["cycles"] > 0 and len(r["cycle_seconds"]) == 2
        assert len(r["chunk_cycle_seconds"]) == 2  # one chunk (2 prompts at batch 2) per repetition
        assert r["speedup_spread"][0] <= r["speedup"] <= r["speedup_spread"][1]
    a = _pool_analysis(eng, prompts, "pr", small, 12)
    assert a["positions"] > 0 and abs(sum(c["share"] for c in a["table7"].values()) - 1) < 1e-9
    assert eng.speculator().records is None
    files = plots({"analysis": {"pr": a}}, tmp_path)
    assert all(Path(f).stat().st_size > 1000 for f in files)
    assert BASE.budget == 48


def test_spec_from_name():
    """The analysis tools' tree names: the engine's defaults, or the paper's tree with changes."""
    from dataclasses import replace

    from gambit.bench.spec_cells import DEFAULTS, spec_from_name

    assert spec_from_name("defaults") == DEFAULTS
    assert spec_from_name("B=48") == BASE
    want = replace(BASE, budget=24, offer_width=4, gamma=12, fresh=False)
    assert spec_from_name("B=24 k=4 g=12 merge") == want
    for bad in ("B=x", "q=3", "B48"):
        with pytest.raises(ValueError, match="KNOB=N"):
            spec_from_name(bad)


def test_tree_systems():
    """The tools' ``--trees``: PR and EAGLE-3.1 at every named tree."""
    from gambit.bench.spec_cells import DEFAULTS, tree_systems

    got = tree_systems("defaults;B=48 m=0")
    assert list(got) == ["pr [defaults]", "eagle3.1 [defaults]", "pr [B=48 m=0]", "eagle3.1 [B=48 m=0]"]
    assert got["pr [defaults]"] == ("pr", DEFAULTS)
    assert got["eagle3.1 [B=48 m=0]"][1].reconsider == 0 and got["eagle3.1 [B=48 m=0]"][1].budget == 48


def test_cycle_ratio_pairs_chunks():
    """Table 9 pairs each chunk's seconds per cycle with the other system's on the same chunk (run
    next to it), leaving out chunks where either drafted nothing; per-repetition ratios beside it."""
    from gambit.bench.spec_report import _cycle_ratio

    rows = {"p": {"cycle_seconds": [2.0, 4.0], "chunk_cycle_seconds": [1.1, None, 3.0, 1.2, 0.5]},
            "e": {"cycle_seconds": [2.0, 2.0], "chunk_cycle_seconds": [1.0, 1.0, 1.0, 1.0, None]}}
    r = _cycle_ratio(rows, "p", "e")
    assert r["pairs"] == 3 and r["spread"] == [1.1, 3.0]
    assert abs(r["median"] - 1.2) < 1e-12 and r["per_rep_median"] == 1.5
    assert r["t_cycle_ms"] == [3000.0, 2000.0]
    del rows["p"]["chunk_cycle_seconds"]  # a row from before chunk pairs: the repetitions' ratios
    assert _cycle_ratio(rows, "p", "e")["median"] == 1.5


@pytest.fixture
def no_run(monkeypatch):
    """``run_bench`` (the engine, the drafters, the work) fails if reached: the checks come before it."""
    import gambit.bench.spec

    def run_bench(*a, **k):
        raise AssertionError("the bench started before the check")

    monkeypatch.setattr(gambit.bench.spec, "run_bench", run_bench)


@pytest.mark.parametrize("reps", ["0", "1"])
def test_fewer_than_two_repetitions_is_refused(reps, no_run):
    """``--reps 0`` once meant the default (0 is falsy); it is an error like 1."""
    from gambit.bench.spec import main

    with pytest.raises(ValueError, match=f"--reps must be >= 2 .*got {reps}"):
        main(["--reps", reps])


@pytest.mark.parametrize(("args", "message"), [
    (["--max-tokens", "0"], "--max-tokens must be >= 1, got 0"),
    (["--threads", "-1"], "--threads must be >= 0, got -1"),
    (["--device", "foo"], "--device must be auto, cpu, cuda or cuda:N, got 'foo'"),
    (["--device", "cuda:x"], "--device must be auto, cpu, cuda or cuda:N, got 'cuda:x'"),
    (["--drafters", "/nonexistent"], "--drafters /nonexistent: no such folder"),
])
def test_bad_values_are_refused_before_any_model_loads(args, message, no_run):
    """One flag a message; a missing --drafters folder once benchmarked random stand-in drafters."""
    from gambit.bench.spec import main

    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        main(args)


def test_a_target_folder_without_a_model_is_refused(tmp_path, no_run):
    """``--target`` (drafters trained for another target, e.g. a re-ship candidate) must be a model."""
    from gambit.bench.spec import main

    with pytest.raises(ValueError, match="--target .*no config.json"):
        main(["--target", str(tmp_path)])


def test_a_missing_drafter_in_a_real_folder_stays_a_random_stand_in(tmp_path, monkeypatch):
    """The stand-in is deliberate where the folder is there but lacks a drafter (the command runs; the
    ablation drafters are left out); only a folder that is not there is refused."""
    import gambit.bench.spec_cells
    from gambit.bench.spec_cells import OPTIONAL, load_drafters

    class Eng:
        model = None

        def register_drafter(self, key, drafter):
            pass

    made = []
    monkeypatch.setattr(gambit.bench.spec_cells, "random_drafter",
                        lambda model, seed, method: made.append(method) or object())
    found = load_drafters(Eng(), tmp_path)
    assert set(found.values()) == {"random"} and not set(found) & set(OPTIONAL)
    assert len(made) == len(found) == 4


def test_threads_help_says_its_default(capsys):
    from gambit.bench.spec import main

    with pytest.raises(SystemExit):
        main(["--help"])
    assert "(default: 0 = every core" in " ".join(capsys.readouterr().out.split())


def test_a_cell_without_a_drafted_tree_shows_no_tau():
    """The Batch-cap table printed tau 0.00 when every step was capped: no tree, so no tau."""
    from gambit.bench.spec_report import _cell

    row = {"tau": 0.0, "cycles": 0, "speedup": 1.02, "speedup_spread": [0.99, 1.05]}
    assert _cell(row) == "— / 1.02x (0.99-1.05)"
    assert _cell(row | {"tau": 4.56, "cycles": 30}) == "4.56 / 1.02x (0.99-1.05)"


def test_a_drafters_folder_holding_none_of_them_is_refused(tmp_path, no_run):
    """`--drafters DIR` with no drafter-* folder in DIR ran the whole bench on random stand-ins (one
    note per method on stderr); it now takes --allow-random-drafters to do that."""
    from gambit.bench.spec import main

    (tmp_path / "drafter-pr").mkdir()  # a folder without a model is no drafter
    refused = (f"^--drafters {re.escape(str(tmp_path))}: none of the drafters there "
               r"\(drafter-eagle3.1, drafter-pr, .*--allow-random-drafters")
    with pytest.raises(ValueError, match=refused):
        main(["--drafters", str(tmp_path)])
    with pytest.raises(AssertionError, match="the bench started"):  # allowed: on to the run
        main(["--drafters", str(tmp_path), "--allow-random-drafters"])
    (tmp_path / "ablations" / "drafter-pr-beta0").mkdir(parents=True)  # one ablation drafter is enough
    (tmp_path / "ablations" / "drafter-pr-beta0" / "config.json").write_text("{}")
    with pytest.raises(AssertionError, match="the bench started"):
        main(["--drafters", str(tmp_path)])
