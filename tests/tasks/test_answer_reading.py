"""How a completion's answer is read: the checker (``check_answer``) and the vote key (``answer_key``)
agree, a box is needed where the set asks for one, a Unicode minus keeps its sign, and loose rules
(an unboxed number, a stray letter) read only where the text states an answer."""

from __future__ import annotations

import pytest

from gambit.tasks.answers import ascii_minus, parse_int
from gambit.tasks.benchmarks import BenchmarkItem, check_answer, extract_choice
from gambit.tasks.graded import answer_key, answer_kind, gold_key


def item(kind: str, gold: str, bench: str) -> BenchmarkItem:
    return BenchmarkItem("x/0", "q", gold, kind, {"benchmark": bench})


def graded(it: BenchmarkItem, text: str) -> tuple[bool, bool]:
    """(the checker's verdict, whether the vote key is the gold key)."""
    return check_answer(it, text), answer_key(answer_kind(it), text) == gold_key(it)


@pytest.mark.parametrize("text", [
    "The answer is 1012.",  # math-verify on the whole text took its last number
    "Compute the number of ways to pick 1012 objects. We get \\boxed{}",  # an echo and an empty box
    "so it is $\\frac{2024}{2}$",
])
def test_latex_needs_a_box_as_aime_does(text):
    """HMMT graded an unboxed completion by its last number (an echoed question's too), AIME did not,
    and the vote never counted it: now neither the checker nor the key reads one."""
    assert graded(item("latex", "1012", "hmmt"), text) == (False, False)
    assert graded(item("integer", "1012", "aime"), text) == (False, False)
    assert check_answer(item("latex", "1012", "hmmt"), text + " \\boxed{1012}")


@pytest.mark.parametrize("kind, bench, text, gold, right", [
    ("integer", "aime", "\\boxed{\u22125}", "5", False),  # the sign was dropped: graded right
    ("integer", "aime", "\\boxed{\u22125}", "-5", True),
    ("integer", "gsm8k", "so the total is \u22125", "5", False),
    ("integer", "gsm8k", "so the total is \u22125", "-5", True),
    ("integer", "gsm8k", "it is \u20135 degrees", "-5", True),  # an en dash written as a minus
    ("integer", "gsm8k", "the trip takes 5\u20137 days, so 7", "7", True),  # a range stays a range
    ("latex", "hmmt", "\\boxed{\u2212\\frac{1}{2}}", "-\\frac{1}{2}", True),
    ("latex", "hmmt", "\\boxed{\u2212\\frac{1}{2}}", "\\frac{1}{2}", False),
])
def test_a_unicode_minus_keeps_its_sign(kind, bench, text, gold, right):
    assert graded(item(kind, gold, bench), text) == (right, right)


def test_parse_int_reads_a_unicode_minus():
    assert parse_int("\u22127") == -7 and parse_int("\u22121,000") == -1000
    assert ascii_minus("12 \u2013 5 = 7") == "12 \u2013 5 = 7" and ascii_minus("is \u20135") == "is -5"


@pytest.mark.parametrize("boxed, gold", [
    ("10 - 5 = 5", "5"), ("\\frac{6}{2}", "3"), ("\\dfrac{6}{2}", "3"), ("6/2", "3"), ("\\frac62", "3"),
    ("-\\frac{6}{2}", "-3"), ("1\\,000", "1000"), ("1{,}000", "1000"), ("x_1 = 5", "5"),
])
def test_boxed_equations_and_whole_fractions_give_their_integer(boxed, gold):
    """Small models box these; they gave no answer (no key, graded wrong)."""
    for bench in ("gsm8k", "aime"):
        assert graded(item("integer", gold, bench), f"\\boxed{{{boxed}}}") == (True, True), (boxed, bench)


@pytest.mark.parametrize("boxed", ["\\frac{7}{2}", "x = 3, y = 5", "3-5", "7/0"])
def test_a_boxed_form_with_no_single_integer_is_no_answer(boxed):
    assert answer_key("integer", f"\\boxed{{{boxed}}}") is None


@pytest.mark.parametrize("text, key", [
    ("The answer is 7. Step 3", "7"),  # it took the 3 written after the answer
    ("The answer is -5.", "-5"),
    ("Answer: **42** (I checked 2 ways)", "42"),
    ("The answer is 3 + 4 = 7.", "7"),  # a number an operator follows is a step, not the answer
    ("The answer is 1,000 - 5 = 995.", "995"),
    ("He pays 5 dollars. 16 - 3 - 4 = 9 eggs, 9 * 2 = 18", "18"),  # no stated answer: the last number
    ("She makes $18.\n#### 18\nThe answer is 3", "18"),  # GSM8K's #### first
    # a minus after a digit, letter, ")" or "." is an operator or a dash, not a sign (they read -2, -2020)
    ("25*3=75\n\n75-2", "2"), ("between 2019-2020", "2020"), ("She sold 12-5", "5"), ("(4+5)-61", "61"),
    ("The result is -7", "-7"), ("so x = (-7)", "-7"), ("The result is \u22127", "-7"), ("75\u22122", "2"),
])
def test_gsm8k_unboxed_prefers_the_stated_answer(text, key):
    assert answer_key("gsm8k", text) == key
    assert check_answer(item("integer", key, "gsm8k"), text)


@pytest.mark.parametrize("text, letter", [
    # a completion cut mid-reasoning: options mentioned, none chosen
    ("Let us look at the options.\nA says the energy rises, but B contradicts it.\nConsider", None),
    ("Option C is tempting because", "C"),  # the final line still counts (documented loose rule)
    ("The answer is (b)", "B"),
    ("the answer is (d).\nDone.", "D"),
    ("the answer is a planet", None),
    ("Both fit, but I pick A", "A"),
    ("I compared A and C.\nThe answer is C.\nA final note.", "C"),
    ("Weighing them up.\n\n**B**\n\nThat is all.", "B"),  # a line that is only a letter
])
def test_a_choice_is_read_where_the_text_states_it_or_in_its_final_line(text, letter):
    """A loose last-capital rule over the whole text voted for the last option a cut completion
    mentioned: a model that never answered scored chance on GPQA, not 0."""
    assert extract_choice(text) == letter


@pytest.mark.parametrize("text, letter", [
    ("\\boxed{B, C}", None),  # read C (the final line's last capital)
    ("\\boxed{A or B}", None),  # read A
    ("So it is $\\boxed{\\text{(A) and (C)}}$", None),
    ("\\boxed{B/D}", None),
    ("\\boxed{C) 12}", "C"),  # a letter and its option's text is one choice
    ("\\boxed{\\text{B. A ring of carbon}}", "B"),
])
def test_a_box_of_several_letters_is_no_choice(text, letter):
    """A hedged box graded right whenever one of its letters was the gold: credit for not choosing."""
    assert extract_choice(text) == letter
    assert check_answer(item("choice", "C", "gpqa"), text) is (letter == "C")
