"""A search run's verdict under the LaTeX rule is the checker's, as `gambit eval` grades its vote: an
answer written another way than the gold (``117`` for ``\\frac{234}{2}``) is right. It compared answer
keys as text, so `gambit run --benchmark hmmt24` undercounted against `eval` on the same traces."""

from __future__ import annotations

import json
from dataclasses import dataclass

from gambit.search.config import SearchConfig
from gambit.search.driver import SearchDriver
from gambit.tasks.arithmetic import TaskConfig, generate
from gambit.tasks.benchmarks import normalize_latex
from gambit.tasks.graded import latex_right

PROBLEM = generate("test", 1, 0, TaskConfig(2, 2))[0]  # one the shipped target solves


@dataclass
class Gold:
    prompt: str
    answer: str


def test_latex_right_is_the_checker_on_a_gold_key():
    assert latex_right("so \\boxed{1/576}", normalize_latex("\\frac{1}{576}"))
    roots = normalize_latex("-\\dfrac{13}{96}, \\dfrac{13}{40}")
    assert latex_right("\\boxed{\\frac{13}{40}, -\\frac{13}{96}}", roots)
    assert latex_right("\\boxed{1,012}", "1012") and latex_right("\\boxed{x = 1012}", "1012")
    assert not latex_right("\\boxed{1/567}", normalize_latex("\\frac{1}{576}"))
    assert not latex_right("The answer is 1012.", "1012")  # no box, no answer


def _run(make_engine, gold: str, rule: str = "latex"):
    driver = SearchDriver(make_engine())
    rid = driver.submit(Gold(PROBLEM.prompt, gold), SearchConfig(method="sc", capacity=4, answer_rule=rule,
                                                                 max_tokens=80))
    return driver.run_until_done()[rid]


def test_a_latex_run_is_graded_by_the_checker(make_engine):
    n = PROBLEM.answer
    plain = _run(make_engine, str(n))
    assert plain.answer == str(n) and plain.correct  # the model's vote is the answer, as its key
    other = _run(make_engine, normalize_latex(f"\\frac{{{2 * n}}}{{2}}"))
    assert other.answer == str(n) and other.correct  # the same value in another form: WRONG before
    wrong = _run(make_engine, normalize_latex(f"\\frac{{{2 * n + 2}}}{{2}}"))
    assert wrong.answer == str(n) and wrong.correct is False
    boxed = _run(make_engine, f"{2 * n}/2", rule="boxed")  # other rules still compare keys
    assert boxed.correct is False


def test_gambit_run_on_hmmt_says_correct_for_an_equivalent_answer(tmp_path, capsys):
    from gambit.run import RunConfig, run

    data = tmp_path / "h.jsonl"
    row = {"question": PROBLEM.question, "answer": f"\\dfrac{{{2 * PROBLEM.answer}}}{{2}}"}
    data.write_text(json.dumps(row) + "\n")
    out = run(RunConfig(benchmark="hmmt24", data=str(data), problems=1, samples=4, swap=1, max_tokens=80,
                        save="", png=""))
    said = capsys.readouterr().out
    assert f">>> answer {PROBLEM.answer} " in said and ": CORRECT" in said and out["solved"] == 1
