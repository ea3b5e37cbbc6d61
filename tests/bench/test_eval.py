"""`gambit eval`: a bad file or question is said before the work (naming the question), settings a
benchmark ignores are refused, and the JSON shows what was cut at --max-tokens and what the model said."""

from __future__ import annotations

import json

import pytest

from gambit.bench.eval import EvalConfig, format_table, run_eval, summarise
from gambit.paths import TARGET


@pytest.fixture(scope="module")
def engine():
    from gambit.engine import Engine, EngineConfig

    return Engine.from_pretrained(str(TARGET), EngineConfig(model=str(TARGET)))


def gsm8k_file(path, questions: list[str], answer: int = 5):
    rows = ({"question": q, "answer": f"#### {answer}"} for q in questions)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_the_data_file_is_checked_before_the_model_loads(tmp_path):
    """A missing (or empty, or malformed) file was said after a full model load."""
    cfg = EvalConfig(model=str(tmp_path / "no-model"), benchmark="gsm8k", data=str(tmp_path / "no.jsonl"))
    with pytest.raises(FileNotFoundError, match=r"gsm8k: .*no\.jsonl does not exist"):
        run_eval(cfg)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="holds no items"):
        run_eval(EvalConfig(model=str(tmp_path / "no-model"), benchmark="gsm8k",
                            data=str(tmp_path / "empty.jsonl")))


def test_a_question_the_model_cannot_take_is_named_before_sampling(tmp_path, engine):
    """Both failed mid-evaluation with the engine's error, which names no question."""
    odd = gsm8k_file(tmp_path / "odd.jsonl", ["Compute 2+3.", "It\u2019s 2+3?"])
    with pytest.raises(ValueError, match="gsm8k/1: characters the model's vocabulary cannot represent"):
        run_eval(EvalConfig(model=str(TARGET), benchmark="gsm8k", data=odd, n_problems=2, samples=1),
                 engine, quiet=True)
    long = gsm8k_file(tmp_path / "long.jsonl", ["Compute 2+3.", "Compute " + "1+" * 600 + "1."])
    with pytest.raises(ValueError, match=r"gsm8k/1: prompt has \d+ tokens; the context holds 1024"):
        run_eval(EvalConfig(model=str(TARGET), benchmark="gsm8k", data=long, n_problems=2, samples=1),
                 engine, quiet=True)


@pytest.mark.parametrize("kw, message", [
    (dict(split="dev"), "--split dev: the arithmetic task's; --benchmark gsm8k asks its own questions"),
    (dict(min_ops=3, max_ops=4), "--min-ops 3, --max-ops 4: the arithmetic task's"),
])
def test_task_settings_with_a_benchmark_are_refused(kw, message):
    """Validated, then unused, and the JSON's config recorded them as if they applied."""
    with pytest.raises(ValueError, match=message):
        EvalConfig(model=str(TARGET), benchmark="gsm8k", **kw)
    EvalConfig(model=str(TARGET), **kw)  # the task reads them
    EvalConfig(model=str(TARGET), benchmark="gsm8k", split="test", min_ops=2)  # a default restated


def test_greedy_samples_are_refused():
    with pytest.raises(ValueError, match="samples: 16 at temperature 0 .greedy. are 16 copies"):
        EvalConfig(model=str(TARGET), temperature=0)
    EvalConfig(model=str(TARGET), temperature=0, samples=1)


def test_the_json_config_of_a_benchmark_has_no_task_settings_and_no_rows_is_no_error():
    cfg = EvalConfig(model=str(TARGET), benchmark="gsm8k")
    out = summarise(cfg, [], 1.0)  # a ZeroDivisionError
    assert out["n_problems"] == 0 and out["pass1"] == 0.0
    assert not {"split", "min_ops", "max_ops", "answer_rule"} & set(out["config"])
    assert "split" in summarise(EvalConfig(model=str(TARGET)), [], 1.0)["config"]


def test_cut_samples_and_completions_are_in_the_result(tmp_path, engine, capsys):
    """Every sample here stops at 4 tokens: its "answer" is read from unfinished text, and the JSON
    neither counted those nor held the completions to audit them."""
    data = gsm8k_file(tmp_path / "g.jsonl", ["Compute 2+3.", "Compute 4+1."])
    result = run_eval(EvalConfig(model=str(TARGET), benchmark="gsm8k", data=data, n_problems=5, samples=2,
                                 max_tokens=4), engine, quiet=True)
    assert "gsm8k: all 2 questions of the set (fewer than --n-problems 5)" in capsys.readouterr().err
    assert result["cut_samples"] == 4
    for it in result["items"]:
        assert it["cut"] == 2 and len(it["completions"]) == 2 and all(it["completions"])
    assert "4 of 4 samples stopped at --max-tokens 4" in format_table(result)
    full = run_eval(EvalConfig(model=str(TARGET), benchmark="gsm8k", data=data, n_problems=2, samples=2,
                               max_tokens=200), engine, quiet=True)
    assert full["cut_samples"] == 0 and "stopped at --max-tokens" not in format_table(full)
