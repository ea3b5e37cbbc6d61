"""Benchmark loaders and answer checkers, against the real files in ../shared/datasets/."""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path

import pytest

from gambit.tasks.benchmarks import (
    LOADERS,
    BenchmarkItem,
    check_answer,
    extract_choice,
    load_benchmark,
)

DATA = Path(__file__).resolve().parents[3] / "shared" / "datasets"

FILES = {
    "gsm8k": ("gsm8k", "gsm8k_test.jsonl", 1319),
    "aime_2025": ("aime", "aime_2025.jsonl", 30),
    "hmmt_2024": ("hmmt", "hmmt_2024.jsonl", 30),
    "hmmt_2025": ("hmmt", "hmmt_2025.jsonl", 30),
    "gpqa_diamond": ("gpqa", "gpqa_diamond.jsonl", 198),
    "humaneval": ("humaneval", "humaneval.jsonl", 164),
    "mt_bench": ("mt_bench", "mt_bench_questions.jsonl", 80),
}
GRADED = ["gsm8k", "aime_2025", "hmmt_2024", "hmmt_2025", "gpqa_diamond"]

real_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"shared datasets not found at {DATA}")


@cache
def real(key: str) -> list[BenchmarkItem]:
    name, fname, _ = FILES[key]
    return load_benchmark(name, DATA / fname)


def by_answer(key: str, answer: str) -> BenchmarkItem:
    return next(it for it in real(key) if it.answer == answer)


def write_jsonl(path: Path, rows: list[dict | str]) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


# ------------------------------------------------------------------------------------------- real files


@real_data
@pytest.mark.parametrize("key", list(FILES))
def test_counts_and_kinds(key: str) -> None:
    name, _, n = FILES[key]
    items = real(key)
    assert len(items) == n
    assert len({it.id for it in items}) == n
    kind = {"gsm8k": "integer", "aime": "integer", "hmmt": "latex", "gpqa": "choice"}.get(name)
    kind = kind or {"humaneval": "code", "mt_bench": "chat"}[name]
    assert all(it.kind == kind and it.prompt.strip() for it in items)


@real_data
@pytest.mark.parametrize("key", GRADED)
def test_every_gold_answer_checks(key: str) -> None:
    done = "Working... so the answer is \\boxed{{{}}}"
    bad = [it.id for it in real(key) if not check_answer(it, done.format(it.answer))]
    assert bad == []


@real_data
@pytest.mark.parametrize("key", GRADED)
def test_wrong_answers_rejected(key: str) -> None:
    for it in real(key):
        assert it.answer is not None
        if it.kind == "integer":
            wrong = str(int(it.answer) + 1)
        elif it.kind == "choice":
            wrong = "ABCD"[("ABCD".index(it.answer) + 1) % 4]
        else:
            wrong = f"{it.answer}+1"
        assert not check_answer(it, f"so \\boxed{{{wrong}}}"), (it.id, wrong)
        assert not check_answer(it, "I could not solve it."), it.id


@real_data
def test_known_items() -> None:
    gsm, aime = real("gsm8k"), real("aime_2025")
    assert gsm[0].answer == "18" and gsm[0].prompt.startswith("Janet")
    assert "#### 18" in gsm[0].meta["solution"]
    assert aime[0].answer == "70" and "17_b" in aime[0].prompt
    # GSM8K golds with thousands separators are stored as plain integers.
    assert any("#### 1,450,000" in it.meta["solution"] and it.answer == "1450000" for it in gsm)
    assert all("," not in it.answer for it in gsm)
    assert any(it.answer == "-10" for it in gsm)
    assert real("hmmt_2024")[3].answer == "\\dfrac{24}{17}"
    assert {it.answer for it in real("gpqa_diamond")} == set("ABCD")

    he = real("humaneval")[0]
    assert he.id == "HumanEval/0" and he.answer is None
    assert he.meta["entry_point"] == "has_close_elements" and "def check(" in he.meta["test"]
    ns: dict = {}
    exec(he.prompt + he.meta["canonical_solution"] + "\n" + he.meta["test"], ns)  # the layout is runnable
    ns["check"](ns[he.meta["entry_point"]])

    mt = real("mt_bench")
    assert mt[0].id == "81" and mt[0].meta["category"] == "writing"
    assert mt[0].prompt == mt[0].meta["turns"][0] and len(mt[0].meta["turns"]) == 2
    assert sum("reference" in it.meta for it in mt) == 39


