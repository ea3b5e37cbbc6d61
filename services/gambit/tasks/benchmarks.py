"""Loaders and answer checkers for the public benchmarks the papers report on.

Every benchmark ships in its own JSONL layout (GSM8K hides the answer after ``####``, GPQA is a letter,
HumanEval and MBPP carry tests instead of answers, MT-Bench has chat turns, MATH-500 and HMMT have LaTeX
answers). Evaluation code should not care: ``load_benchmark`` turns each file into a list of
``BenchmarkItem`` with one prompt, one normalised gold answer and a ``kind`` that says how a completion is
graded, and ``check_answer`` grades a completion for the kinds that have an automatic checker
(integer, LaTeX via math-verify, multiple choice). Code and chat items need an executor or a judge and are
rejected by ``check_answer`` on purpose.

Bad files fail loudly: a line that is not JSON or lacks a required field raises ``ValueError`` naming the
file, the 1-based line number and the field, so a truncated download is never scored as a bad model.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gambit.tasks.answers import ascii_minus, check_integer, extract_boxed, parse_int

KINDS = ("integer", "latex", "choice", "code", "chat")
CHOICES = ("A", "B", "C", "D")


@dataclass(frozen=True)
class BenchmarkItem:
    """One benchmark question: the prompt, the gold answer (None for code/chat) and how to grade it."""

    id: str
    prompt: str
    answer: str | None
    kind: str
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown kind {self.kind!r}; expected one of {KINDS}")


# --------------------------------------------------------------------------------------------- reading


def _records(path: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(``"<file> line <n>"``, object) for each non-blank line of a JSONL file, n 1-based.

    A ``.json`` file is read as one JSON array instead (some published copies, e.g. sanitized MBPP, come
    that way); its objects are then located as ``"<file> item <n>"``.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"benchmark file not found: {p}")
    try:  # utf-8-sig: a byte-order mark (a common export) is dropped, not read as the first JSON's text
        text = p.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"{p}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}); "
                         "save the file as UTF-8") from None
    if p.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{p} line {e.lineno}: not valid JSON ({e.msg})") from e
        except (ValueError, RecursionError) as e:
            raise ValueError(f"{p}: not readable JSON ({_why(e)})") from None
        if not isinstance(data, list):
            raise ValueError(f"{p}: expected a JSON array of objects, got {type(data).__name__}")
        rows = [(f"{p} item {n}", obj) for n, obj in enumerate(data, start=1)]
    else:
        rows = []
        for n, line in enumerate(text.split("\n"), start=1):  # not splitlines: U+2028 may sit in a string
            if not line.strip():
                continue
            try:
                rows.append((f"{p} line {n}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise ValueError(f"{p} line {n}: not valid JSON ({e.msg})") from e
            except (ValueError, RecursionError) as e:  # a number over the digit limit, deep nesting
                raise ValueError(f"{p} line {n}: not readable JSON ({_why(e)})") from None
    for where, obj in rows:
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        yield where, obj


def _why(e: Exception) -> str:
    """A JSON error in a few words: the digit limit's message runs to a paragraph, recursion's names
    Python's internals. Both escaped bare, naming no file or line."""
    return "nested too deeply" if isinstance(e, RecursionError) else str(e).split(";")[0]


def _req(obj: dict[str, Any], key: str, where: str) -> Any:
    """``obj[key]``, or a ValueError naming the file, line and missing field."""
    if key not in obj or obj[key] is None:
        raise ValueError(f"{where}: missing field {key!r}")
    return obj[key]


def _req_str(obj: dict[str, Any], key: str, where: str) -> str:
    """A required field as a string (numbers such as AIME answers are accepted and converted)."""
    v = _req(obj, key, where)
    if isinstance(v, bool) or not isinstance(v, str | int | float):
        raise ValueError(f"{where}: field {key!r} should be a string, got {type(v).__name__}")
    return str(v)


def _req_text(obj: dict[str, Any], key: str, where: str) -> str:
    """A required question text: a blank one was loaded and sent to the model as an empty prompt."""
    v = _req_str(obj, key, where)
    if not v.strip():
        raise _bad(where, key, "is empty")
    return v


def _bad(where: str, key: str, why: str) -> ValueError:
    return ValueError(f"{where}: field {key!r} {why}")


# --------------------------------------------------------------------------------------------- loaders

_GSM8K_FINAL = re.compile(r"####\s*(.+?)\s*$", re.S)


