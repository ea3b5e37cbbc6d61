"""The command line on the real checkpoint, addressed by name: ``--model smollm2``."""

from __future__ import annotations

import json

import pytest

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


def test_run_by_name_on_smollm2(smollm2_folder, capsys):
    # Gambit on the real checkpoint: the shipped scorers read width 192, so the training-free confidence
    # scorer stands in for the process scorer; 12 tokens per trace keep the test short on a 135M model
    assert main(["run", "--model", "smollm2", "--problems", "1", "--samples", "2", "--swap", "1",
                 "--max-tokens", "12", "--max-ops", "2", "--min-ops", "2", "--save", "", "--png", ""]) == 0
    captured = capsys.readouterr()
    assert "scoring with the target's own confidence (ConfidenceScorer" in captured.err
    assert ">>> answer" in captured.out and "gambit solved" in captured.out


def test_run_on_smollm2_drafts_with_the_drafters_mapped_to_it(smollm2_folder, smollm2_pr_drafter, capsys):
    """`--decoding pr` names the shipped drafter, the shipped target's: on SmolLM2 it is refused with how to
    map "pr" to one of its own; `--drafters pr=FOLDER` (here a random drafter for SmolLM2) drafts with it."""
    args = ["run", "--model", "smollm2", "--problems", "1", "--samples", "2", "--swap", "1", "--max-tokens",
            "12", "--max-ops", "2", "--min-ops", "2", "--save", "", "--png", "", "--scorer", "confidence"]
    assert main([*args, "--decoding", "pr"]) == 2
    captured = capsys.readouterr()
    assert "--drafters pr=FOLDER" in captured.err and "make smollm2-drafters" in captured.err
    assert "=== problem" not in captured.out  # said before any problem starts
    assert main([*args, "--decoding", "pr", "--drafters", f"pr={smollm2_pr_drafter}"]) == 0
    out = capsys.readouterr().out
    assert "speculative (pr): tau " in out and "gambit solved" in out
    with pytest.raises(SystemExit, match="drafters: 'pr' must be NAME=FOLDER"):
        main([*args, "--decoding", "pr", "--drafters", "pr"])


def test_a_question_to_a_chat_model_gets_its_template(smollm2_folder):
    """``gambit run --model smollm2 --question …``: one user turn asking for a boxed answer, as the
    served Target formats ``SolveRequest.problem`` for a chat model."""
    from gambit.run import RunConfig, problems_of
    from gambit.serving.prompt_format import BOXED, problem_formatter

    q = problems_of(RunConfig(model="smollm2", question="What is 2+2?", gold="4"))[0]
    assert q.prompt == problem_formatter("smollm2")("What is 2+2?")
    assert q.prompt.startswith("<|im_start|>") and f"What is 2+2?\n{BOXED}" in q.prompt and q.answer == "4"