@real_data
def test_gsm8k_fallbacks() -> None:
    it = real("gsm8k")[0]  # gold 18
    assert check_answer(it, "She makes $18 a day.\n#### 18")
    assert check_answer(it, "16 - 3 - 4 = 9 eggs, 9 * 2 = 18")
    assert check_answer(it, "The answer is $18.00.")
    assert check_answer(it, "so \\boxed{\\$18}")
    assert not check_answer(it, "\\boxed{17}. Hmm, maybe 18")  # the box wins over later numbers
    assert not check_answer(it, "#### 17")
    big = next(x for x in real("gsm8k") if x.answer == "1450000")
    assert check_answer(big, "Total: 1,450,000 dollars")
    assert check_answer(big, "\\boxed{1,450,000}")
    assert not check_answer(big, "Total: 1,450 dollars")


@real_data
def test_aime_needs_a_box() -> None:
    it = real("aime_2025")[0]
    assert check_answer(it, "\\boxed{070}")
    assert not check_answer(it, "the answer is 70")


@real_data
def test_latex_equivalence_on_real_hmmt() -> None:
    BIG = 2**25 * math.factorial(26)
    cases = [
        ("hmmt_2024", "\\dfrac{1}{512}", ["\\frac{1}{512}", "1/512", "0.001953125", "2^{-9}"], ["1/256"]),
        ("hmmt_2024", "8\\sqrt{11}", ["\\sqrt{704}"], ["8\\sqrt{10}", "704"]),
        ("hmmt_2024", "64(2-\\sqrt{3})", ["128-64\\sqrt{3}"], ["128+64\\sqrt{3}"]),
        ("hmmt_2025", "\\frac{9 \\sqrt{23}}{23}", ["\\frac{9}{\\sqrt{23}}"], ["\\frac{9}{23}"]),
        ("hmmt_2025", "1-\\frac{2}{\\pi}", ["\\frac{\\pi-2}{\\pi}"], ["1-\\frac{1}{\\pi}"]),
        ("hmmt_2025", "2^{25} \\cdot 26!", [str(BIG)], [str(BIG + 1), "2^{25} \\cdot 25!"]),
        (
            "hmmt_2025",
            "\\frac{-1+\\sqrt{17}}{2}, \\frac{-1-\\sqrt{17}}{2}",
            ["\\frac{-1-\\sqrt{17}}{2}, \\frac{-1+\\sqrt{17}}{2}"],  # order of roots does not matter
            ["\\frac{-1+\\sqrt{17}}{2}"],  # but all of them are needed
        ),
        ("hmmt_2024", "0,i\\sqrt{6},-i\\sqrt{6}", ["\\pm i\\sqrt{6}, 0"], ["0, \\sqrt{6}, -\\sqrt{6}"]),
    ]
    for key, gold, good, wrong in cases:
        it = by_answer(key, gold)
        for p in good:
            assert check_answer(it, f"... \\boxed{{{p}}}"), (gold, p)
        for p in wrong:
            assert not check_answer(it, f"... \\boxed{{{p}}}"), (gold, p)


