"""The graded public benchmarks as problems for ``gambit eval`` and ``gambit run``.

``gambit.tasks.benchmarks`` loads the files and grades one completion. Search and majority voting need
one more thing: an *answer key* per completion, a normalised string two completions share exactly when
they give the same answer, so votes can be counted. ``answer_key(kind, text)``:

* ``boxed``: the last ``\\boxed{}`` as an integer, else its text (the shipped task's rule);
* ``integer``: the boxed integer, also the lone number amid units (``\\$18``, ``18 eggs``) (AIME);
* ``gsm8k``: the same, or, without a box, GSM8K's ``#### N`` or the last number;
* ``choice``: the letter A-D (``extract_choice``);
* ``latex``: the boxed LaTeX in a normal form (``latex_key``): a rational number in one spelling
  (``1,000`` / ``1000.0`` / ``1000``; ``\\dfrac12`` / ``1/2`` / ``0.5`` / ``\\frac{2}{4}``), without a
  unit or degree sign after a number or an ``x =`` before it, a list of roots in one order; else the
  textual normal form (``normalize_latex``). Other forms of one value (``\\sqrt{8}`` / ``2\\sqrt{2}``)
  still count as different answers; ``check_answer`` (math-verify) grades each against the gold, and so
  does a search run's verdict (``latex_right``), as ``gambit eval``.

The files sit in ``../shared/datasets/`` beside a checkout (``$GAMBIT_DATASETS`` elsewhere), or any
path given with ``--data``.
"""

from __future__ import annotations

import os
import random
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from gambit.paths import REPO
from gambit.tasks.answers import ascii_minus, extract_boxed, parse_int
from gambit.tasks.arithmetic import Problem, TaskConfig, generate
from gambit.tasks.benchmarks import _ALIASES, LOADERS, BenchmarkItem, load_benchmark
from gambit.tasks.checking import check_answer, extract_choice, normalize_latex
from gambit.tasks.integers import _boxed_int, _gsm8k_fallback

# name -> (loader, file in the datasets folder); only sets with an automatic checker
GRADED = {
    "gsm8k": ("gsm8k", "gsm8k_test.jsonl"),
    "aime25": ("aime", "aime_2025.jsonl"),
    "hmmt24": ("hmmt", "hmmt_2024.jsonl"),
    "hmmt25": ("hmmt", "hmmt_2025.jsonl"),
    "gpqa": ("gpqa", "gpqa_diamond.jsonl"),
}
ANSWER_KINDS = ("boxed", "integer", "gsm8k", "choice", "latex")
GRADED_ALIASES = {"aime": "aime25"}  # the one AIME set that ships
# loaders without a graded set here, and why
NOT_GRADED = {
    "humaneval": "has no automatic checker here (code needs its tests run in a sandbox)",
    "mbpp": "has no automatic checker here (code needs its tests run in a sandbox)",
    "mt_bench": "has no automatic checker (chat answers need a judge model)",
    "math500": "is not a graded set here: no copy ships in the datasets folder",
}


def check_answer_rule(rule: str) -> None:
    """A config's ``answer_rule``: one of ``ANSWER_KINDS`` ("" is left to the caller's default)."""
    if rule and rule not in ANSWER_KINDS:
        raise ValueError(f"answer_rule: unknown {rule!r}; one of {', '.join(ANSWER_KINDS)}")


def datasets_dir() -> Path:
    return Path(os.environ.get("GAMBIT_DATASETS") or REPO.parent / "shared" / "datasets")


def graded_name(name: str) -> str:
    """``name`` as ``GRADED`` spells it ("aime" is "aime25"); anything else unchanged."""
    return GRADED_ALIASES.get(name, name)


def check_benchmark(name: str, data: str = "") -> None:
    """A config's ``benchmark`` / ``data`` pair: a known name, and a file only with a name."""
    if name and graded_name(name) not in GRADED:
        key = name.strip().lower().replace("-", "_")
        key = _ALIASES.get(key, key)
        why = f"{key} {NOT_GRADED[key]}" if key in LOADERS and key in NOT_GRADED else f"unknown {name!r}"
        raise ValueError(f"benchmark: {why}; graded ones: {', '.join(GRADED)} ('' = the arithmetic task)")
    if data and not name:
        raise ValueError("data: names a benchmark file; give --benchmark too")


