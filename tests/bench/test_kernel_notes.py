"""A bench that timed the engine without its C++ CPU kernels says so in its notes and under its table:
a child that lost a kernel-build race to another process once measured the PyTorch path, and the
result read as usual ("notes": ["vLLM skipped"])."""

from __future__ import annotations

import pytest

from gambit.bench import engine, kernel_note
from gambit.engine import cpu_attention


@pytest.fixture
def kernels(monkeypatch):
    """Set the kernels' load state: "loaded", "failed" or "never asked" (a CUDA run)."""
    def set_(state: str) -> None:
        monkeypatch.setattr(cpu_attention, "_module", object() if state == "loaded" else None)
        monkeypatch.setattr(cpu_attention, "_failed", state == "failed")
    return set_


def test_the_note_says_when_the_kernels_did_not_load_and_why(kernels, monkeypatch):
    monkeypatch.delenv("GAMBIT_NO_CPU_KERNEL", raising=False)
    kernels("loaded")
    assert kernel_note.cpu_kernels_note() == ""
    kernels("never asked")
    assert kernel_note.cpu_kernels_note() == ""
    kernels("failed")
    note = kernel_note.cpu_kernels_note()
    assert "C++ CPU kernels did not load" in note and "PyTorch path" in note and "see the warning" in note
    monkeypatch.setenv("GAMBIT_NO_CPU_KERNEL", "1")
    assert "GAMBIT_NO_CPU_KERNEL is set" in kernel_note.cpu_kernels_note()


def test_the_engine_bench_gathers_its_childrens_notes():
    note = "the C++ CPU kernels did not load (x): these figures are the slower PyTorch path's"
    rounds = {"native": [[{"batch": 1, "tok_s": 5.0, "kernel_note": note}], None],
              "native_bf16": [[{"batch": 1, "tok_s": 6.0, "kernel_note": ""}]],
              "hf": [[{"batch": 1, "tok_s": 4.0}]]}
    fork = {"fork_ms": 1.0, "kernel_note": note}
    assert engine.kernel_notes(rounds, fork) == [f"native fp32, fork: {note}"]
    assert engine.kernel_notes({"native": [[{"batch": 1, "kernel_note": ""}]]}, None) == []
    # the note is a string: the medians over rounds skip it
    assert "kernel_note" not in engine._median_rows(rounds["native"])[0]


def test_the_engine_bench_table_prints_the_note(tiny_engine_result):
    table = engine.format_table(tiny_engine_result)
    assert "note: native fp32: the C++ CPU kernels did not load" in table


@pytest.fixture
def tiny_engine_result() -> dict:
    return {"rows": [{"batch": 1, "native_tok_s": 10.0}], "model": "m", "new_tokens": 4, "temperature": 0.8,
            "weight_bytes": 1, "bandwidth_gbs": 1.0,
            "notes": ["native fp32: the C++ CPU kernels did not load (x): these figures are the slower "
                      "PyTorch path's"]}


def test_spec_and_search_tables_print_their_notes():
    from gambit.bench.search_report import format_tables

    out = {"by_difficulty": {}, "targets": [], "config": {"capacity": 4},
           "notes": ["the C++ CPU kernels did not load (x)"]}
    assert format_tables(out).endswith("note: the C++ CPU kernels did not load (x)")