def load_gsm8k(path: str | Path) -> list[BenchmarkItem]:
    """GSM8K (openai/grade-school-math): ``question``, ``answer`` ending in ``#### N``; gold is N as int."""
    items = []
    for where, obj in _records(path):
        q = _req_text(obj, "question", where)
        a = _req_str(obj, "answer", where)
        m = _GSM8K_FINAL.search(a)
        gold = parse_int(m.group(1)) if m else None
        if gold is None:
            raise _bad(where, "answer", "does not end with '#### <integer>'")
        meta = {"benchmark": "gsm8k", "solution": a}
        items.append(BenchmarkItem(f"gsm8k/{len(items)}", q, str(gold), "integer", meta))
    return items


def load_aime(path: str | Path) -> list[BenchmarkItem]:
    """AIME: ``question``, ``answer`` (an integer 0-999 as a string)."""
    items = []
    for where, obj in _records(path):
        q = _req_text(obj, "question", where)
        gold = parse_int(_req_str(obj, "answer", where))
        if gold is None:
            raise _bad(where, "answer", "is not an integer")
        items.append(BenchmarkItem(f"aime/{len(items)}", q, str(gold), "integer", {"benchmark": "aime"}))
    return items


def load_hmmt(path: str | Path) -> list[BenchmarkItem]:
    """HMMT: ``question``, ``answer`` (LaTeX at times: fractions, surds, lists of roots).

    Another set's file has the same two fields: GSM8K's answers are worked solutions ending in ``#### N``
    and GPQA's are letters. Either loaded silently and scored 0%, so both are refused."""
    items = []
    for where, obj in _records(path):
        q = _req_text(obj, "question", where)
        a = _req_str(obj, "answer", where).strip()
        if not a:
            raise _bad(where, "answer", "is empty")
        if "\n" in a or "####" in a:
            raise _bad(where, "answer", "is a worked solution (GSM8K's layout?), not a final answer")
        items.append(BenchmarkItem(f"hmmt/{len(items)}", q, a, "latex", {"benchmark": "hmmt"}))
    if items and all(it.answer in CHOICES for it in items):
        raise ValueError(f"{path}: every answer is a letter A-D: a multiple-choice (GPQA) file, not HMMT's")
    return items


def load_gpqa(path: str | Path) -> list[BenchmarkItem]:
    """GPQA (Diamond), pre-shuffled layout: ``question`` with the options inlined, ``answer`` a letter A-D."""
    items = []
    for where, obj in _records(path):
        q = _req_text(obj, "question", where)
        a = _req_str(obj, "answer", where).strip().upper()
        if a not in CHOICES:
            raise _bad(where, "answer", f"should be one of {'/'.join(CHOICES)}, got {a!r}")
        items.append(BenchmarkItem(f"gpqa/{len(items)}", q, a, "choice", {"benchmark": "gpqa"}))
    return items


def load_humaneval(path: str | Path) -> list[BenchmarkItem]:
    """HumanEval (openai/human-eval): prompt is the signature+docstring; tests are kept in ``meta``."""
    items = []
    for where, obj in _records(path):
        meta = {
            "benchmark": "humaneval",
            "test": _req_str(obj, "test", where),
            "entry_point": _req_str(obj, "entry_point", where),
            "canonical_solution": _req_str(obj, "canonical_solution", where),
        }
        tid = _req_str(obj, "task_id", where)
        items.append(BenchmarkItem(tid, _req_text(obj, "prompt", where), None, "code", meta))
    return items


def load_mt_bench(path: str | Path) -> list[BenchmarkItem]:
    """MT-Bench (lm-sys/FastChat): prompt is the first turn; all turns (and any reference) go in ``meta``."""
    items = []
    for where, obj in _records(path):
        qid = _req_str(obj, "question_id", where)
        turns = _req(obj, "turns", where)
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip()
                                                                 for t in turns):
            raise _bad(where, "turns", "should be a non-empty list of non-blank strings")
        meta: dict[str, Any] = {
            "benchmark": "mt_bench",
            "turns": list(turns),
            "category": _req_str(obj, "category", where),
        }
        if obj.get("reference") is not None:
            meta["reference"] = obj["reference"]
        items.append(BenchmarkItem(qid, turns[0], None, "chat", meta))
    return items