def load_graded(name: str, path: str = "") -> list[BenchmarkItem]:
    """Benchmark ``name``'s items from ``path`` ("" = its file in ``datasets_dir()``). A file with no
    items is refused: it scored a ZeroDivisionError in ``gambit eval`` and "solved 0/0" in ``gambit run``."""
    check_benchmark(name)
    name = graded_name(name)
    loader, fname = GRADED[name]
    file = Path(path) if path else datasets_dir() / fname
    if not file.is_file():
        why = "is a directory, not its JSONL file" if file.is_dir() else "does not exist"
        raise FileNotFoundError(f"{name}: {file} {why} (pass its JSONL with --data, or set "
                                "GAMBIT_DATASETS to the folder holding it)")
    items = load_benchmark(loader, file)
    if not items:
        raise ValueError(f"{name}: {file} holds no items")
    return items


def pick(items: list[BenchmarkItem], n: int, seed: int) -> list[BenchmarkItem]:
    """``n`` items (all of them when n exceeds the set), chosen by ``seed``, in file order."""
    if n >= len(items):
        return list(items)
    keep = sorted(random.Random(f"graded:{seed}").sample(range(len(items)), n))
    return [items[i] for i in keep]


def answer_kind(item: BenchmarkItem) -> str:
    if item.kind == "integer":
        return "gsm8k" if item.meta.get("benchmark") == "gsm8k" else "integer"
    if item.kind in ("choice", "latex"):
        return item.kind
    raise ValueError(f"{item.id}: {item.kind!r} items have no answer key (no automatic checker)")


# what math-verify reads as one value but the text normal form did not: a rational number however
# written, a unit or degree sign after it, "x =" before it, and a list's order (the checker's sets)
_THOUSANDS = re.compile(r"-?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?")
_RATIONAL = re.compile(r"(-?)(?:(\d+(?:\.\d*)?|\.\d+)|\\frac\{(-?\d+)\}\{(-?\d+)\}|\\frac(\d)(\d)"
                       r"|(-?\d+)/(-?\d+))")
# a unit word after a number: two letters at least ("2\\mathrm{i}" is a number, not 2 in units of i)
_UNIT = re.compile(r"\s*(?:\\(?:text|mbox|textrm|mathrm)\s*\{\s*[A-Za-z][A-Za-z .]*[A-Za-z]\s*\}"
                   r"|\^\s*\{?\\circ\}?|°)\s*$")
_AND = re.compile(r"\\text\s*\{\s*and\s*\}|\\quad\b|;")
_VARIABLE = re.compile(r"^[A-Za-z]=(?!.*=)")


def _rational_key(part: str) -> str | None:
    """A rational number's one spelling (``7``, ``-\\frac{1}{2}``), None when ``part`` is not one."""
    m = _RATIONAL.fullmatch(part)
    if m is None:
        return None
    sign, dec, *pairs = m.groups()
    try:  # ValueError: over the int-string digit limit (a model's runaway digits are no number here)
        if dec is not None:
            value = Fraction(dec)
        else:
            num, den = next((int(a), int(b)) for a, b in zip(pairs[::2], pairs[1::2], strict=True) if a)
            if den == 0:
                return None
            value = Fraction(num, den)
    except ValueError:
        return None
    value = -value if sign else value
    if value.denominator == 1:
        return str(value.numerator)
    return f"{'-' if value < 0 else ''}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


