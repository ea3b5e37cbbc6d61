"""Answer extraction and checking shared by the synthetic task and the public benchmarks."""

from __future__ import annotations

import re

BOXED = "\\boxed{"
_BRACE = re.compile(r"[{}]")


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text`` that holds something, with brace matching, or
    None. An empty box is no answer: a model that echoes the instruction ("put your final answer within
    \\boxed{}") would otherwise vote for the empty string. The braces are matched in one pass: each
    unclosed box was scanned to the end of the text, so a model looping on "\\boxed{" took 8 s to read
    at 5,000 of them (quadratic)."""
    first = text.find(BOXED)
    if first == -1:
        return None
    close: dict[int, int] = {}  # a "{" -> its "}"; a brace before the first box matches nothing after it
    opened: list[int] = []
    for m in _BRACE.finditer(text, first):
        if m[0] == "{":
            opened.append(m.start())
        elif opened:
            close[opened.pop()] = m.start()
    start = text.rfind(BOXED)
    while start != -1:
        i = start + len(BOXED)
        j = close.get(i - 1)
        if j is not None and text[i:j].strip():
            return text[i:j].strip()
        # unbalanced or empty: try an earlier occurrence
        start = text.rfind(BOXED, 0, start)
    return None


_INT = re.compile(r"^[+-]?\d+$")
# commas only as thousands separators: "1,2" is a list of two, not 12
_GROUPED = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+$")
# U+2212 MINUS SIGN, the small and fullwidth hyphen-minus
_MINUS = str.maketrans(dict.fromkeys("\u2212\ufe63\uff0d", "-"))
_EN_DASH = re.compile(r"(\S?)(\s*)\u2013")


def ascii_minus(text: str) -> str:
    """``text`` with a Unicode minus written as ASCII '-': the number rules know only '-', so "−5"
    read as 5 and a negated answer graded right. An en dash is a minus only where no digit comes
    before it ("is –5"): after one it is a range or a difference ("5–7 days", "12 – 5")."""
    text = text.translate(_MINUS)
    if "\u2013" not in text:
        return text
    return _EN_DASH.sub(lambda m: m[0] if m[1].isdigit() else f"{m[1]}{m[2]}-", text)


def parse_int(answer: str | None) -> int | None:
    """Integer value of an answer string ("1,234", " 42 ", "042", "−7" → ints), else None. A comma only
    groups thousands ("1,2" is a list: it read as 12), and a number over Python's digit limit (4,300) is
    no answer (its ValueError ended a grading run or a search on a model's runaway digits)."""
    if answer is None:
        return None
    s = ascii_minus(answer).replace("\\!", "").strip().strip("$").strip()
    if s.endswith(".0"):
        s = s[:-2]
    if "," in s:
        if not _GROUPED.match(s):
            return None
        s = s.replace(",", "")
    if not _INT.match(s):
        return None
    try:
        return int(s)
    except ValueError:  # over the int-string digit limit
        return None


def check_integer(pred: str | None, gold: str | int) -> bool:
    """Exact integer match (AIME, GSM8K, the synthetic task)."""
    p = parse_int(pred)
    g = gold if isinstance(gold, int) else parse_int(str(gold))
    return p is not None and g is not None and p == g
