"""Reading an integer answer from a completion: a boxed one amid units and LaTeX, or GSM8K's unboxed one.

Used by the integer benchmarks' checker (AIME, GSM8K) and by the ``integer`` / ``gsm8k`` vote keys, so a
completion grades and votes on the same number.
"""

from __future__ import annotations

import re
from fractions import Fraction

from gambit.tasks.answers import ascii_minus, parse_int

# a number ("1,234", "-5", "18.00"); a minus is its sign only where no digit, letter, ")" or "." precedes
# it: in "75-2" or "2019-2020" it is an operator or a dash, and the last number is 2 / 2020, not -2 / -2020
_NUM = r"(?:(?<![\w).])-)?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)"
_NUMBER = re.compile(_NUM)
# a fraction ("3/4", "60 / 2") or a mixed number ("5 1/2") is one quantity: read by its last number,
# "The answer is 3/4" was 4 and "6/2" was 2; a GSM8K answer (an integer) is its value where whole
_FRAC_TAIL = rf"(?:\s+\d+/\d+|\s*/\s*{_NUM})"
_QUANTITY = re.compile(rf"{_NUM}{_FRAC_TAIL}?")
# "-\$5" / "-$5": the sign stood before the currency sign, so the number read was 5
_SIGNED_MONEY = re.compile(r"-\\?\$(?=\d)")
_FRACTION = re.compile(r"(-?)\s*(?:\\[dt]?frac\s*\{\s*(-?\d+)\s*\}\s*\{\s*(-?\d+)\s*\}"
                       r"|\\[dt]?frac(\d)(\d)|(-?\d+)\s*/\s*(-?\d+))")


def _as_int(s: str) -> int | None:
    """Integer value of a number string ("1,234", "18.00" → 1234, 18); None for non-integers (and "1,2",
    which ``parse_int`` refuses as a list; GSM8K's "#### 1,2" read 12)."""
    if "." in s:
        whole, frac = s.split(".", 1)
        if frac.strip("0"):
            return None
        s = whole
    return parse_int(s)


def _exact(s: str) -> Fraction | None:
    """The exact value of one number string ("1,234", "-2.5"), None for a list ("1,2") or runaway digits."""
    if "," in s:
        if re.fullmatch(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?", s) is None:
            return None
        s = s.replace(",", "")
    try:
        return Fraction(s)
    except ValueError:  # over the int-string digit limit
        return None


def _quantity_int(s: str) -> int | None:
    """Integer value of a number, fraction ("6/2" → 3) or mixed number ("5 1/2"); None if not whole."""
    head, slash, den = s.rpartition("/")
    if not slash:
        return _as_int(s)
    parts = [_exact(p) for p in (*head.split(), den.strip())]
    if len(parts) not in (2, 3) or None in parts or parts[-1] == 0:
        return None
    *whole, num, d = parts
    value = num / d
    if whole:  # "5 1/2": the fraction adds to the whole's size ("-5 1/2" is -5.5)
        if whole[0].denominator != 1 or num < 0 or d < 0:
            return None
        value = whole[0] + value if whole[0] >= 0 else whole[0] - value
    return value.numerator if value.denominator == 1 else None


def _boxed_int(content: str) -> int | None:
    """Integer in a boxed answer: plain ("1,234") or the lone number amid units ("\\$18", "18 eggs");
    else, read more loosely (``_loose_int``), an equation's result or a whole fraction."""
    content = _SIGNED_MONEY.sub("-", ascii_minus(content))
    v = parse_int(content)
    if v is not None:
        return v
    if _FRACTION.fullmatch(content.strip().strip("$").strip()):  # "\\frac62" is 3, not the lone "62"
        return _loose_int(content)
    nums = _NUMBER.findall(content)
    v = _lone_int(content, nums)
    return v if v is not None else _loose_int(content)


# what makes a lone number part of an expression rather than a quantity with its unit: "\\sqrt{25}" is 5,
# "5!" 120, "25\\pi", "2i", "x^2", "a_5", "\\log 8" are no integer (each read as its lone number). A
# digit before one letter is a product ("2i", "3n"), before a word a unit ("5cm", "5kg" still read 5)
_OPERATED = re.compile(r"\\(?:sqrt|pi|log|ln|exp|sin|cos|tan|cot|sec|csc|binom|choose|infty|cdot|times|div"
                       r"|pm|mp|lfloor|lceil)(?![A-Za-z])|(?<!\\)!|_|\^(?!\s*\{?\s*\\circ)"
                       r"|\d[A-Za-z](?![A-Za-z])")


def _lone_int(content: str, nums: list[str]) -> int | None:
    """The one number in ``content`` amid units or words ("\\$18", "18 eggs"), None where there are more
    or an operator takes it (``_OPERATED``)."""
    if len(nums) != 1 or _OPERATED.search(content):
        return None
    return _as_int(nums[0])


def _loose_int(content: str) -> int | None:
    """What small models box besides a number: ``1\\,000`` / ``1{,}000``, an equation ``10 - 5 = 5``
    (its right-hand side, where the left holds no list) and a fraction that is whole (``\\frac{6}{2}``,
    ``6/2``). Only tried where the plain rule finds no answer (or read ``\\frac62`` as 62)."""
    s = re.sub(r"\\[,;:! ]", "", content).replace("{,}", ",")
    if "=" in s:
        left, s = s.rsplit("=", 1)
        if re.search(r"[,;]|\\text\{\s*and", left):  # "x=3, y=5": which one is the answer is unclear
            return None
    s = s.strip().strip("$").strip()
    v = parse_int(s)
    if v is not None:
        return v
    m = _FRACTION.fullmatch(s)
    if m:
        sign, *parts = m.groups()
        num, den = next((parse_int(a), parse_int(b)) for a, b in zip(parts[::2], parts[1::2], strict=True)
                        if a)
        if num is not None and den and num % den == 0:
            return -(num // den) if sign else num // den
        return None
    return _lone_int(s, _NUMBER.findall(s))


# "the answer is 7." (not "the answer is 3 + 4 = 7": a number an operator follows is a step, not the answer)
# ("the answer is 18, which ..." is 18: only a comma before a digit continues the number)
_ANSWER_NUMBER = re.compile(rf"(?i:answer)\s*(?:is|:)\s*(?::|-(?!\d))?\s*\**\s*\\?\$?\s*({_NUM}{_FRAC_TAIL}?)"
                            r"(?!\d|,\d|\.\d|\s*(?:[-+/×÷=^]|\*(?!\*)))")  # "**42**" is bold, not 42 times
_HASHES = re.compile(rf"####\s*\\?\$?\s*(-?[\d,]*\d(?:\.\d+)?{_FRAC_TAIL}?)")


def _gsm8k_fallback(completion: str) -> int | None:
    """GSM8K answers without a box: the last ``#### N``, else the last "answer is N", else the last number
    in the text (after "The answer is 7." a model may write on: "Step 3")."""
    completion = _SIGNED_MONEY.sub("-", ascii_minus(completion))
    hashes = _HASHES.findall(completion)
    if hashes:
        return _quantity_int(hashes[-1])
    stated = _ANSWER_NUMBER.findall(completion)
    if stated:
        return _quantity_int(stated[-1])
    nums = _QUANTITY.findall(completion)
    return _quantity_int(nums[-1]) if nums else None

