"""Smoke test of ``gambit bench engine``: native + HF parts on a tiny model, no vLLM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from bench_util import refused_before

from gambit.model import CausalLM, ModelConfig, build_char_tokenizer, save_model

pytest.importorskip("transformers")


@pytest.fixture
def tiny_folder(tmp_path: Path) -> Path:
    tok = build_char_tokenizer()
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
                      tie_word_embeddings=True, bos_token_id=tok.bos_id, eos_token_id=tok.eos_ids[0],
                      pad_token_id=tok.pad_id)
    torch.manual_seed(0)
    folder = tmp_path / "tiny"
    save_model(CausalLM(cfg).eval(), tok, folder)
    return folder


def test_engine_bench_smoke(tiny_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gambit.bench.engine import run_engine_bench
    from gambit.bench.engine_report import format_table
    from gambit.engine.linear import bf16_gemm_available

    monkeypatch.setenv("GAMBIT_NO_CPU_KERNEL", "1")  # the children skip compiling the C++ kernel

    out = tmp_path / "bench.json"
    result = run_engine_bench(tiny_folder, [1, 2], quick=True, json_path=out, new_tokens=4, vllm=False,
                              fork_tokens=200, native_dtypes=("float32", "bfloat16", "bfloat16+kv"))
    data = json.loads(out.read_text())
    assert data == json.loads(json.dumps(result))
    assert data["new_tokens"] == 4 and data["model"] == str(tiny_folder.resolve())
    assert [r["batch"] for r in data["rows"]] == [1, 2]
    bf16 = bf16_gemm_available()  # else the bench skips its bf16 columns and says so (AVX2-only CPUs)
    for r in data["rows"]:
        for key in ("native_tok_s", "native_bf16_tok_s", "native_bf16kv_tok_s", "hf_tok_s", "native_vs_hf",
                    "native_peak_mb", "native_bf16_peak_mb", "native_bf16kv_peak_mb", "hf_peak_mb"):
            if bf16 or "bf16" not in key:
                assert r[key] > 0, key
            else:
                assert r[key] is None, key
        assert r["vllm_tok_s"] is None and r["native_vs_vllm"] is None and r["vllm_peak_mb"] is None
        assert r["vllm_fp32_tok_s"] is None and r["native_bf16_vs_vllm"] is None
    assert bf16 or "native bfloat16, bfloat16+kv skipped: no oneDNN bfloat16 GEMM" in " ".join(data["notes"])
    fk = data["fork_vs_prefill"]
    assert fk["tokens"] == 200 and fk["fork_ms"] > 0 and fk["prefill_ms"] > 0 and fk["ratio"] > 0
    assert {"cpu", "cores", "torch"} <= set(data["machine"])
    assert "vLLM skipped" in data["notes"]
    # the children ran without the C++ kernels (switched off above): the result says so, and the table
    kernels = "the C++ CPU kernels did not load (GAMBIT_NO_CPU_KERNEL is set)"
    assert any(n.startswith("native fp32") and kernels in n and "fork" in n for n in data["notes"])
    assert kernels in format_table(data)
    table = format_table(data)
    assert "native fp32 tok/s" in table
    assert not bf16 or "native bf16 tok/s" in table and "native bf16+kv tok/s" in table
    assert "vLLM" not in table.split("note")[0]
    assert data["bandwidth_gbs"] > 0 and data["weight_bytes"] > 0
    one = data["rows"][0]
    assert one["bound_tok_s"] == pytest.approx(data["bandwidth_gbs"] * 1e9 / data["weight_bytes"])
    assert one["native_vs_bound"] == pytest.approx(one["native_tok_s"] / one["bound_tok_s"])
    # bfloat16 reads half the bytes: its bound is twice the fp32 folder's
    assert one["bound_16bit_tok_s"] == pytest.approx(2 * one["bound_tok_s"])
    if bf16:
        bf16_ratio = one["native_bf16_tok_s"] / one["bound_16bit_tok_s"]
        assert one["native_bf16_vs_bound"] == pytest.approx(bf16_ratio)
    assert "bandwidth bound" in format_table(data)



def test_a_missing_vllm_venv_is_said_once(tiny_folder: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Without `.venv-vllm` each vLLM configuration printed the same note, and "vLLM skipped" after them."""
    from gambit.bench import engine
    from gambit.bench.engine import run_engine_bench

    monkeypatch.setattr(engine, "_child", lambda *a, **k: (None, "not run here"))  # the native children

    result = run_engine_bench(tiny_folder, [1], quick=True, new_tokens=2, fork_tokens=20,
                              vllm_python=tmp_path / "nope" / "python")
    assert [n for n in result["notes"] if "vLLM" in n] == [
        f"vLLM not measured: {tmp_path / 'nope' / 'python'} is missing; run `make vllm-venv`"]

def test_rounds_reduce_to_medians_with_spread():
    from gambit.bench.engine_backends import weight_bytes
    from gambit.bench.engine_report import _median_rows

    rounds = [[{"batch": 1, "tok_s": 10.0, "peak_mb": 5}, {"batch": 4, "tok_s": 40.0, "peak_mb": 9}],
              None,  # a failed round is skipped
              [{"batch": 1, "tok_s": 14.0, "peak_mb": 7}, {"batch": 4, "tok_s": 20.0, "peak_mb": 9}],
              [{"batch": 1, "tok_s": 11.0, "peak_mb": 6}]]
    rows = _median_rows(rounds)
    assert rows[0] == {"batch": 1, "tok_s": 11.0, "peak_mb": 6, "rounds": 3, "tok_s_min": 10.0,
                       "tok_s_max": 14.0}
    assert rows[1]["tok_s"] == 30.0 and rows[1]["rounds"] == 2
    assert _median_rows([None, []]) is None
    assert weight_bytes(Path(__file__).parent) == 0  # no safetensors here