def _top_level(s: str, sep: str = ",") -> list[str]:
    """``s`` split at each ``sep`` outside braces, brackets and parentheses (a point ``(1,2)`` is one)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(s):
        if ch in "{[(":
            depth += 1
        elif ch in "}])":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(s[start:i])
            start = i + 1
    return parts + [s[start:]]


def latex_key(answer: str) -> str:
    """The vote key of a LaTeX answer: two spellings the checker takes for one value share it (module
    docstring). ``\\frac{24}{17}``, ``24/17`` and ``\\frac{48}{34}`` split HMMT votes three ways."""
    s = ascii_minus(answer).strip().strip("$").strip().rstrip(".")
    s = re.sub(r"(?<=\d)\\,(?=\d{3}\b)", ",", s).replace("{,}", ",")  # "7\\,521" / "7{,}521": 7521
    s = _AND.sub(",", re.sub(r"\\[,;:! ]", " ", s))  # a spacing command is no list separator
    if _THOUSANDS.fullmatch(s.strip()):  # one number ("7, 521" is a list, to the checker too)
        return _rational_key(s.strip().replace(",", "")) or s.strip()
    parts = []
    for raw in _top_level(s):
        while (m := _UNIT.search(raw)) and re.search(r"\d", raw[:m.start()]):
            raw = raw[:m.start()]  # "8\\sqrt{11} \\text{ cm}", "29^\\circ": the number is the answer
        parts.append(normalize_latex(raw))
    # "x =" goes only where one variable names every part (roots "x=1, x=2"): "x=1, y=2" and "x=2, y=1"
    # are different answers to the checker, and one key once both were "1,2"
    names = {m.group() if (m := _VARIABLE.match(p)) else None for p in parts}
    if len(names) == 1:
        parts = [_VARIABLE.sub("", p) for p in parts]
    keys = [_rational_key(p) or p for p in parts]
    return ",".join(sorted(keys)) if len(keys) > 1 else keys[0]


def answer_key(kind: str, text: str) -> str | None:
    """The normalised answer of a completion (module docstring), None when it gives none."""
    if kind == "choice":
        return extract_choice(text)
    boxed = extract_boxed(text)
    if kind == "latex":
        return None if boxed is None or not boxed.strip() else latex_key(boxed)
    if kind in ("integer", "gsm8k"):
        if boxed is not None:
            value = _boxed_int(boxed)
        else:
            value = _gsm8k_fallback(text) if kind == "gsm8k" else None
        return None if value is None else str(value)
    if kind == "boxed":
        value = parse_int(boxed)
        return boxed if value is None else str(value)
    raise ValueError(f"answer kind: unknown {kind!r}; one of {', '.join(ANSWER_KINDS)}")


def gold_key(item: BenchmarkItem) -> str:
    """The gold answer as ``answer_key`` writes a right answer."""
    kind = answer_kind(item)
    return latex_key(item.answer or "") if kind == "latex" else str(item.answer)


def latex_right(text: str, gold: str) -> bool:
    """Whether a completion's boxed LaTeX is the gold key's value by the checker (math-verify:
    ``1/576`` is ``\\frac{1}{576}``), not only by its key. A key equal to the gold passes too: the
    checker falls back to the normal form."""
    return check_answer(BenchmarkItem("gold", "", gold, "latex"), text)


@dataclass(frozen=True)
class GradedProblem:
    """A benchmark item as the search driver takes a problem: ``prompt`` (formatted for the model)
    and ``answer`` (the gold key)."""

    item: BenchmarkItem
    prompt: str
    answer: str


def graded_problems(name: str, data: str, model: str, n: int, seed: int) -> list[GradedProblem]:
    """``n`` of benchmark ``name``'s questions (``pick``), each in ``model``'s prompt format (a chat
    model's template asking for a boxed answer, as the served Target formats a problem)."""
    from gambit.serving.prompt_format import problem_formatter

    fmt = problem_formatter(model)
    return [GradedProblem(it, fmt(it.prompt), gold_key(it)) for it in pick(load_graded(name, data), n, seed)]


def check_readable(problems, tokenizer, max_len: int = 0) -> None:
    """Every prompt encodes in the model's vocabulary (a benchmark question may not, on a character
    model) and, with ``max_len`` (the engine's context), leaves room for a generated token: said before
    any work starts, naming the question (the engine's own error named none, mid-evaluation)."""
    for p in problems:
        name = p.item.id if isinstance(p, GradedProblem) else "problem"
        ids = tokenizer.encode_checked(p.prompt, name)
        if max_len and len(ids) >= max_len:
            raise ValueError(f"{name}: prompt has {len(ids)} tokens; the context holds {max_len} "
                             "including at least one generated token")


@dataclass(frozen=True)
class TaskProblem:
    """A task problem in a chat model's prompt format (``task_problems``); the rest is the problem's
    (``answer``, ``n_ops``, ``solution``, ``expr``)."""

    problem: Problem
    prompt: str

    def __getattr__(self, name: str):
        if name.startswith("__") or name == "problem":  # copy/pickle probe before ``problem`` is set
            raise AttributeError(name)
        return getattr(self.problem, name)


def task_problems(model: str, split: str, n: int, seed: int, task: TaskConfig) -> list:
    """The task's problems as ``model`` reads them, as the served Target formats a client's "Compute X.":
    the shipped target's own format (the problems as generated), or a chat model's template asking for a
    boxed answer (a chat model given the bare task format writes on past it, with no box to vote on)."""
    from gambit.serving.prompt_format import problem_formatter, task_prompt

    problems = generate(split, n, seed, task)
    fmt = problem_formatter(model)
    if fmt is task_prompt:
        return problems
    return [TaskProblem(p, fmt(p.question)) for p in problems]
