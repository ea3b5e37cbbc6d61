"""Every reference answer of the graded sets, written as a model writes it (boxed, "The answer is",
``#### N``, ``(B)``, ``7,521``, ``24/17``...), is read back right and votes with the gold; wrong ones
are not. Under the LaTeX rule ``\\frac{24}{17}``, ``24/17`` and ``\\frac{48}{34}`` were three vote
buckets (as were ``7521`` / ``7,521`` / ``7521.0``), so a split right answer lost the HMMT vote."""

from __future__ import annotations

import re

import pytest

from gambit.search.vote import majority_vote
from gambit.tasks.benchmarks import BenchmarkItem, check_answer, extract_choice
from gambit.tasks.graded import GRADED, answer_key, answer_kind, datasets_dir, gold_key, load_graded

real_data = pytest.mark.skipif(not datasets_dir().is_dir(), reason=f"no datasets at {datasets_dir()}")


def integer_forms(gold: str, gsm8k: bool) -> tuple[list[str], list[str]]:
    v = int(gold)
    right = [f"\\boxed{{{v}}}", f"So the result is $\\boxed{{{v}}}$.", f"\\boxed{{{v}.0}}",
             f"\\boxed{{ {v} }}", f"\\boxed{{${v}$}}", f"\\boxed{{{v} \\text{{ dollars}}}}",
             f"\\boxed{{\\textbf{{{v}}}}}",
             f"\\boxed{{{v:,}}}", "\\boxed{" + f"{v:,}".replace(",", "{,}") + "}"]
    if gsm8k:
        right += [f"Step.\n#### {v}", f"The answer is {v}.", f"The answer is **{v}**.", f"Answer: {v}",
                  f"\\boxed{{\\${v:,}.00}}", f"#### {v:,}", f"The answer is ${v:,}.",
                  f"The answer is {v} eggs."]
    wrong = [f"\\boxed{{{w}}}" for w in (v + 1, -v if v else 1, v * 10, f"{v}.5")]
    if gsm8k:
        wrong += [f"The answer is {v + 1}.", f"#### {v + 1}"]
    return right, wrong


def latex_forms(gold: str) -> tuple[list[str], list[str]]:
    right = [gold, gold.replace("\\dfrac", "\\frac"), re.sub(r"\\d?frac", r"\\dfrac", gold), f"{gold}.",
             f"${gold}$", gold.replace(" ", ""), f"\\displaystyle {gold}"]
    if m := re.fullmatch(r"\\d?frac\{(\d+)\}\{(\d+)\}", gold):
        a, b = int(m[1]), int(m[2])
        right += [f"{a}/{b}", f"\\frac{{{2 * a}}}{{{2 * b}}}", f"{a} / {b}"]
    if re.fullmatch(r"-?\d+", gold):
        right += [f"{int(gold)}.0", f"{int(gold):,}", f"x = {gold}"]
        wrong = [str(int(gold) + 1), str(-int(gold)), str(10 * int(gold))]
    else:
        wrong = [f"{gold}+1", f"2({gold})"]
    return [f"\\boxed{{{r}}}" for r in right], [f"\\boxed{{{w}}}" for w in wrong]


def choice_forms(gold: str) -> tuple[list[str], list[str]]:
    right = [f"\\boxed{{{gold}}}", f"The answer is ({gold}).", f"({gold})", f"{gold})", f"answer: {gold}",
             f"**Answer: {gold}**", f"\\boxed{{\\text{{{gold}}}}}", f"The correct answer is {gold}.",
             f"Reasoning.\n\n{gold}", f"Final Answer: {gold}", f"Answer: ({gold})", f"$\\boxed{{{gold}}}$"]
    others = [c for c in "ABCD" if c != gold]
    return right, [f"\\boxed{{{o}}}" for o in others] + [f"The answer is ({o})." for o in others]


def forms(item: BenchmarkItem) -> tuple[list[str], list[str]]:
    kind = answer_kind(item)
    if kind == "choice":
        return choice_forms(item.answer)
    if kind == "latex":
        return latex_forms(item.answer)
    return integer_forms(item.answer, kind == "gsm8k")


