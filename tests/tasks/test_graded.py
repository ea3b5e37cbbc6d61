"""Graded benchmarks as problems: answer keys agree with the checker and the gold, on the real files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gambit.tasks.arithmetic import generate
from gambit.tasks.benchmarks import check_answer
from gambit.tasks.graded import (
    GRADED,
    answer_key,
    answer_kind,
    check_benchmark,
    datasets_dir,
    gold_key,
    load_graded,
    pick,
)

real_data = pytest.mark.skipif(not datasets_dir().is_dir(), reason=f"no datasets at {datasets_dir()}")


@real_data
@pytest.mark.parametrize("name", list(GRADED))
def test_the_gold_written_as_an_answer_is_the_gold_key(name):
    """Every item: a completion boxing the gold gets the gold key and passes the checker."""
    items = load_graded(name)
    assert items
    for it in items:
        text = f"So the answer is \\boxed{{{it.answer}}}."
        assert answer_key(answer_kind(it), text) == gold_key(it), it.id
        assert check_answer(it, text), it.id


@real_data
def test_gsm8k_reference_solutions_give_the_gold_key():
    """GSM8K's own worked solutions (no box, ``#### N``) key to the gold, all 1,319 of them."""
    items = load_graded("gsm8k")
    assert len(items) == 1319
    assert all(answer_key("gsm8k", it.meta["solution"]) == gold_key(it) for it in items)


@pytest.mark.parametrize("kind, text, key", [
    ("boxed", "... \\boxed{1,024}", "1024"),
    ("boxed", "... \\boxed{x+1}", "x+1"),
    ("boxed", "no box, 42", None),
    ("integer", "\\boxed{\\$18}", "18"),
    ("integer", "the answer is 18", None),  # AIME needs its box
    ("gsm8k", "She pays 3 + 4 = 7 dollars.\n#### 7", "7"),
    ("gsm8k", "so 12 eggs in all", "12"),
    ("gsm8k", "\\boxed{18 eggs}", "18"),
    ("gsm8k", "no number at all", None),
    ("choice", "The answer is (C).", "C"),
    ("choice", "\\boxed{B}", "B"),
    ("latex", "\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}"),
    ("latex", "\\boxed{ }", None),
    # an echoed instruction's empty box is no vote (SmolLM2 writes "within \\boxed{}" after its answer)
    ("boxed", "3 + 4 = 7. To put it within \\boxed{}, I add the equation \\boxed{ }.", None),
    ("boxed", "\\boxed{7}. To put your final answer within \\boxed{}", "7"),
    ("integer", "\\boxed{18} ... \\boxed{}", "18"),
    ("choice", "\\boxed{C} then \\boxed{}", "C"),
])
def test_answer_keys(kind, text, key):
    assert answer_key(kind, text) == key


def test_two_answers_with_one_value_share_a_key():
    assert answer_key("latex", "\\boxed{\\tfrac{1}{2}}") == answer_key("latex", "\\boxed{\\frac{1}{2} }")
    assert answer_key("gsm8k", "\\boxed{1,200}") == answer_key("gsm8k", "#### 1200")


def test_unknown_names_and_missing_files_are_clear(tmp_path):
    with pytest.raises(ValueError, match="graded ones: gsm8k"):
        check_benchmark("math")
    with pytest.raises(ValueError, match="answer kind"):
        answer_key("words", "x")
    with pytest.raises(FileNotFoundError, match="--data"):
        load_graded("gsm8k", str(tmp_path / "none.jsonl"))


def test_pick_is_seeded_and_keeps_file_order():
    items = list(range(50))
    a, b = pick(items, 7, seed=3), pick(items, 7, seed=3)
    assert a == b and a == sorted(a) and len(set(a)) == 7
    assert pick(items, 7, seed=4) != a
    assert pick(items, 80, seed=3) == items