def test_weight_bytes_counts_every_tensor(tiny_folder: Path):
    from gambit.bench.engine_backends import weight_bytes
    from gambit.model import load_model

    model, _ = load_model(tiny_folder)
    assert weight_bytes(tiny_folder) == 4 * sum(p.numel() for p in model.parameters())


def test_prompts_are_encoded_by_the_tokenizer_the_engine_loads(tiny_folder: Path):
    """make_prompts built its tokenizer by hand (config.json + tokenizer.json): a model named by a
    string failed with a TypeError (``str / str``), and a missing folder was no "model folder" error."""
    from gambit.bench.engine_backends import make_prompts
    from gambit.model.loader import load_tokenizer
    from gambit.tasks.arithmetic import generate

    tok = load_tokenizer(tiny_folder)
    prompts = make_prompts(str(tiny_folder), 2)
    assert prompts == [tok.encode(p.prompt) for p in generate("test", 2, 0)]
    assert prompts[0][0] == tok.bos_id
    assert len(make_prompts(tiny_folder, 1, long_tokens=300)[0]) == 300
    with pytest.raises(FileNotFoundError, match="model folder does not exist"):
        make_prompts(tiny_folder.parent / "none", 1)


def test_linears_bench_times_every_backend_at_every_shape():
    from gambit.bench.linears import measure
    from gambit.paths import TARGET

    r = measure(str(TARGET), rows=[1, 3], repeats=1, threads=1, calls=1)
    assert len(r["us"]) == 5 * 2  # q/k/v, o, gate/up, down, head × rows
    for times in r["us"].values():
        assert {"row-major F.linear", "transposed F.linear"} <= set(times)
        assert all(t > 0 for t in times.values())


def test_batches_must_be_positive_integers(capsys):
    from gambit.bench.engine import parse_args

    for bad in ("a", "0,2", ""):
        with pytest.raises(SystemExit):
            parse_args(["--batches", bad])
        assert f"comma-separated integers >= 1, got {bad!r}" in capsys.readouterr().err
    assert parse_args(["--batches", "1,16"]).batches == [1, 16]
    for flag, bad in (("--vllm-configs", "defaults,bf16"), ("--native-dtypes", "float16")):
        with pytest.raises(SystemExit):
            parse_args([flag, bad])
        err = capsys.readouterr().err
        assert f"argument {flag}: comma-separated names out of" in err and f"{flag}: {flag}" not in err
    args = parse_args(["--vllm-configs", "defaults", "--native-dtypes", "float32,bfloat16"])
    assert args.vllm_configs == ("defaults",) and args.native_dtypes == ("float32", "bfloat16")
    assert parse_args([]).vllm_configs == ("defaults", "float32")


@pytest.mark.parametrize(("args", "message"), [
    (["--temperature", "nan"], "--temperature must be a finite number, got nan"),
    (["--temperature", "-0.5"], "--temperature must be >= 0, got -0.5"),
    (["--top-p", "0"], "--top-p must be in (0, 1], got 0.0"),
    (["--top-p", "1.5"], "--top-p must be in (0, 1], got 1.5"),
    (["--top-p", "nan"], "--top-p must be in (0, 1], got nan"),
    (["--tokens", "0"], "--tokens must be >= 2, got 0"),
    (["--tokens", "1"], "--tokens must be >= 2, got 1"),
    (["--repeats", "0"], "--repeats must be >= 1, got 0"),
    (["--model", "/nonexistent"], "--model /nonexistent: no model folder there"),
    (["--plot-beside", "/nonexistent.json"], "--plot-beside /nonexistent.json: no such file"),
])
def test_engine_bench_flags_are_checked_before_any_backend(monkeypatch, args, message):
    """A bad value once ran some backends at it (T=nan: the native child failed, transformers ran) or
    failed after the whole run (--plot-beside); now ValueError naming the flag, before any work."""
    import gambit.bench.engine

    engine = gambit.bench.engine
    refused_before(monkeypatch, engine, "run_engine_bench", engine.main, args, message)


def test_engine_bench_library_refuses_a_nan_temperature(tiny_folder: Path):
    from gambit.bench.engine import run_engine_bench

    with pytest.raises(ValueError, match="temperature must be a finite number >= 0, got nan"):
        run_engine_bench(tiny_folder, [1], temperature=float("nan"), vllm=False)


@pytest.mark.parametrize(("args", "message"), [
    (["--rows", "foo"], "--rows must be comma-separated integers >= 1, got 'foo'"),
    (["--rows", "1,0"], "--rows must be comma-separated integers >= 1, got '1,0'"),
    (["--repeats", "0"], "--repeats must be >= 1, got 0"),
    (["--threads", "0"], "--threads must be >= 1, got 0"),
    (["--distinct-mb", "-5"], "--distinct-mb must be >= 0, got -5.0"),
    (["--distinct-mb", "nan"], "--distinct-mb must be a finite number, got nan"),
    (["--model", "/nonexistent"], "--model /nonexistent: no model folder there"),
])
def test_linears_flags_are_checked_before_any_model_loads(monkeypatch, args, message):
    import gambit.bench.linears

    refused_before(monkeypatch, gambit.bench.linears, "measure", gambit.bench.linears.main, args, message)


def test_linears_help_describes_the_whole_sentence(capsys):
    from gambit.bench.linears import main

    with pytest.raises(SystemExit):
        main(["--help"])
    out = "".join(capsys.readouterr().out.split())  # argparse wraps lines, at hyphens too
    assert "behind``engine/linear.py``'schoices(transposedlayout,MKL-packed,oneDNN-packed)." in out
