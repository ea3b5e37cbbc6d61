"""Backends of ``gambit bench engine``, each run in its own process (``--role``): the native engine,
``transformers``, fork vs re-prefill; plus what the parent measures of the machine and the model
(memory bandwidth, weight bytes) for the batch-1 bound."""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

from gambit.bench.vllm_worker import peak_mb, reset_peak


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
