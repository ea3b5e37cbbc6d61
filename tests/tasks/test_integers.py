"""GSM8K's unboxed answers and boxed integers as prose writes them: a fraction or mixed number is one
quantity, a stated answer may go on after a comma, and a sign before the currency sign is kept."""

from __future__ import annotations

import pytest

from gambit.tasks.benchmarks import BenchmarkItem, check_answer
from gambit.tasks.graded import answer_key


def gsm8k(gold: str) -> BenchmarkItem:
    return BenchmarkItem("gsm8k/0", "q", gold, "integer", {"benchmark": "gsm8k"})


@pytest.mark.parametrize(("text", "key"), [
    ("The answer is 3/4", None),  # read 4: its denominator
    ("She has 3/4 of the pie left.", None),
    ("It took 1/2 hour", None),  # read 2
    ("#### 3/4", None),  # read 3
    ("Answer: 5 1/2", None),  # a mixed number read 5
    ("He has 3 1/2 apples", None),  # read 2
    ("The answer is 6/2", "3"),  # read 2
    ("answer: 2/1", "2"),  # read 1
    ("#### 60 / 2", "30"),  # read 60
    ("So 1/2 of 10 = 5", "5"),
    ("The answer is -5 1/2", None),
])
def test_a_fraction_is_one_quantity(text, key):
    """A fraction's last number was read as the answer: "The answer is 3/4" voted 4 and graded right
    against a gold 4; "6/2" graded wrong against 3. Its value counts now (no integer: no answer)."""
    assert answer_key("gsm8k", text) == key


@pytest.mark.parametrize(("gold", "text", "right"), [
    ("4", "The answer is 3/4.", False),
    ("2", "It took 1/2 hour", False),
    ("3", "The answer is 6/2.", True),
    ("5", "Answer: 5 1/2", False),
])
def test_a_fraction_grades_by_its_value(gold, text, right):
    assert check_answer(gsm8k(gold), text) is right


@pytest.mark.parametrize(("text", "key"), [
    ("The answer is 18, which she sells at 2 dollars each.", "18"),  # read 2
    ("The answer is 1,234, the total cost.", "1234"),
    ("The answer is 18, so she makes 2 more.", "18"),
])
def test_a_stated_answer_may_go_on_after_a_comma(text, key):
    """A comma after the stated number refused it (meant for "1,2"), so the last number of the sentence
    that went on was read instead."""
    assert answer_key("gsm8k", text) == key


@pytest.mark.parametrize(("text", "key"), [
    ("The answer is -$10.", "-10"),  # read 10; GSM8K has negative golds (-10, -3)
    ("Answer: -$3", "-3"),
    ("\\boxed{-\\$10}", "-10"),
    ("She spent 15 - $5 = $10", "10"),
    ("75-$2", "2"),  # after a number a minus is an operator
])
def test_a_sign_before_the_currency_sign_is_kept(text, key):
    assert answer_key("gsm8k", text) == key
    assert check_answer(gsm8k(key), text)