def test_latex_equivalence_synthetic() -> None:
    half = BenchmarkItem("t/0", "q", "\\frac{1}{2}", "latex")
    assert check_answer(half, "\\boxed{0.5}")
    assert check_answer(half, "\\boxed{\\dfrac12}")
    assert not check_answer(half, "so it is $\\frac{2}{4}$")  # no box, no answer (as AIME): see below
    assert not check_answer(half, "\\boxed{2}")
    assert not check_answer(half, "\\boxed{}")
    root = BenchmarkItem("t/1", "q", "2\\sqrt{3}", "latex")
    assert check_answer(root, "\\boxed{\\sqrt{12}}")
    assert not check_answer(root, "\\boxed{12}")
    # Text answers math-verify cannot turn into math fall back to normalised string equality.
    name = BenchmarkItem("t/2", "q", "\\text{Evelyn}", "latex")
    assert check_answer(name, "\\boxed{\\text{Evelyn}}")
    assert check_answer(name, "\\boxed{Evelyn}")
    assert not check_answer(name, "\\boxed{Bob}")


@pytest.mark.parametrize(
    "completion, letter",
    [
        ("\\boxed{C}", "C"),
        ("\\boxed{\\text{(C)}}", "C"),
        ("\\boxed{C. 42 km}", "C"),
        ("The answer is (B).", "B"),
        ("Answer: **D**", "D"),
        ("Both fit, but I pick A", "A"),
        ("the answer is a planet", None),
        ("no idea", None),
    ],
)
def test_extract_choice(completion: str, letter: str | None) -> None:
    assert extract_choice(completion) == letter


def test_choice_check() -> None:
    it = BenchmarkItem("g/0", "q", "B", "choice")
    assert check_answer(it, "Reasoning...\nThe answer is \\boxed{B}")
    assert not check_answer(it, "Reasoning...\nThe answer is \\boxed{A}")
    assert not check_answer(it, "")


@real_data
def test_code_and_chat_have_no_checker() -> None:
    for key in ("humaneval", "mt_bench"):
        with pytest.raises(ValueError, match="no automatic checker"):
            check_answer(real(key)[0], "anything")


# --------------------------------------------------------------------------- published layouts (tmp files)

MATH500_ROWS = [
    {
        "problem": "Convert the point $(0,3)$ in rectangular coordinates to polar coordinates.  Enter your "
        "answer in the form $(r,\\theta),$ where $r > 0$ and $0 \\le \\theta < 2 \\pi.$",
        "solution": "We have that $r = \\sqrt{0^2 + 3^2} = 3.$ ... "
        "$\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.$",
        "answer": "\\left( 3, \\frac{\\pi}{2} \\right)",
        "subject": "Precalculus",
        "level": 2,
        "unique_id": "test/precalculus/807.json",
    },
    {
        "problem": "What is the value of $513^2 - 487^2$?",
        "solution": "$(513+487)(513-487) = 1000 \\cdot 26 = \\boxed{26000}$.",
        "answer": "26000",
        "subject": "Algebra",
        "level": 1,
        "unique_id": "test/algebra/2592.json",
    },
    {
        "problem": "Who has the greatest average speed?",
        "solution": "... $\\boxed{\\text{Evelyn}}$.",
        "answer": "\\text{Evelyn}",
        "subject": "Algebra",
        "level": 2,
        "unique_id": "test/algebra/1349.json",
    },
]


def test_math500_layout(tmp_path: Path) -> None:
    f = write_jsonl(tmp_path / "test.jsonl", [*MATH500_ROWS[:2], "", MATH500_ROWS[2]])
    items = load_benchmark("MATH-500", f)
    assert [it.id for it in items] == [r["unique_id"] for r in MATH500_ROWS]
    assert all(it.kind == "latex" for it in items)
    assert items[0].meta["subject"] == "Precalculus" and items[0].meta["level"] == 2
    for it, row in zip(items, MATH500_ROWS, strict=True):
        assert it.prompt == row["problem"]
        assert check_answer(it, f"\\boxed{{{row['answer']}}}")
        assert check_answer(it, row["solution"])  # the published solution ends in the boxed answer
    assert check_answer(items[0], "\\boxed{(3, \\pi/2)}")
    assert not check_answer(items[0], "\\boxed{(3, \\pi)}")
    assert check_answer(items[1], "\\boxed{26,000}")
    assert not check_answer(items[1], "\\boxed{26001}")


