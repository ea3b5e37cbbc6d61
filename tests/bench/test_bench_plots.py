"""The engine and serve benchmarks' plots draw the numbers of their result JSON."""

from __future__ import annotations

from pathlib import Path

import pytest

from gambit.bench.bench_plots import plot_engine, plot_serve
from gambit.bench.serve import main as serve_main

PNG = b"\x89PNG\r\n\x1a\n"


def _engine_result(model: str, vllm: bool) -> dict:
    rows = [{"batch": 1, "native_tok_s": 37.0, "hf_tok_s": 19.0, "vllm_tok_s": 14.0 if vllm else None,
             "bound_tok_s": 38.1},
            {"batch": 16, "native_tok_s": 290.0, "hf_tok_s": 97.0, "vllm_tok_s": 146.0 if vllm else None},
            {"batch": 64, "native_tok_s": 275.0, "hf_tok_s": 182.0, "vllm_tok_s": 266.0 if vllm else None}]
    return {"rows": rows, "model": f"/somewhere/{model}", "machine": {"cpu": "a CPU"}}


def test_engine_plot_has_one_panel_per_model_and_skips_a_missing_backend(tmp_path: Path):
    out = tmp_path / "engine.png"
    drawn = plot_engine([_engine_result("smollm2", True), _engine_result("target", False)], out)
    assert out.read_bytes()[:8] == PNG
    assert [d["model"] for d in drawn] == ["smollm2", "target"]
    assert drawn[0]["series"]["vllm"] == [(1, 14.0), (16, 146.0), (64, 266.0)]
    assert drawn[0]["series"]["native"][1] == (16, 290.0) and drawn[0]["bound"] == 38.1
    assert "vllm" not in drawn[1]["series"]  # a run without vLLM draws no vLLM line


def _serve_result() -> dict:
    def conc(rates):
        return [{"runs": n, "runs_per_s": r, "p50_s": 0.1 * n, "p95_s": 0.2 * n}
                for n, r in zip((1, 4, 16), rates, strict=True)]

    return {"systems": {"embedded": {"concurrency": conc([5.0, 10.0, 20.0])},
                        "distributed": {"concurrency": conc([4.0, 9.0, 19.0])}},
            "engine_speedup": {"1": 1.0, "4": 1.5, "16": 2.0}, "scaling_efficiency": 2.375,
            "wall_ratio": 1.12, "wall_ratio_values": [1.0, 1.12, 1.3]}


def test_serve_plot_draws_rates_engine_speedup_and_every_pair(tmp_path: Path):
    out = tmp_path / "serve.png"
    drawn = plot_serve(_serve_result(), out)
    assert out.read_bytes()[:8] == PNG
    assert drawn["runs"] == [1, 4, 16]
    assert drawn["distributed"] == [4.0, 9.0, 19.0]
    assert drawn["engine"] == pytest.approx([5.0, 7.5, 10.0])  # the one-run embedded rate x engine speed-up
    assert drawn["ratios"] == [1.0, 1.12, 1.3]


def test_serve_plot_of_an_older_json_shows_the_median_alone(tmp_path: Path):
    res = _serve_result()
    del res["wall_ratio_values"], res["engine_speedup"]  # JSONs written before these fields
    drawn = plot_serve(res, tmp_path / "old.png")
    assert drawn["ratios"] == [1.12] and "engine" not in drawn


def test_serve_bench_help_names_the_plot_flag(capsys):
    with pytest.raises(SystemExit):
        serve_main(["--help"])
    assert "--plot" in capsys.readouterr().out


def test_vllm_lines_are_labelled_with_the_configuration_the_run_recorded():
    """Before stop 45 the bench's only vLLM ran fp32, eager; since then ``vllm`` is its defaults."""
    from gambit.bench.bench_plots import _vllm_label

    assert _vllm_label({"dtype": "float32", "enforce_eager": True}) == "vLLM-CPU (float32, eager)"
    assert _vllm_label({"dtype": "bfloat16", "enforce_eager": False}) == "vLLM-CPU (bfloat16, torch.compile)"
    assert _vllm_label(None) == "vLLM-CPU"