def arithmetic_as_gsm8k(path: Path, n: int, seed: int, min_ops: int, max_ops: int) -> Path:
    """The task's test problems written in GSM8K's layout (question without the task's suffix)."""
    from gambit.tasks.arithmetic import TaskConfig

    rows = [{"question": p.prompt.split("\nSolution:")[0], "answer": f"...\n#### {p.answer}"}
            for p in generate("test", n, seed, TaskConfig(min_ops, max_ops))]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_eval_of_a_benchmark_file_is_the_task_eval(tmp_path):
    """The task's problems as a GSM8K file: the same prompts (the base model's task format), seeds and
    tokens as ``gambit eval`` on the task, and the same accuracy through the benchmark's checker."""
    from gambit.bench.eval import EvalConfig, run_eval
    from gambit.engine import Engine, EngineConfig
    from gambit.paths import TARGET

    data = arithmetic_as_gsm8k(tmp_path / "g.jsonl", 8, 0, 2, 3)
    engine = Engine.from_pretrained(str(TARGET), EngineConfig(model=str(TARGET)))
    common = dict(model=str(TARGET), n_problems=8, samples=3, max_tokens=80)  # the ops range: the task's
    task = run_eval(EvalConfig(**common, min_ops=2, max_ops=3), engine, quiet=True)
    bench = run_eval(EvalConfig(**common, benchmark="gsm8k", data=str(data)), engine, quiet=True)
    assert bench["generated_tokens"] == task["generated_tokens"]
    for key in ("pass1", "maj", "passk"):
        assert bench[key] == task[key], key
    assert task["pass1"] > 0.3  # the shipped target solves these: the comparison has right answers in it
    assert [it["id"] for it in bench["items"]] == [f"gsm8k/{i}" for i in range(8)]


def test_run_on_a_benchmark_file_is_the_task_run(tmp_path, capsys):
    """``gambit run --benchmark gsm8k --data FILE`` searches the same traces as the task run."""
    from gambit.run import RunConfig, run

    data = arithmetic_as_gsm8k(tmp_path / "g.jsonl", 1, 0, 4, 4)
    common = dict(problems=1, samples=4, swap=1, max_tokens=120, save="", png="")
    task = run(RunConfig(**common, min_ops=4, max_ops=4))
    task_out = capsys.readouterr().out
    bench = run(RunConfig(**common, benchmark="gsm8k", data=str(data)))
    bench_out = capsys.readouterr().out
    assert bench == task
    answer = task_out.split(">>> answer ")[1].split(")")[0]
    assert bench_out.split(">>> answer ")[1].split(")")[0] == answer
    assert "(gsm8k/0)" in bench_out


def test_a_bad_benchmark_is_refused_before_the_model_loads(tmp_path):
    from gambit.run import RunConfig, run

    with pytest.raises(ValueError, match="benchmark: unknown 'gsm9k'"):
        RunConfig(benchmark="gsm9k")
    with pytest.raises(ValueError, match="give --benchmark too"):
        RunConfig(data="x.jsonl")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        run(RunConfig(model=str(tmp_path / "no-model"), benchmark="gsm8k", data=str(tmp_path / "no.jsonl")))


def test_a_question_the_model_cannot_read_is_named_before_any_search(tmp_path, capsys):
    from gambit.run import RunConfig, run

    rows = [{"question": "Compute 2+3.", "answer": "#### 5"}, {"question": "It’s 2+3?", "answer": "#### 5"}]
    data = tmp_path / "g.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match="gsm8k/1: characters the model's vocabulary cannot represent"):
        run(RunConfig(benchmark="gsm8k", data=str(data), problems=2, samples=2, save="", png=""))
    assert "=== problem" not in capsys.readouterr().out


def test_task_problems_are_put_to_a_model_as_the_served_target_puts_them(smollm2_folder):
    """The shipped target reads the task as generated (the same objects); a chat model gets "Compute X."
    in its template with the boxed-answer instruction, as ``SolveRequest.problem`` "Compute X." would;
    answer, operations and solution stay the problem's, and the wrapper copies and pickles."""
    import copy
    import pickle

    from gambit.paths import TARGET
    from gambit.serving.prompt_format import problem_formatter
    from gambit.tasks.arithmetic import TaskConfig, generate
    from gambit.tasks.graded import TaskProblem, task_problems

    plain = generate("test", 5, 3, TaskConfig(2, 4))
    assert task_problems(str(TARGET), "test", 5, 3, TaskConfig(2, 4)) == plain
    chat = task_problems("smollm2", "test", 5, 3, TaskConfig(2, 4))
    for p, q in zip(plain, chat, strict=True):
        assert isinstance(q, TaskProblem)
        assert q.prompt == problem_formatter("smollm2")(f"Compute {p.expr}.") != p.prompt
        assert (q.answer, q.n_ops, q.solution, q.expr) == (p.answer, p.n_ops, p.solution, p.expr)
    assert pickle.loads(pickle.dumps(chat[0])) == chat[0] == copy.deepcopy(chat[0])