MBPP_ROW = {
    "text": "Write a function to find the shared elements from the given two lists.",
    "code": "def similar_elements(test_tup1, test_tup2):\r\n"
    "  res = tuple(set(test_tup1) & set(test_tup2))\r\n  return (res) ",
    "task_id": 2,
    "test_setup_code": "",
    "test_list": [
        "assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))",
        "assert set(similar_elements((1, 2, 3, 4),(5, 4, 3, 7))) == set((3, 4))",
    ],
    "challenge_test_list": [],
}


def test_mbpp_layout(tmp_path: Path) -> None:
    second = {**MBPP_ROW, "task_id": 3, "challenge_test_list": ["assert True"]}
    items = load_benchmark("mbpp", write_jsonl(tmp_path / "mbpp.jsonl", [MBPP_ROW, second]))
    it = items[0]
    assert (it.id, it.prompt, it.answer, it.kind) == ("2", MBPP_ROW["text"], None, "code")
    assert it.meta["test_list"] == MBPP_ROW["test_list"] and it.meta["test_setup_code"] == ""
    assert items[1].meta["challenge_test_list"] == ["assert True"]
    ns: dict = {}
    exec(it.meta["test_setup_code"] + "\n" + it.meta["code"] + "\n" + "\n".join(it.meta["test_list"]), ns)
    with pytest.raises(ValueError, match="no automatic checker"):
        check_answer(it, it.meta["code"])


def test_mbpp_sanitized_json_array(tmp_path: Path) -> None:
    row = {"source_file": "x", "task_id": 2, "prompt": MBPP_ROW["text"], "code": MBPP_ROW["code"],
           "test_imports": [], "test_list": MBPP_ROW["test_list"]}  # fmt: skip
    f = tmp_path / "sanitized-mbpp.json"
    f.write_text(json.dumps([row]))
    (it,) = load_benchmark("mbpp", f)
    assert it.prompt == MBPP_ROW["text"] and it.meta["test_list"] == MBPP_ROW["test_list"]


# ------------------------------------------------------------------------------------------- bad input


def test_not_json_names_file_and_line(tmp_path: Path) -> None:
    rows = [{"question": "q", "answer": "1"}, "", '{"question": "q", "ans']
    f = write_jsonl(tmp_path / "broken.jsonl", rows)
    with pytest.raises(ValueError, match=r"broken\.jsonl line 3: not valid JSON"):
        load_benchmark("aime", f)


def test_missing_field_names_file_line_and_field(tmp_path: Path) -> None:
    f = write_jsonl(tmp_path / "noanswer.jsonl", [{"question": "q", "answer": "1"}, "", {"question": "q2"}])
    with pytest.raises(ValueError, match=r"noanswer\.jsonl line 3: missing field 'answer'"):
        load_benchmark("hmmt", f)
    f = write_jsonl(tmp_path / "math.jsonl", [{**MATH500_ROWS[0], "problem": None}])
    with pytest.raises(ValueError, match=r"math\.jsonl line 1: missing field 'problem'"):
        load_benchmark("math500", f)
    f = write_jsonl(tmp_path / "mb.jsonl", [{k: v for k, v in MBPP_ROW.items() if k != "test_list"}])
    with pytest.raises(ValueError, match=r"mb\.jsonl line 1: missing field 'test_list'"):
        load_benchmark("mbpp", f)
    f = write_jsonl(tmp_path / "mt.jsonl", [{"question_id": 1, "category": "x", "turns": []}])
    with pytest.raises(ValueError, match=r"mt\.jsonl line 1: field 'turns'"):
        load_benchmark("mt_bench", f)


