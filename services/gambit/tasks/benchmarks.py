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

The checkers live in ``gambit.tasks.checking`` (integer reading in ``gambit.tasks.integers``) and the
file reading in ``gambit.tasks.records``; ``check_answer``, ``extract_choice`` and ``normalize_latex`` are
importable from here as well.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gambit.tasks.answers import parse_int
from gambit.tasks.checking import check_answer, extract_choice, normalize_latex
from gambit.tasks.records import _bad, _records, _req, _req_str, _req_text

__all__ = ["BenchmarkItem", "CHOICES", "KINDS", "LOADERS", "check_answer", "extract_choice", "load_aime",
           "load_benchmark", "load_gpqa", "load_gsm8k", "load_hmmt", "load_humaneval", "load_math500",
           "load_mbpp", "load_mt_bench", "normalize_latex"]

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