@real_data
@pytest.mark.parametrize("name", list(GRADED))
def test_every_reference_in_a_models_forms_grades_and_votes_right(name):
    """Failures per set on the old code: HMMT-24 30 and HMMT-25 30 vote keys (``.0``, ``7,521``,
    ``24/17``, ``\\frac{48}{34}``, ``x = 29``); graded right and wrong forms were all read right."""
    split, graded_wrong, right_wrong = [], [], []
    for it in load_graded(name):
        kind, gold = answer_kind(it), gold_key(it)
        right, wrong = forms(it)
        for text in right:
            if not check_answer(it, text):
                graded_wrong.append((it.id, text))
            if answer_key(kind, text) != gold:
                split.append((it.id, text, answer_key(kind, text), gold))
        for text in wrong:
            if check_answer(it, text) or answer_key(kind, text) == gold:
                right_wrong.append((it.id, text))
    assert not graded_wrong and not right_wrong and not split, (graded_wrong[:5], right_wrong[:5], split[:5])


def test_one_value_written_three_ways_wins_the_vote():
    texts = ["\\boxed{24/17}", "\\boxed{\\dfrac{24}{17}}", "\\boxed{\\frac{48}{34}}"] + ["\\boxed{2}"] * 2
    gold = gold_key(BenchmarkItem("h", "", "\\dfrac{24}{17}", "latex"))
    assert majority_vote([answer_key("latex", t) for t in texts]) == gold
    numbers = ["\\boxed{7,521}", "\\boxed{7521.0}", "\\boxed{7\\,521}", "\\boxed{7520}", "\\boxed{7520}"]
    assert majority_vote([answer_key("latex", t) for t in numbers]) == "7521"


@pytest.mark.parametrize("a, b", [
    ("0.5", "\\frac12"), ("\\frac{2}{4}", "\\tfrac{1}{2}"), ("-\\frac{13}{96}", "\\frac{-13}{96}"),
    ("-\\dfrac{13}{96}, \\dfrac{13}{40}", "\\frac{13}{40} \\text{ and } -\\frac{13}{96}"),
    ("0,i\\sqrt{6},-i\\sqrt{6}", "-i\\sqrt{6}, 0, i\\sqrt{6}"),
    ("8\\sqrt{11}", "8\\sqrt{11} \\text{ cm}"), ("29", "29^\\circ"), ("\\frac{24}{17}", "x=\\frac{24}{17}"),
    ("184320", "184{,}320"), ("x=1, y=2", "y=2, x=1"),
])
def test_equivalent_latex_answers_share_a_key_as_the_checker_grades_them(a, b):
    assert answer_key("latex", f"\\boxed{{{a}}}") == answer_key("latex", f"\\boxed{{{b}}}")
    assert check_answer(BenchmarkItem("h", "", a, "latex"), f"\\boxed{{{b}}}")


@pytest.mark.parametrize("a, b", [
    ("7521", "7, 521"), ("(1,2)", "(2,1)"), ("12", "1,2"), ("\\frac{1}{2}", "\\frac{1}{3}"), ("2i", "2"),
    ("\\frac{1}{0}", "1"), ("-984", "984"), ("\\text{Alice}", "\\text{Bob}"),
    ("x=1, y=2", "x=2, y=1"),  # one key "1,2" while every "x =" was dropped
])
def test_different_latex_answers_keep_apart(a, b):
    """Keys join only what the checker joins: "7, 521" is a list to math-verify, not 7521."""
    assert answer_key("latex", f"\\boxed{{{a}}}") != answer_key("latex", f"\\boxed{{{b}}}")
    assert not check_answer(BenchmarkItem("h", "", a, "latex"), f"\\boxed{{{b}}}")


@pytest.mark.parametrize("text", [
    "The correct option is **B**, because A and C are wrong.",
    "The correct choice is (B) since option A fails.",
    "Thus the best choice is B, not D.",
    "So option B is correct, and D is not.",
    "Therefore, the correct answer must be B, not C.",
    "The correct answer would be (B), not C.",
])
def test_a_stated_choice_beats_the_options_named_after_it(text):
    """The last standalone letter of the final line was read: C, A, D, D, C, C on the old code."""
    assert extract_choice(text) == "B"
    assert check_answer(BenchmarkItem("g", "", "B", "choice"), text)
    assert extract_choice("option A is wrong and option C is wrong") == "C"  # no stated answer: as before
    assert extract_choice("The adoption is A, says B") == "B"  # "option" inside a word states nothing
