"""``gambit bench engine``: native engine vs ``transformers`` vs vLLM (CPU) decode throughput.

One invocation measures, on the same model folder and the same token-id prompts (test problems):
(a) the native engine in fp32 (its CPU default), with bfloat16 weights (``--native-dtypes``:
``EngineConfig.cpu_weights``, fp32 activations) and with bfloat16 weights and KV cache (``bfloat16+kv``:
``EngineConfig.kv_dtype`` too, what vLLM's bfloat16 holds), (b)
``transformers.generate`` (fp32, left padding) and (c) vLLM in its own venv (``make vllm-venv``) as its
users run it (``vllm``: ``LLM(model)`` at its defaults, dtype "auto" and torch.compile; on a CPU with
bfloat16 support "auto" is bfloat16) and at the native engine's precision (``vllm_fp32``: fp32,
``enforce_eager``), at each batch size, with a fixed number of new tokens (EOS ignored) and the same
temperature; plus (d) forking a 1,000-token trace vs re-prefilling it.

Throughput: ``tok_s`` is the decode rate, B(N-1) tokens over the time after every trace has its
first token (native: measured step by step; HF and vLLM: t(N tokens) - t(1 token)); ``total_tok_s``
is B·N over the whole call. Memory: each backend runs in its own process and ``peak_mb`` is that
process's peak RSS during the batch (Linux ``VmHWM``, reset through ``/proc/self/clear_refs``
before each batch): weights, runtime and KV cache included. The native engine's KV cache is sized
to the batch; vLLM preallocates ``VLLM_CPU_KVCACHE_SPACE`` GiB.

With ``--repeats N`` the backends run in N interleaved rounds (native, transformers, vLLM, native,
...; each a fresh process) and every figure is the median over rounds, with the spread (min-max of
tok/s) beside it: the machine may be shared. The batch-1 bound is the memory-bandwidth limit of a
decode step that reads every weight once: ``weight bytes / bandwidth``, with the bandwidth measured
here (a multi-threaded sum over a 512 MiB fp32 tensor, median of several, once per round).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from gambit.bench.engine_args import (
    DEFAULT_MODEL,
    FULL_BATCHES,
    FULL_TOKENS,
    QUICK_BATCHES,
    QUICK_TOKENS,
    VLLM_PYTHON,
    _csv,
    parse_args,
)
from gambit.bench.engine_args import batch_list as batch_list  # the flags' parser and checks: beside this
from gambit.bench.engine_args import check_args as check_args  # file; imported from here as before
from gambit.bench.engine_args import name_list as name_list
from gambit.bench.engine_backends import log, make_prompts, memory_bandwidth_gbs, role_main, weight_bytes
from gambit.bench.engine_report import (
    BACKENDS,
    LABELS,
    NATIVE_DTYPES,
    VLLM_CONFIGS,
    _median_rows,
    _ratio,
    _rows,
    format_table,
    kernel_notes,
)
from gambit.model.registry import resolve_model

FORK_TOKENS = 1000
# what fixes the inputs of a rerun: the prompts are the task's test problems at these seeds; the sampled
# tokens are not seeded (decode speed does not depend on which tokens come out, EOS being ignored)
SEEDS = {"prompts": 0, "fork_prompt": 1, "sampling": None}


def _child(cmd: list[str], timeout: float, env: dict | None = None) -> tuple[object | None, str]:
    """Run a child; (parsed last stdout line, error note). Its stderr goes straight to ours."""
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f}s"
    lines = [x for x in r.stdout.splitlines() if x.strip()]
    if r.returncode or not lines:
        return None, f"exit code {r.returncode}; see the log above"
    return json.loads(lines[-1]), ""


def _vllm(py: Path, folder: Path, pfile: Path, batches: list[int], tokens: int, temperature: float,
          dtype: str, eager: bool, top_p: float = 1.0) -> tuple[dict | None, str]:
    if not py.exists():
        return None, f"vLLM not measured: {py} is missing; run `make vllm-venv`"
    log(f"vLLM ({py}, dtype {dtype}, {'eager' if eager else 'torch.compile'}): import ~20 s, engine start "
        f"~40-90 s")
    cmd = [str(py), str(Path(__file__).with_name("vllm_worker.py")), "--model", str(folder), "--prompts",
           str(pfile), "--batches", _csv(batches), "--tokens", str(tokens), "--temperature",
           str(temperature), "--top-p", str(top_p), "--dtype", dtype] + (["--eager"] if eager else [])
    out, err = _child(cmd, 3600, {**os.environ, "PYTHONPATH": ""})
    return out, err and f"vLLM failed: {err}"


def run_engine_bench(model_folder: str | Path | None = None, batches: list[int] | None = None,
                     quick: bool = False, json_path: str | Path | None = None, *,
                     new_tokens: int | None = None, temperature: float = 0.8, top_p: float = 1.0,
                     vllm: bool = True,
                     vllm_python: str | Path | None = None,
                     vllm_configs: tuple[str, ...] = tuple(VLLM_CONFIGS),
                     native_dtypes: tuple[str, ...] = ("float32",),
                     fork_tokens: int = FORK_TOKENS, repeats: int = 1,
                     argv: list[str] | None = None) -> dict:
    """Run all parts, print the table, write JSON (if ``json_path``) and return the result dict.
    ``argv``: the flags as typed, recorded in the JSON (None: this process's)."""
    from gambit.bench import record
    folder = resolve_model(model_folder or DEFAULT_MODEL).resolve()
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder}: no model folder (train it with `gambit train target` or "
                                "pass --model FOLDER)")
    batches = batches or (QUICK_BATCHES if quick else FULL_BATCHES)
    tokens = new_tokens or (QUICK_TOKENS if quick else FULL_TOKENS)
    if tokens < 2:
        raise ValueError(f"new_tokens must be >= 2 to separate decode from prefill, got {tokens}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if not 0 <= temperature < float("inf"):  # NaN once failed the native child and ran transformers at it
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    from gambit.bench import args as bench_args

    bench_args.out_path("--json", str(json_path or ""))  # written after every backend ran: checked first
    me = [sys.executable, "-m", "gambit.bench.engine", "--model", str(folder), "--tokens", str(tokens),
          "--temperature", str(temperature), "--top-p", str(top_p), "--batches", _csv(batches)]
    res: dict = {}
    notes: list[str] = []
    from gambit.engine.linear import bf16_gemm_available

    if not bf16_gemm_available():  # bf16 weights outside the invariant kernels need oneDNN's bf16 GEMM
        off = [d for d in native_dtypes if NATIVE_DTYPES[d][1] == "bfloat16" and not NATIVE_DTYPES[d][3]]
        if off:
            notes.append(f"native {', '.join(off)} skipped: no oneDNN bfloat16 GEMM on this CPU "
                         "(it needs AVX512-BF16 or AMX)")
            native_dtypes = tuple(d for d in native_dtypes if d not in off)
    with tempfile.TemporaryDirectory(prefix="gambit-bench-") as tmp:
        pfile, ffile = Path(tmp) / "prompts.json", Path(tmp) / "fork.json"
        pfile.write_text(json.dumps(make_prompts(folder, max(batches))))
        ffile.write_text(json.dumps(make_prompts(folder, 1, fork_tokens)[0]))
        if repeats < 1:
            raise ValueError("repeats must be >= 1")
        py = Path(vllm_python or os.environ.get("GAMBIT_VLLM_PYTHON") or VLLM_PYTHON)
        rounds: dict[str, list] = {k: [] for k in BACKENDS}
        bandwidth, vinfo, done = [], {}, [0]
        children = [(NATIVE_DTYPES[d][0], ["--role", "native", "--weights", NATIVE_DTYPES[d][1], "--kv-dtype",
                                           NATIVE_DTYPES[d][2]] + ["--batch-invariant"] * NATIVE_DTYPES[d][3])
                    for d in native_dtypes]
        children.insert(1, ("hf", ["--role", "hf"]))

        def partial() -> dict | None:  # Ctrl-C: the rounds every backend finished
            med = {k: _median_rows(v) for k, v in rounds.items()}
            if not any(med.values()):
                return None
            # a round counts once every backend ran in it (its bandwidth is taken as it starts)
            return {"rows": _rows(batches, med, rounds), "rounds_done": done[0],
                    "repeats": repeats, "model": str(folder), "new_tokens": tokens, "batches": batches,
                    "notes": notes, "provenance": record.provenance("engine", argv, SEEDS)}

        with record.on_interrupt("engine", json_path, partial):
            for r in range(repeats):  # interleaved rounds, each backend in a fresh process
                bandwidth.append(memory_bandwidth_gbs())
                log(f"round {r + 1}/{repeats}: memory bandwidth {bandwidth[-1]:.1f} GB/s")
                for key, role in children:
                    log(f"{LABELS[key]}: batches {batches}, {tokens} new tokens, T={temperature}, "
                        f"top-p {top_p}")
                    out, err = _child(me + role + ["--prompts", str(pfile)], 3600)
                    rounds[key].append(out)
                    if err:
                        notes.append(f"{key} failed (round {r + 1}): {err}")
                for name in vllm_configs if vllm else ():
                    key, dtype, eager = VLLM_CONFIGS[name]
                    out, err = _vllm(py, folder, pfile, batches, tokens, temperature, dtype, eager, top_p)
                    if out:
                        vinfo[key] = out
                        rounds[key].append(out["rows"])
                    if err:
                        notes.append(err)
                        vllm = False  # missing or broken: said once, not retried for other configs or rounds
                        break
                if not vllm and r == 0 and not vinfo and not any(n.startswith("vLLM") for n in notes):
                    notes.append("vLLM skipped")
                done[0] += 1
        log(f"fork: re-prefill vs fork of a {fork_tokens}-token trace")
        res["fork"], err = _child(me + ["--role", "fork", "--prompts", str(ffile), "--reps",
                                        "3" if quick else "7"], 3600)
        if err:
            notes.append(f"fork failed: {err}")
        notes += kernel_notes(rounds, res["fork"])
        medians = {k: _median_rows(v) for k, v in rounds.items()}
        bw = statistics.median(bandwidth)
        wbytes, wbytes16 = weight_bytes(folder), weight_bytes(folder, 2)
    rows = _rows(batches, medians, rounds)
    half = {key for key, weights, _, _ in NATIVE_DTYPES.values() if weights == "bfloat16"}
    half |= {k for k, v in vinfo.items() if v.get("dtype") in ("bfloat16", "float16")}
    for row in rows:
        if row["batch"] == 1:  # every weight read once per token: the bandwidth bound at batch 1
            row["bound_tok_s"] = bw * 1e9 / wbytes  # the folder's weights as stored (fp32 here)
            row["bound_16bit_tok_s"] = bw * 1e9 / wbytes16  # the same weights in bfloat16
            for k in BACKENDS:
                if k != "hf":
                    bound = row["bound_16bit_tok_s" if k in half else "bound_tok_s"]
                    row[f"{k}_vs_bound"] = _ratio(row[f"{k}_tok_s"], bound)
    vllm_info = {k: {x: y for x, y in v.items() if x != "rows"} for k, v in vinfo.items()}
    prov = record.provenance("engine", argv, SEEDS)
    result = {"rows": rows, "fork_vs_prefill": res["fork"], "repeats": repeats,
              "bandwidth_gbs": bw, "bandwidth_rounds": bandwidth, "weight_bytes": wbytes,
              "model": str(folder), "new_tokens": tokens, "temperature": temperature, "top_p": top_p,
              "batches": batches,
              "quick": quick, "vllm": vllm_info.get("vllm"), "vllm_fp32": vllm_info.get("vllm_fp32"),
              "native_dtypes": list(native_dtypes),
              "notes": notes, "provenance": prov,
              "machine": prov["machine"],  # kept at the top too: bench_plots and older readers look there
              "method": {"tok_s": "decode tokens/s after every trace has its first token",
                         "total_tok_s": "B*N tokens over the whole generate call (prefill included)",
                         "peak_mb": "peak RSS of the backend's own process during the batch (VmHWM)",
                         "ratios": "per round a/b tok/s, then the median over rounds ({a}_vs_{b}; min-max "
                                   "in {a}_vs_{b}_spread)"}}
    print(format_table(result))
    if json_path:
        record.write_json(result, json_path)
        log(f"wrote {json_path}")
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role:
        role_main(args)
        return 0
    res = run_engine_bench(args.model, args.batches, args.quick, args.json_path, new_tokens=args.tokens,
                           temperature=args.temperature, top_p=args.top_p, vllm=not args.no_vllm,
                           vllm_python=args.vllm_python,
                           vllm_configs=args.vllm_configs, native_dtypes=args.native_dtypes,
                           repeats=args.repeats, argv=argv)
    if args.plot:
        from gambit.bench.bench_plots import plot_engine

        beside = [json.loads(Path(f).read_text()) for f in args.plot_beside.split(",") if f]
        plot_engine([res, *beside], args.plot)
        log(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
