"""Grading one completion against a benchmark item's gold answer (``check_answer``).

integer items by ``gambit.tasks.integers``, LaTeX by math-verify with a textual fallback, multiple choice
by the letter read from the completion (``extract_choice``).
"""

from __future__ import annotations

import re
import threading
from typing import TYPE_CHECKING, Any

from gambit.tasks.answers import ascii_minus, check_integer, extract_boxed
from gambit.tasks.integers import _boxed_int, _gsm8k_fallback

if TYPE_CHECKING:
    from gambit.tasks.benchmarks import BenchmarkItem


def _check_integer(item: BenchmarkItem, completion: str) -> bool:
    boxed = extract_boxed(completion)
    if boxed is not None:
        pred = _boxed_int(boxed)
    elif item.meta.get("benchmark") == "gsm8k":
        pred = _gsm8k_fallback(completion)
    else:
        return False
    return pred is not None and check_integer(str(pred), item.answer or "")


_LATEX_NOISE = re.compile(r"\\[,;:! ]|\\left|\\right|\\displaystyle|\s+")


def normalize_latex(s: str) -> str:
    """Cheap textual normal form of a LaTeX answer, used when math-verify cannot parse it."""
    s = ascii_minus(s).strip().strip("$").strip()
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = re.sub(r"\\text\{\s*([^{}]*?)\s*\}", r"\1", s)
    s = _LATEX_NOISE.sub("", s)
    return s.rstrip(".")


def _mv_timeout() -> int | None:
    # math-verify times out with signal.alarm, which only works in the main thread.
    return 5 if threading.current_thread() is threading.main_thread() else None


def _mv_parse(text: str) -> list[Any]:
    """math-verify parse, [] on any failure; a result holding only the raw string counts as a failure."""
    from math_verify import parse

    try:
        out = parse(text, parsing_timeout=_mv_timeout())
    except Exception:
        return []
    return out if any(not isinstance(x, str) for x in out) else []


# a number sympy evaluates eagerly and cannot finish: a power tower ("10^{10^{10}}"), an exponent, a
# factorial or a binomial of 5+ digits. In a thread math-verify has no timeout (``_mv_timeout``) and the
# computation holds the GIL: one such boxed answer hung the whole process (the main thread: 5 s each).
# The gold answers stay within reach ("\\dfrac{4^{2024}}{\\binom{4048}{2024}}", "2^{25} \\cdot 26!").
_HUGE = re.compile(r"\^\s*\{[^{}]*[\^!]|\^\s*\{?\s*\(?\s*\d{5}|\d{5}\s*!|[)}\]]\s*!"
                   r"|\\[dt]?binom\s*\{?\s*\d{5}")


def _check_latex(item: BenchmarkItem, completion: str) -> bool:
    """The boxed answer against the gold. An unboxed completion gives none, as for AIME: math-verify
    on the whole text took its last number, which a cut or echoing model writes from the question."""
    from math_verify import verify

    gold_s = ascii_minus(item.answer or "")
    boxed = extract_boxed(completion)
    if boxed is None:
        return False
    pred_s = boxed = ascii_minus(boxed)
    if _HUGE.search(boxed):  # no math-verify: sympy would build the number itself
        return normalize_latex(gold_s) == normalize_latex(pred_s)
    gold = _mv_parse(f"${gold_s}$") or _mv_parse(f"\\boxed{{{gold_s}}}")
    pred = _mv_parse(f"\\boxed{{{boxed}}}")
    if gold and pred:
        try:
            if verify(gold, pred, timeout_seconds=_mv_timeout()):  # gold first: verify is not symmetric
                return True
        except Exception:
            pass
    return bool(pred_s.strip()) and normalize_latex(gold_s) == normalize_latex(pred_s)


_CHOICE_IN_BOX = re.compile(r"^\(?([A-D])\)?(?:[.:)]|\s|$)")
# a box of several letters ("B, C", "A or B", "(A)/(C)") chose none: it read as its first or last one
_HEDGE_IN_BOX = re.compile(r"^\(?[A-D]\)?(?:\s*(?:[,;/&]|\band\b|\bor\b)\s*\(?[A-D]\)?)+\.?$")
# "the answer is (B)", "correct option: B", "the best choice would be B"; "option B is correct"
# ("adoption is A" is no stated answer: option/choice start a word; "final_answer: B" still reads)
_ANSWER_IS = re.compile(r"(?i:answer|(?<![A-Za-z])(?:option|choice))"
                        r"\s*(?:is|:|(?:must|would|should|will)\s+be)\s*[:\-]?\s*(?:\(([a-d])\)|[*_$({\[]*\s*(?:\\text\w*\{)?\s*([A-D])\b)"
                        r"|(?<![A-Za-z])(?i:option|choice)\s+\(?([A-D])\)?\s+is\s+(?:the\s+)?(?:correct|right|best)")
_STANDALONE = re.compile(r"(?<![A-Za-z0-9_\\])([A-D])(?![A-Za-z0-9_])")
# a line that is only a letter: "(B)", "**C**", "D."
_LETTER_LINE = re.compile(r"^[\s*_($]*([A-D])[\s*_).:$]*$", re.M)


def extract_choice(completion: str) -> str | None:
    """Letter A-D chosen in a completion.

    ``\\boxed{X}`` first, else the last "answer is X" ("(b)" too; "option/choice is X", "option X is
    correct"), else the last line that is only a letter, else the last standalone capital A-D of the
    final line. That last rule is loose (it can catch a sentence-initial "A"), so it reads the final
    line only: over the whole text, a completion cut mid-reasoning voted for the last option it
    happened to mention, and a model that never answered scored chance, not 0. It read "The correct
    option is B, because A and C are wrong." as C. A box of several letters ("B, C", "A or B") is no
    answer: it was graded right whenever one of them was.
    """
    boxed = extract_boxed(completion)
    if boxed is not None:
        inner = re.sub(r"\\text\w*\{([^{}]*)\}", r"\1", boxed).strip().strip("*$ ")
        if _HEDGE_IN_BOX.match(inner):
            return None
        m = _CHOICE_IN_BOX.match(inner)
        if m:
            return m.group(1)
    hits = _ANSWER_IS.findall(completion)
    if hits:
        return "".join(hits[-1]).upper()
    hits = _LETTER_LINE.findall(completion)
    if hits:
        return hits[-1]
    lines = [ln for ln in completion.splitlines() if ln.strip()]
    hits = _STANDALONE.findall(lines[-1]) if lines else []
    return hits[-1] if hits else None


def check_answer(item: BenchmarkItem, completion: str) -> bool:
    """True iff ``completion`` reaches ``item``'s gold answer.

    integer → last ``\\boxed{}`` as an exact integer (GSM8K also accepts ``#### N`` or the last number);
    latex → math-verify equivalence (``verify(gold, pred)``), falling back to normalised string equality;
    choice → the chosen letter. Code and chat items have no automatic checker (they need a sandboxed
    test run or a judge model) and raise ValueError.
    """
    if item.kind == "integer":
        return _check_integer(item, completion)
    if item.kind == "latex":
        return _check_latex(item, completion)
    if item.kind == "choice":
        return extract_choice(completion) == item.answer
    raise ValueError(
        f"no automatic checker for {item.kind!r} items ({item.id}): "
        "code needs its tests run in a sandbox and chat needs a judge"
    )
