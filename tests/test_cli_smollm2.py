"""The command line on the real checkpoint, addressed by name: ``--model smollm2``."""

from __future__ import annotations

import json

from gambit.cli import main


def test_eval_by_name_on_smollm2(smollm2_folder, tmp_path, capsys):
    path = tmp_path / "eval.json"
    rc = main(["eval", "--model", "smollm2", "--n-problems", "2", "--samples", "2", "--max-ops", "2",
               "--max-tokens", "12", "--json", str(path)])
    assert rc == 0
    result = json.loads(path.read_text())
    assert result["n_problems"] == 2 and result["samples"] == 2
    assert 0 < result["generated_tokens"] <= 4 * 12
    assert "pass@1" in capsys.readouterr().out


def test_run_by_name_on_smollm2(smollm2_folder, monkeypatch, capsys):
    import gambit.run

    # the job caps traces at 400 tokens; 12 keep the test short on a 135M model
    params = gambit.run.SamplingParams
    monkeypatch.setattr(gambit.run, "SamplingParams", lambda **kw: params(**{**kw, "max_tokens": 12}))
    assert main(["run", "--model", "smollm2", "--problems", "1", "--samples", "2"]) == 0
    out = capsys.readouterr().out
    assert "--- trace 2" in out and "majority vote solved" in out and "tokens generated" in out