def load_math500(path: str | Path) -> list[BenchmarkItem]:
    """MATH-500 (HuggingFaceH4/MATH-500 ``test.jsonl``): ``problem``, ``answer`` (LaTeX), ``unique_id``..."""
    items = []
    for where, obj in _records(path):
        q = _req_text(obj, "problem", where)
        a = _req_str(obj, "answer", where).strip()
        if not a:
            raise _bad(where, "answer", "is empty")
        uid = str(obj.get("unique_id") or f"math500/{len(items)}")
        meta = {"benchmark": "math500"}
        meta.update({k: obj[k] for k in ("solution", "subject", "level") if k in obj})
        items.append(BenchmarkItem(uid, q, a, "latex", meta))
    return items


def load_mbpp(path: str | Path) -> list[BenchmarkItem]:
    """MBPP (google-research ``mbpp.jsonl``): prompt is ``text``; tests and reference ``code`` in ``meta``.

    The sanitized layout (``prompt`` instead of ``text``, ``test_imports``) is accepted as well.
    """
    items = []
    for where, obj in _records(path):
        tid = _req_str(obj, "task_id", where)
        text = _req_text(obj, "text" if "text" in obj or "prompt" not in obj else "prompt", where)
        tests = _req(obj, "test_list", where)
        if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
            raise _bad(where, "test_list", "should be a list of strings")
        setup = obj.get("test_setup_code")
        if setup is None and obj.get("test_imports"):
            setup = "\n".join(obj["test_imports"])
        meta = {
            "benchmark": "mbpp",
            "test_list": list(tests),
            "test_setup_code": setup or "",
            "challenge_test_list": list(obj.get("challenge_test_list") or []),
            "code": obj.get("code", ""),
        }
        items.append(BenchmarkItem(tid, text, None, "code", meta))
    return items


LOADERS: dict[str, Callable[[str | Path], list[BenchmarkItem]]] = {
    "gsm8k": load_gsm8k,
    "aime": load_aime,
    "hmmt": load_hmmt,
    "gpqa": load_gpqa,
    "humaneval": load_humaneval,
    "mt_bench": load_mt_bench,
    "math500": load_math500,
    "mbpp": load_mbpp,
}
_ALIASES = {"gpqa_diamond": "gpqa", "math_500": "math500", "mtbench": "mt_bench", "human_eval": "humaneval"}


def load_benchmark(name: str, path: str | Path) -> list[BenchmarkItem]:
    """Load benchmark ``name`` (see ``LOADERS``; case and '-'/'_' are ignored) from the file at ``path``."""
    key = name.strip().lower().replace("-", "_")
    key = _ALIASES.get(key, key)
    if key not in LOADERS:
        raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(sorted(LOADERS))}")
    return LOADERS[key](path)


# --------------------------------------------------------------------------------------------- checking

# a number ("1,234", "-5", "18.00"); a minus is its sign only where no digit, letter, ")" or "." precedes
# it: in "75-2" or "2019-2020" it is an operator or a dash, and the last number is 2 / 2020, not -2 / -2020
_NUM = r"(?:(?<![\w).])-)?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)"
_NUMBER = re.compile(_NUM)
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


def _boxed_int(content: str) -> int | None:
    """Integer in a boxed answer: plain ("1,234") or the lone number amid units ("\\$18", "18 eggs");
    else, read more loosely (``_loose_int``), an equation's result or a whole fraction."""
    content = ascii_minus(content)
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
_ANSWER_NUMBER = re.compile(rf"(?i:answer)\s*(?:is|:)\s*(?::|-(?!\d))?\s*\**\s*\\?\$?\s*({_NUM})"
                            r"(?![\d,]|\.\d|\s*(?:[-+/×÷=^]|\*(?!\*)))")  # "**42**" is bold, not 42 times


def _gsm8k_fallback(completion: str) -> int | None:
    """GSM8K answers without a box: the last ``#### N``, else the last "answer is N", else the last number
    in the text (after "The answer is 7." a model may write on: "Step 3")."""
    completion = ascii_minus(completion)
    hashes = re.findall(r"####\s*\$?\s*(-?[\d,]*\d(?:\.\d+)?)", completion)
    if hashes:
        return _as_int(hashes[-1])
    stated = _ANSWER_NUMBER.findall(completion)
    if stated:
        return _as_int(stated[-1])
    nums = _NUMBER.findall(completion)
    return _as_int(nums[-1]) if nums else None


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
    option is B, because A and C are wrong." as C.
    """
    boxed = extract_boxed(completion)
    if boxed is not None:
        inner = re.sub(r"\\text\w*\{([^{}]*)\}", r"\1", boxed).strip().strip("*$ ")
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
