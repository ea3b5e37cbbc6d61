"""Answers at the edges a model reaches: a comma list ("1,2" read as 12), runaway digits (a ValueError
that ended grading and a search), a number under an operator ("\\sqrt{25}" read as 25), a thought
Python's eval could not take, and a text that loops on "\\boxed{" (quadratic to read)."""

from __future__ import annotations

import time

import pytest

from gambit.tasks.answers import extract_boxed, parse_int
from gambit.tasks.arithmetic import check_answer as task_right
from gambit.tasks.arithmetic import check_thought
from gambit.tasks.benchmarks import BenchmarkItem, check_answer
from gambit.tasks.graded import answer_key, latex_key

BIG = "1" * 5000  # over Python's int-string digit limit (4,300)


def item(gold: str, bench: str = "aime") -> BenchmarkItem:
    return BenchmarkItem("x/0", "q", gold, "integer", {"benchmark": bench})


@pytest.mark.parametrize("text, value", [("1,2", None), ("12,34", None), ("1,2345", None), (",5", None),
                                         ("1,234", 1234), ("-1,000,000", -1000000), ("1,000.0", 1000)])
def test_a_comma_groups_thousands_only(text, value):
    assert parse_int(text) == value


def test_a_list_of_two_numbers_is_not_their_digits():
    """``\\boxed{1,2}`` was 12 to the task, AIME and the vote; GSM8K's ``#### 3,4`` was 34."""
    assert not task_right("\\boxed{1,2}", 12) and not check_answer(item("34"), "\\boxed{3,4}")
    assert not check_answer(item("34", "gsm8k"), "#### 3,4")
    assert answer_key("integer", "\\boxed{1,2}") is None and answer_key("gsm8k", "#### 3,4") is None
    assert task_right("\\boxed{1,234}", 1234) and check_answer(item("1234", "gsm8k"), "#### 1,234")


@pytest.mark.parametrize("kind, text", [
    ("integer", f"\\boxed{{{BIG}}}"), ("gsm8k", f"so it is {BIG}"), ("gsm8k", f"#### {BIG}"),
    ("boxed", f"\\boxed{{{BIG}}}"), ("latex", f"\\boxed{{\\frac{{{BIG}}}{{3}}}}"),
    ("latex", f"\\boxed{{{BIG}.5}}"),
    ("integer", f"\\boxed{{\\frac{{{BIG}}}{{3}}}}"),
])
def test_runaway_digits_are_no_answer_not_a_crash(kind, text):
    """Each raised ValueError (int-string digit limit): in ``gambit eval`` and in a search's vote."""
    key = answer_key(kind, text)
    assert key is None or kind in ("boxed", "latex")
    assert not task_right(text, 1) and not check_answer(item("1", "gsm8k"), text)
    assert latex_key(BIG) == BIG


@pytest.mark.parametrize("text, wrong", [
    ("\\sqrt{25}", "25"), ("5!", "5"), ("25\\pi", "25"), ("2i", "2"), ("x^2", "2"), ("a_5", "5"),
    ("\\log 8", "8"), ("x = \\sqrt{49}", "49"),
])
def test_a_number_under_an_operator_is_not_the_answer(text, wrong):
    """The lone number of the box was read: ``\\sqrt{25}`` graded right against 25."""
    assert not check_answer(item(wrong), f"\\boxed{{{text}}}")
    assert answer_key("integer", f"\\boxed{{{text}}}") is None


@pytest.mark.parametrize("text, value", [
    ("18 eggs", 18), ("\\$18.00", 18), ("18^\\circ", 18), ("18^{\\circ}", 18), ("12\\%", 12),
    ("\\text{5 dollars}", 5), ("x = \\sqrt{25} = 5", 5), ("a_5 = 12", 12), ("\\$1\\!000", 1000),
    ("\\textbf{(B) } 5", 5), ("5cm", 5), ("18km", 18),  # a unit word after the digits: not "2i"
])
def test_a_number_with_its_unit_still_reads(text, value):
    assert answer_key("integer", f"\\boxed{{{text}}}") == str(value)


@pytest.mark.parametrize("thought, want", [
    ("1" + "+1" * 100_000 + "=100001", True),  # RecursionError in eval's compiler
    ("-" * 100_000 + "1=1", True),  # MemoryError
    ("07*2=14", True), ("07*2=15", False),  # a leading zero was no thought (SyntaxError)
    ("2*-3=-6", True), ("--2=2", True), ("1 2=12", None), ("2*=2", None), ("2+*3=5", None),
    ("2*3+4*5-6=20", True), ("2*3+4*5-6=21", False),
])
def test_check_thought_reads_what_eval_could_not(thought, want):
    assert check_thought(thought) is want


def test_a_text_looping_on_boxed_reads_in_linear_time():
    """Each unclosed box was scanned to the end: 5,000 of them took 8 s (20,000: minutes)."""
    text = "\\boxed{7} " + "\\boxed{" * 5000
    start = time.perf_counter()
    assert extract_boxed(text) == "7"
    assert extract_boxed("\\boxed{" * 5000) is None
    assert time.perf_counter() - start < 1.0
    assert extract_boxed("\\boxed{a \\boxed{} } \\boxed{") == "a \\boxed{}"
    assert extract_boxed("} \\boxed{\\frac{1}{2}} }") == "\\frac{1}{2}"


@pytest.mark.parametrize("text", ["10^{10^{10}}", "2^{2^{40}}", "10^{100000000}", "1000000!",
                                  "\\binom{1000000000}{500000000}", "(10^{10})!"])
def test_a_boxed_power_tower_is_graded_at_once(text):
    """sympy built the number: 5 s to math-verify's timeout in the main thread, and in a thread (a
    search's verdict), where it has none, a hang that held the GIL (killed after 120 s)."""
    start = time.perf_counter()
    assert not check_answer(BenchmarkItem("h", "", "7", "latex"), f"\\boxed{{{text}}}")
    assert time.perf_counter() - start < 2.0


@pytest.mark.parametrize("gold, text", [
    ("\\dfrac{4^{2024}}{\\binom{4048}{2024}}-2", "\\frac{4^{2024}}{\\binom{4048}{2024}} - 2"),
    ("2^{25} \\cdot 26!", "26! \\cdot 2^{25}"), ("1024", "2^{10}"), ("10^{10^{10}}", "10^{10^{10}}"),
])
def test_powers_within_reach_still_go_to_the_checker(gold, text):
    assert check_answer(BenchmarkItem("h", "", gold, "latex"), f"\\boxed{{{text}}}")