@pytest.mark.parametrize(
    "name, row, needle",
    [
        ("gsm8k", {"question": "q", "answer": "It is 5."}, "'####"),
        ("aime", {"question": "q", "answer": "\\frac{1}{2}"}, "not an integer"),
        ("gpqa", {"question": "q", "answer": "E"}, "A/B/C/D"),
        ("gsm8k", ["not", "an", "object"], "JSON object"),
    ],
)
def test_bad_answers(tmp_path: Path, name: str, row: dict, needle: str) -> None:
    f = write_jsonl(tmp_path / "bad.jsonl", [row])
    with pytest.raises(ValueError, match=r"bad\.jsonl line 1") as e:
        load_benchmark(name, f)
    assert needle in str(e.value)


def test_blank_lines_skipped(tmp_path: Path) -> None:
    rows = ["", {"question": "q1", "answer": "#### 1,234"}, "  ", {"question": "q2", "answer": "#### -3"}]
    items = load_benchmark("gsm8k", write_jsonl(tmp_path / "g.jsonl", rows))
    assert [it.answer for it in items] == ["1234", "-3"]
    (aime,) = load_benchmark("aime", write_jsonl(tmp_path / "aime.jsonl", [{"question": "q", "answer": 7}]))
    assert aime.answer == "7"  # numeric answers are accepted


def test_missing_file_and_unknown_name(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_benchmark("gsm8k", missing)
    with pytest.raises(ValueError, match="unknown benchmark 'mmlu'") as e:
        load_benchmark("mmlu", missing)
    assert all(n in str(e.value) for n in LOADERS)


def test_item_is_frozen_and_kind_checked() -> None:
    it = BenchmarkItem("a", "p", "1", "integer", {"x": 1})
    same = BenchmarkItem("a", "p", "1", "integer")  # meta is not part of equality or the hash
    assert it == same and hash(it) == hash(same)
    with pytest.raises(AttributeError):
        it.answer = "2"  # type: ignore[misc]
    with pytest.raises(ValueError, match="unknown kind"):
        BenchmarkItem("a", "p", "1", "essay")


@pytest.mark.parametrize("line, needle", [
    ('{"question": "q", "answer": ' + "1" * 5000 + "}", "Exceeds the limit (4300 digits)"),
    ("[" * 100_000, "nested too deeply"),
])
def test_unreadable_json_names_file_and_line(tmp_path: Path, line: str, needle: str) -> None:
    """A number over the digit limit raised a bare ValueError, deep nesting a RecursionError: no file."""
    f = write_jsonl(tmp_path / "odd.jsonl", [{"question": "q", "answer": "1"}, line])
    with pytest.raises(ValueError, match=r"odd\.jsonl line 2: not readable JSON") as e:
        load_benchmark("aime", f)
    assert needle in str(e.value) and "set_int_max_str_digits" not in str(e.value)
    f.with_suffix(".json").write_text(line)
    with pytest.raises(ValueError, match=r"odd\.json: not readable JSON"):
        load_benchmark("mbpp", f.with_suffix(".json"))


@pytest.mark.parametrize("name, row, field", [
    ("gsm8k", {"question": " ", "answer": "#### 1"}, "question"),
    ("aime", {"question": "", "answer": "1"}, "question"),
    ("hmmt", {"question": "\n", "answer": "1"}, "question"),
    ("gpqa", {"question": "", "answer": "A"}, "question"),
    ("math500", {"problem": "", "answer": "1"}, "problem"),
    ("mt_bench", {"question_id": 1, "category": "x", "turns": ["hi", " "]}, "turns"),
])
def test_a_blank_question_is_refused(tmp_path: Path, name: str, row: dict, field: str) -> None:
    """It loaded, and the model was sent an empty prompt."""
    f = write_jsonl(tmp_path / "blank.jsonl", [row])
    with pytest.raises(ValueError, match=rf"blank\.jsonl line 1: field '{field}'"):
        load_benchmark(name, f)
