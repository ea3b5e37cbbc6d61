"""Answer extraction and checking shared by the synthetic task and the public benchmarks."""

from __future__ import annotations

import re

BOXED = "\\boxed{"


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text`` with brace matching, or None."""
    start = text.rfind(BOXED)
    while start != -1:
        i = start + len(BOXED)
        depth = 1
        j = i
        while j < len(text):
            ch = text[j]
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return text[i:j].strip()
            j += 1
        # unbalanced: try an earlier occurrence
        start = text.rfind(BOXED, 0, start)
    return None


_INT = re.compile(r"^[+-]?\d+$")


def parse_int(answer: str | None) -> int | None:
    """Integer value of an answer string ("1,234", " 42 ", "042" → ints), else None."""
    if answer is None:
        return None
    s = answer.replace(",", "").replace("\\!", "").strip().strip("$").strip()
    if s.endswith(".0"):
        s = s[:-2]
    return int(s) if _INT.match(s) else None


def check_integer(pred: str | None, gold: str | int) -> bool:
    """Exact integer match (AIME, GSM8K, the synthetic task)."""
    p = parse_int(pred)
    g = gold if isinstance(gold, int) else parse_int(str(gold))
    return p is not None and g is not None and p == g
