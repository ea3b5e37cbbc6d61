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

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gambit
from gambit.bench.vllm_worker import peak_mb, reset_peak
from gambit.model.registry import resolve_model

DEFAULT_MODEL = Path(gambit.__file__).parent / "assets" / "target"
REPO_ROOT = Path(gambit.__file__).resolve().parents[2]
VLLM_PYTHON = REPO_ROOT / ".venv-vllm" / "bin" / "python"
FULL_BATCHES, QUICK_BATCHES = [1, 16, 64, 256], [1, 16, 64]
FULL_TOKENS, QUICK_TOKENS = 128, 32
FORK_TOKENS = 1000
# what fixes the inputs of a rerun: the prompts are the task's test problems at these seeds; the sampled
# tokens are not seeded (decode speed does not depend on which tokens come out, EOS being ignored)
SEEDS = {"prompts": 0, "fork_prompt": 1, "sampling": None}


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def make_prompts(folder: str | Path, n: int, long_tokens: int = 0) -> list[list[int]]:
    """Token ids (BOS + text) of the first ``n`` test problems, with the model's tokenizer as the engine
    loads it (``load_tokenizer``: a folder or a fetched model's name, errors naming the folder); with
    ``long_tokens``, one prompt of that many ids made of concatenated problems and solutions."""
    from gambit.model.loader import load_tokenizer
    from gambit.tasks.arithmetic import generate

    tok = load_tokenizer(folder)
    if not long_tokens:
        return [tok.encode(p.prompt) for p in generate("test", n, 0)]
    ids, k = [], 16
    while len(ids) < long_tokens:
        ids = tok.encode("\n\n".join(p.prompt + p.solution for p in generate("test", k, 1)))
        k *= 2
    return [ids[:long_tokens]]


# -- backends, each run in its own process (``--role``) --------------------------------------------
def native_batch(folder: str, prompts: list[list[int]], tokens: int, temperature: float,
                 weights: str = "float32", kv_dtype: str = "auto", top_p: float = 1.0,
                 batch_invariant: bool = False) -> dict:
    """Decode ``len(prompts)`` traces for ``tokens`` tokens on a fresh engine sized to the batch, its linear
    weights in ``weights`` (``EngineConfig.cpu_weights``; activations fp32 either way), its KV cache in
    ``kv_dtype`` (``EngineConfig.kv_dtype``), with ``EngineConfig.batch_invariant``."""
    from gambit.engine import Engine, EngineConfig, SamplingParams, TokenEvent

    b, bs = len(prompts), 16
    need = sum(-(-(len(p) + tokens + 1) // bs) for p in prompts)
    eng = Engine.from_pretrained(folder, EngineConfig(model=folder, device="cpu", cpu_weights=weights,
                                                      kv_dtype=kv_dtype, block_size=bs, num_blocks=need + 4,
                                                      max_num_seqs=b, batch_invariant=batch_invariant))
    warm = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=min(8, tokens), ignore_eos=True)
    eng.generate(prompts, warm)
    reset_peak()
    sp = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=tokens, ignore_eos=True)
    for p in prompts:
        eng.add(p, sp)
    first: set[int] = set()
    n, t_first = 0, None
    t0 = time.perf_counter()
    while eng.has_unfinished():
        for ev in eng.step():
            if isinstance(ev, TokenEvent):
                n += 1
                first.add(ev.trace_id)
        if t_first is None and len(first) == b:
            t_first = time.perf_counter()
    t1 = time.perf_counter()
    if n != b * tokens:
        raise RuntimeError(f"native batch {b}: got {n} tokens, expected {b * tokens}")
    kv_mb = eng.runner.cache.k.nbytes * 2 / 2**20
    return {"batch": b, "tok_s": b * (tokens - 1) / max(t1 - t_first, 1e-9), "total_tok_s": n / (t1 - t0),
            "total_s": t1 - t0, "prefill_s": t_first - t0, "peak_mb": peak_mb(), "kv_mb": kv_mb}


