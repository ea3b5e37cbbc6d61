"""A benchmark file that cannot be the set named is refused in one line naming the file: empty, not
UTF-8, another set's layout; and a set name that is not graded says why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gambit.tasks.benchmarks import load_benchmark
from gambit.tasks.graded import GRADED, check_benchmark, graded_name, load_graded


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_an_empty_file_is_refused(tmp_path):
    """`gambit eval` divided by zero after the model loaded; `gambit run` said "solved 0/0"."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    for name in GRADED:
        with pytest.raises(ValueError, match=f"{name}: {empty} holds no items"):
            load_graded(name, str(empty))


def test_a_file_that_is_not_utf8_is_named(tmp_path):
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"question": "caf\xe9", "answer": "#### 1"}\n')
    with pytest.raises(ValueError, match=rf"{latin}: not UTF-8 text \(byte 0xe9 at offset 17\)"):
        load_benchmark("gsm8k", latin)


def test_a_byte_order_mark_is_read_past(tmp_path):
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps({"question": "q", "answer": "#### 4"}).encode() + b"\n")
    (it,) = load_benchmark("gsm8k", bom)
    assert it.answer == "4" and it.prompt == "q"


def test_hmmt_refuses_a_gsm8k_or_gpqa_file(tmp_path):
    """Both loaded as HMMT and scored 0% against solution texts or letters, with no error."""
    gsm = write(tmp_path / "g.jsonl", [{"question": "q", "answer": "3 + 4 = 7\n#### 7"}])
    with pytest.raises(ValueError, match="line 1: field 'answer' is a worked solution"):
        load_graded("hmmt24", str(gsm))
    gpqa = write(tmp_path / "c.jsonl", [{"question": "q1", "answer": "A"}, {"question": "q2", "answer": "C"}])
    with pytest.raises(ValueError, match="every answer is a letter A-D"):
        load_graded("hmmt25", str(gpqa))
    mixed = write(tmp_path / "h.jsonl", [{"question": "q1", "answer": "B"},
                                         {"question": "q2", "answer": "12"}])
    assert [it.answer for it in load_graded("hmmt24", str(mixed))] == ["B", "12"]  # one letter answer is fine


@pytest.mark.parametrize("name, why", [
    ("humaneval", "humaneval has no automatic checker here (code needs its tests run in a sandbox)"),
    ("HumanEval", "humaneval has no automatic checker here"),
    ("mt-bench", "mt_bench has no automatic checker (chat answers need a judge model)"),
    ("mbpp", "mbpp has no automatic checker here"),
    ("math500", "math500 is not a graded set here"),
    ("gsm9k", "unknown 'gsm9k'"),
])
def test_a_set_without_a_checker_says_why(name, why):
    """It read "unknown 'humaneval'" while the file ships beside the others and has a loader."""
    with pytest.raises(ValueError, match="graded ones: gsm8k") as e:
        check_benchmark(name)
    assert f"benchmark: {why}" in str(e.value)


def test_aime_is_aime25():
    check_benchmark("aime")
    assert graded_name("aime") == "aime25" and graded_name("gsm8k") == "gsm8k"
    from gambit.bench.eval import EvalConfig
    from gambit.run import RunConfig

    assert EvalConfig(benchmark="aime").benchmark == "aime25" == RunConfig(benchmark="aime").benchmark