def hf_batch(model, prompts: list[list[int]], tokens: int, temperature: float, pad_id: int,
             top_p: float = 1.0) -> dict:
    """``transformers`` generate with left padding; decode rate from t(N) - t(1)."""
    import torch

    b, width = len(prompts), max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    kw = {"do_sample": temperature > 0, "pad_token_id": pad_id}
    if temperature > 0:
        kw.update(temperature=temperature, top_k=0, top_p=top_p)

    def gen(n: int) -> float:
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, **kw)
        if out.shape[1] != width + n:
            raise RuntimeError(f"HF batch {b}: generated {out.shape[1] - width} tokens, expected {n}")
        return time.perf_counter() - t0

    gen(min(8, tokens))  # warm-up
    reset_peak()
    t1, tn = gen(1), gen(tokens)
    return {"batch": b, "tok_s": b * (tokens - 1) / max(tn - t1, 1e-9), "total_tok_s": b * tokens / tn,
            "total_s": tn, "prefill_s": t1, "peak_mb": peak_mb()}


def fork_vs_prefill(folder: str, ids: list[int], reps: int) -> dict:
    """Median time of ``engine.fork`` of a prefilled trace vs the prefill step of the same ids."""
    from gambit.engine import Engine, EngineConfig, SamplingParams

    eng = Engine.from_pretrained(folder, EngineConfig(model=folder, device="cpu", dtype="float32"))
    sp = SamplingParams(temperature=0.8, max_tokens=16, ignore_eos=True)
    prefill, fork, parent = [], [], None
    for i in range(reps + 1):  # the first prefill is a warm-up; the step runs this trace alone
        if parent is not None:
            eng.abort(parent)
        parent = eng.add(ids, sp)
        t0 = time.perf_counter()
        eng.step()
        if i:
            prefill.append(time.perf_counter() - t0)
    if eng.get(parent).num_cached != len(ids):
        raise RuntimeError("the long prompt was not prefilled in one step")
    for _ in range(5 * reps):
        t0 = time.perf_counter()
        children = eng.fork(parent, 1)
        fork.append(time.perf_counter() - t0)
        for c in children:
            eng.abort(c)
    fork_ms, prefill_ms = statistics.median(fork) * 1e3, statistics.median(prefill) * 1e3
    return {"tokens": len(ids), "fork_ms": fork_ms, "prefill_ms": prefill_ms,
            "ratio": prefill_ms / max(fork_ms, 1e-9), "fork_reps": len(fork), "prefill_reps": len(prefill)}


def role_main(args: argparse.Namespace) -> None:
    """Child process: run one backend over all batches, print one JSON line."""
    from gambit.bench.kernel_note import cpu_kernels_note

    folder, out = str(args.model), []
    if args.role == "fork":
        fk = fork_vs_prefill(folder, json.loads(Path(args.prompts).read_text()), args.reps)
        print(json.dumps({**fk, "kernel_note": cpu_kernels_note()}))
        return
    prompts = json.loads(Path(args.prompts).read_text())
    if args.role == "hf":
        import torch
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    for b in args.batches:
        if args.role == "native":
            row = native_batch(folder, prompts[:b], args.tokens, args.temperature, args.weights,
                               args.kv_dtype, args.top_p, args.batch_invariant)
        else:
            row = hf_batch(model, prompts[:b], args.tokens, args.temperature, pad, args.top_p)
        log(f"{args.role} batch {b}: {row['tok_s']:.0f} tok/s decode, {row['total_tok_s']:.0f} tok/s "
            f"total, peak {row['peak_mb']:.0f} MB")
        if args.role == "native":  # the parent's notes say when it timed the PyTorch path
            row["kernel_note"] = cpu_kernels_note()
        out.append(row)
        gc.collect()
    print(json.dumps(out))


# -- orchestration -------------------------------------------------------------------------------
def memory_bandwidth_gbs(mib: int = 512, reps: int = 7) -> float:
    """Read bandwidth (GB/s): median time of ``x.sum()`` over a ``mib`` MiB fp32 tensor."""
    import torch

    x = torch.ones(mib * 2**20 // 4)
    x.sum()  # touch every page first
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        x.sum()
        times.append(time.perf_counter() - t0)
    return x.nbytes / statistics.median(times) / 1e9


def weight_bytes(folder: Path, element_bytes: int | None = None) -> int:
    """Bytes of the weights a decode step reads (the safetensors tensors; a tied head counts once), as
    stored, or at ``element_bytes`` per element (2: the same weights in bfloat16)."""
    from safetensors import safe_open

    total = 0
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for k in st.keys():
                sl = st.get_slice(k)
                n = 1
                for d in sl.get_shape():
                    n *= d
                total += n * (element_bytes or {"F32": 4, "BF16": 2, "F16": 2}.get(sl.get_dtype(), 4))
    return total


def _median_rows(rounds: list[list[dict] | None]) -> list[dict] | None:
    """Per batch: the median of every numeric field over rounds, plus the tok/s spread."""
    by: dict[int, list[dict]] = {}
    for rows in rounds:
        for r in rows or []:
            by.setdefault(r["batch"], []).append(r)
    if not by:
        return None
    out = []
    for b, rs in sorted(by.items()):
        row = {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "batch"
               and isinstance(rs[0][k], int | float)}
        row.update(batch=b, rounds=len(rs), tok_s_min=min(r["tok_s"] for r in rs),
                   tok_s_max=max(r["tok_s"] for r in rs))
        out.append(row)
    return out


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


# the vLLM configurations measured: name -> (row key, dtype, enforce_eager)
VLLM_CONFIGS = {"defaults": ("vllm", "auto", False), "float32": ("vllm_fp32", "float32", True)}
# the native engine's configurations measured: name -> (row key, cpu_weights, kv_dtype)
# --native-dtypes name: (row key, cpu_weights, kv_dtype, batch_invariant)
NATIVE_DTYPES = {"float32": ("native", "float32", "auto", False),
                 "bfloat16": ("native_bf16", "bfloat16", "auto", False),
                 "bfloat16+kv": ("native_bf16kv", "bfloat16", "bfloat16", False),
                 "float32+inv": ("native_inv", "float32", "auto", True),
                 "bfloat16+kv+inv": ("native_bf16kv_inv", "bfloat16", "bfloat16", True)}
BACKENDS = ("native", "native_bf16", "native_bf16kv", "native_inv", "native_bf16kv_inv", "hf", "vllm",
            "vllm_fp32")  # row keys, in table order
SHORT = {"native": "nat", "native_bf16": "nat16", "native_bf16kv": "nat16kv", "native_inv": "natI",
         "native_bf16kv_inv": "nat16kvI", "hf": "HF", "vllm": "vLLM", "vllm_fp32": "vLLM32"}
LABELS = {"native": "native fp32", "native_bf16": "native bf16", "native_bf16kv": "native bf16+kv",
          "native_inv": "native fp32 invariant", "native_bf16kv_inv": "native bf16+kv invariant",
          "hf": "HF fp32", "vllm": "vLLM defaults", "vllm_fp32": "vLLM fp32"}


def name_list(known: dict):
    """An argparse type: comma-separated names out of ``known`` (argparse's message names the flag)."""
    def parse(text: str) -> tuple[str, ...]:
        out = tuple(x for x in text.split(",") if x)
        bad = [x for x in out if x not in known]
        if bad or not out:
            raise argparse.ArgumentTypeError(f"comma-separated names out of {', '.join(known)}, got {text!r}")
        return out
    return parse


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


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


# (numerator, denominator) row keys of the ratios each row reports
RATIOS = (("native", "hf"), ("native", "vllm"), ("native", "vllm_fp32"), ("native_bf16", "vllm"),
          ("native_bf16kv", "vllm"), ("native_inv", "native"), ("native_bf16kv_inv", "native_bf16kv"),
          ("native_bf16kv_inv", "vllm"))


def kernel_notes(rounds: dict[str, list], fork: dict | None) -> list[str]:
    """The native children's word on the C++ CPU kernels (``gambit.bench.kernel_note``), one line per
    distinct note naming the backends it holds for: a child that lost a build race to another process
    once timed the PyTorch path while the table looked as usual."""
    from gambit.bench.kernel_note import grouped

    said: dict[str, str] = {}
    for key, rows in rounds.items():
        for r in (x for rs in rows for x in rs or []):
            if r.get("kernel_note"):
                said[LABELS[key]] = r["kernel_note"]
    if fork and fork.get("kernel_note"):
        said["fork"] = fork["kernel_note"]
    return grouped(said)


def _pair_ratio(rounds: dict[str, list], a: str, c: str, batch: int) -> dict | None:
    """``a`` / ``c`` tok/s at ``batch`` within each round (the two ran minutes apart, not hours),
    summarised over the rounds (``record.pair_ratios``); None: no round measured both."""
    from gambit.bench import record

    def rates(key: str) -> list[float | None]:
        return [next((r["tok_s"] for r in rows or [] if r["batch"] == batch), None)
                for rows in rounds.get(key, [])]

    return record.pair_ratios(rates(a), rates(c))


def _rows(batches: list[int], by_backend: dict[str, list | None], rounds: dict[str, list] | None = None
          ) -> list[dict]:
    """One row per batch size joining the backends (``BACKENDS`` keys; missing numbers are None). With
    ``rounds`` (backend → per-round rows) each ratio is the median of the per-round ratios, its
    min-max in ``{a}_vs_{c}_spread``; without, the ratio of the medians."""
    by = {k: {r["batch"]: r for r in (by_backend.get(k) or [])} for k in BACKENDS}
    rows = []
    for b in batches:
        got = {k: by[k].get(b, {}) for k in BACKENDS}
        row: dict = {"batch": b}
        for k, r in got.items():
            row.update({f"{k}_tok_s": r.get("tok_s"), f"{k}_peak_mb": r.get("peak_mb"),
                        f"{k}_total_tok_s": r.get("total_tok_s"), f"{k}_prefill_s": r.get("prefill_s"),
                        f"{k}_tok_s_min": r.get("tok_s_min"), f"{k}_tok_s_max": r.get("tok_s_max")})
        for a, c in RATIOS:
            pr = _pair_ratio(rounds, a, c, b) if rounds else None
            row[f"{a}_vs_{c}"] = pr["median"] if pr else _ratio(row[f"{a}_tok_s"], row[f"{c}_tok_s"])
            row[f"{a}_vs_{c}_spread"] = [pr["min"], pr["max"]] if pr else None
        rows.append({**row, "native_kv_mb": got["native"].get("kv_mb")})
    return rows


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
        bandwidth, vinfo = [], {}
        children = [(NATIVE_DTYPES[d][0], ["--role", "native", "--weights", NATIVE_DTYPES[d][1], "--kv-dtype",
                                           NATIVE_DTYPES[d][2]] + ["--batch-invariant"] * NATIVE_DTYPES[d][3])
                    for d in native_dtypes]
        children.insert(1, ("hf", ["--role", "hf"]))

        def partial() -> dict | None:  # Ctrl-C: the rounds every backend finished
            med = {k: _median_rows(v) for k, v in rounds.items()}
            if not any(med.values()):
                return None
            return {"rows": _rows(batches, med, rounds), "rounds_done": len(bandwidth),
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


def format_table(result: dict) -> str:
    def f(x: float | None, fmt: str = ".0f") -> str:
        return "-" if x is None else format(x, fmt)

    shown = [k for k in BACKENDS if any(r.get(f"{k}_tok_s") for r in result["rows"])] or ["native"]
    ratios = [(a, c) for a, c in RATIOS if a in shown and c in shown]
    names = [f"{SHORT[a]}/{SHORT[c]}" for a, c in ratios]
    head = " | ".join([f"{'batch':>5}"] + [f"{LABELS[k] + ' tok/s':>18}" for k in shown]
                      + [f"{n:>11}" for n in names])
    lines = [f"model {result['model']}, {result['new_tokens']} new tokens, T={result['temperature']}, "
             f"top-p {result.get('top_p', 1.0)}",
             head, "-" * len(head)]
    for r in result["rows"]:
        cells = [f"{r['batch']:>5}"] + [f"{f(r.get(f'{k}_tok_s')):>18}" for k in shown]
        cells += [f"{f(r.get(f'{a}_vs_{c}'), '.2f'):>11}" for a, c in ratios]
        lines.append(" | ".join(cells))
    lines.append("peak MB: " + "; ".join(
        f"{LABELS[k]} " + "/".join(f(r.get(f"{k}_peak_mb")) for r in result["rows"]) for k in shown))
    for r in result["rows"]:
        if r.get("bound_tok_s"):
            lines.append(f"batch 1 bandwidth bound: {result['weight_bytes'] / 1e6:.0f} MB of weights / "
                         f"{result['bandwidth_gbs']:.1f} GB/s = {r['bound_tok_s']:.1f} tok/s (16-bit "
                         f"weights: {f(r.get('bound_16bit_tok_s'), '.1f')}); " + ", ".join(
                             f"{LABELS[k]} {f(r.get(f'{k}_vs_bound') and 100 * r[f'{k}_vs_bound'])}%"
                             for k in shown if k != "hf") + " of its bound")
    for key in ("vllm", "vllm_fp32"):
        v = result.get(key)
        if v:
            lines.append(f"{LABELS[key]}: vLLM {v.get('version')}, dtype {v.get('dtype')}, "
                         f"{'eager' if v.get('enforce_eager') else 'torch.compile'}")
    if result.get("repeats", 1) > 1:
        lines.append(f"medians of {result['repeats']} interleaved rounds; ratios: the median of the "
                     "per-round ratios; spread (min-max over rounds):")
        for r in result["rows"]:
            lines.append(f"  batch {r['batch']}: " + "; ".join(
                [f"{LABELS[k]} {f(r.get(f'{k}_tok_s_min'))}-{f(r.get(f'{k}_tok_s_max'))} tok/s" for k in shown
                 if r.get(f"{k}_tok_s_min") is not None]
                + [f"{SHORT[a]}/{SHORT[c]} {r[f'{a}_vs_{c}_spread'][0]:.2f}-{r[f'{a}_vs_{c}_spread'][1]:.2f}"
                   for a, c in ratios if r.get(f"{a}_vs_{c}_spread")]))
    fk = result.get("fork_vs_prefill")
    if fk:
        lines.append(f"fork {fk['tokens']}-token trace: {fk['fork_ms']:.3f} ms; re-prefill "
                     f"{fk['prefill_ms']:.1f} ms; ratio {fk['ratio']:.0f}x")
    lines += [f"note: {n}" for n in result.get("notes", [])]
    return "\n".join(lines)


def batch_list(text: str) -> list[int]:
    """``--batches``: comma-separated batch sizes >= 1 (argparse reports the message)."""
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"comma-separated integers >= 1, got {text!r}")
    return out


def _csv(items) -> str:
    """A list flag's value as the user types it: "1,16,64", not "[1, 16, 64]" or a tuple."""
    return ",".join(map(str, items))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from gambit.config_cli import DefaultsFormatter

    p = argparse.ArgumentParser(prog="gambit bench engine", formatter_class=DefaultsFormatter,
                                description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help=f"model folder or fetched name, e.g. smollm2 "
                   f"(default {DEFAULT_MODEL})")
    p.add_argument("--quick", action="store_true",
                   help=f"batches {_csv(QUICK_BATCHES)}, {QUICK_TOKENS} tokens per trace")
    p.add_argument("--json", dest="json_path", default=None, help="write the results JSON here")
    p.add_argument("--batches", type=batch_list, default=None,
                   help=f"comma-separated batch sizes, traces decoded together (default "
                   f"{_csv(FULL_BATCHES)}; {_csv(QUICK_BATCHES)} with --quick)")
    p.add_argument("--tokens", type=int, default=None,
                   help=f"new tokens per trace, >= 2 (default {FULL_TOKENS}, {QUICK_TOKENS} with --quick)")
    p.add_argument("--temperature", type=float, default=0.8, help="sampling temperature of every backend")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass (0, 1] of every backend's sampling "
                   "(1: no nucleus; reasoning models are often served at 0.95)")
    p.add_argument("--no-vllm", action="store_true", help="skip vLLM-CPU (native and transformers only)")
    p.add_argument("--repeats", type=int, default=1, help="interleaved rounds of every backend (medians are "
                   "reported)")
    p.add_argument("--vllm-python", default=None, help=f"python of the vLLM venv (`make vllm-venv`; default "
                   f"{VLLM_PYTHON}, or $GAMBIT_VLLM_PYTHON)")
    # defaults as typed (argparse runs a string default through ``type``): a tuple showed as one
    p.add_argument("--vllm-configs", type=name_list(VLLM_CONFIGS), default=_csv(VLLM_CONFIGS),
                   help="comma-separated vLLM configurations: 'defaults' (LLM(model) as its users run it: "
                   "dtype auto, torch.compile) and 'float32' (fp32, enforce_eager: the native engine's "
                   "precision)")
    p.add_argument("--native-dtypes", type=name_list(NATIVE_DTYPES), default="float32",
                   help="comma-separated native engine configurations: float32 (the engine's own on a CPU), "
                   "bfloat16 (bf16 weights), bfloat16+kv (bf16 weights and KV cache), float32+inv / "
                   "bfloat16+kv+inv (the same with EngineConfig.batch_invariant)")
    p.add_argument("--plot", default=None, help="write a PNG of tokens/s by batch per backend here")
    p.add_argument("--plot-beside", default="", help="comma-separated result JSONs of earlier runs (e.g. "
                   "another model) drawn as further panels of --plot")
    p.add_argument("--role", choices=("native", "hf", "fork"), help=argparse.SUPPRESS)
    p.add_argument("--prompts", help=argparse.SUPPRESS)
    p.add_argument("--reps", type=int, default=7, help=argparse.SUPPRESS)
    p.add_argument("--weights", default="float32", help=argparse.SUPPRESS)
    p.add_argument("--kv-dtype", default="auto", help=argparse.SUPPRESS)
    p.add_argument("--batch-invariant", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not args.role:  # a child gets its values from the parent, checked here
        check_args(args)
    return args


def check_args(args: argparse.Namespace) -> None:
    """The flags' values, before any backend starts (a bad one once failed in one child only, or ran
    the rest at it): ValueError naming the flag."""
    from gambit.bench import args as bench_args
    from gambit.checks import at_least, finite

    if args.tokens is not None:  # None: the default; the decode rate needs a token after the first
        at_least(2, **{"--tokens": args.tokens})
    finite(**{"--temperature": args.temperature})
    if not args.temperature >= 0:
        raise ValueError(f"--temperature must be >= 0, got {args.temperature!r}")
    if not 0 < args.top_p <= 1:  # NaN is not
        raise ValueError(f"--top-p must be in (0, 1], got {args.top_p!r}")
    at_least(1, **{"--repeats": args.repeats})
    if args.model is not None:
        bench_args.model("--model", args.model)
    for f in (f for f in args.plot_beside.split(",") if f):  # read after the whole run: check it first
        if not Path(f).is_file():
            raise ValueError(f"--plot-beside {f}: no such file (a result JSON of an earlier run)")
    bench_args.out_path("--json", args.json_path)  # written after the whole run: checked first
    bench_args.out_path("--plot", args.plot, image=True)


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
