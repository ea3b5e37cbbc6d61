"""vLLM side of ``gambit bench engine``; runs under ``.venv-vllm/bin/python`` (see ``make vllm-venv``).

It must not import gambit (that venv has its own torch and an older transformers). It reads token
id prompts from a JSON file, starts ``vllm.LLM`` on the CPU, warms up, and for each batch size
times ``generate`` with ``max_tokens=N, ignore_eos=True`` and with ``max_tokens=1`` (prefill plus
one token; decode rate = B(N-1) / (t_N - t_1)). Peak memory is the process's peak RSS during each
batch (``VmHWM`` after resetting it through ``/proc/self/clear_refs``); the engine core runs in
this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``). Prints one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path


def log(msg: str) -> None:
    print(f"[vllm] {msg}", file=sys.stderr, flush=True)


def reset_peak() -> None:
    """Make VmHWM equal the current RSS (Linux); a no-op elsewhere."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def peak_mb() -> float:
    """Peak RSS since the last ``reset_peak`` (falls back to the process lifetime peak)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def prepare_folder(folder: str) -> tuple[str, str | None]:
    """Use ``folder`` as is if this transformers reads its RoPE settings; else a rewritten tmp copy.

    Returns (folder to load, tmp dir to delete or None). The shipped files are never changed.
    """
    from transformers import AutoConfig

    cfg = json.loads((Path(folder) / "config.json").read_text())
    rope = cfg.get("rope_parameters")
    if rope is None:
        return folder, None
    try:
        hf = AutoConfig.from_pretrained(folder)
        params = getattr(hf, "rope_parameters", None) or {}
        theta = params.get("rope_theta", getattr(hf, "rope_theta", None))
        if theta == rope.get("rope_theta", 10000.0):
            return folder, None
    except Exception as e:  # an old transformers may reject the key outright
        log(f"config.json not readable as is ({e}); rewriting a copy")
    tmp = tempfile.mkdtemp(prefix="gambit-vllm-")
    dst = Path(tmp) / "model"
    shutil.copytree(folder, dst)
    cfg = dict(cfg)
    rope = dict(cfg.pop("rope_parameters"))
    cfg["rope_theta"] = rope.pop("rope_theta", 10000.0)
    cfg["rope_scaling"] = None if rope.get("rope_type", "default") == "default" else rope
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    log(f"rewrote config.json with rope_theta/rope_scaling in {dst}")
    return str(dst), tmp


def timed_generate(llm, prompts: list[list[int]], params) -> tuple[float, int]:
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    dt = time.perf_counter() - t0
    return dt, sum(len(o.outputs[0].token_ids) for o in outs)


def run(args: argparse.Namespace) -> dict:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.kv_gb))
    # vLLM drops torch to 1 thread unless OMP_NUM_THREADS is set; the other backends use every core
    if args.threads or "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(args.threads or os.cpu_count() or 1)
    t0 = time.perf_counter()
    import torch
    import vllm
    from vllm import LLM, SamplingParams

    log(f"vllm {vllm.__version__} imported in {time.perf_counter() - t0:.1f}s")
    prompts: list[list[int]] = json.loads(Path(args.prompts).read_text())
    folder, tmp = prepare_folder(args.model)
    try:
        t0 = time.perf_counter()
        llm = LLM(model=folder, dtype=args.dtype, max_model_len=args.max_model_len, enforce_eager=args.eager,
                  max_num_seqs=max(args.batches), seed=0, skip_tokenizer_init=args.skip_tokenizer)
        dtype = str(llm.llm_engine.model_config.dtype).removeprefix("torch.")  # what "auto" resolved to
        start_s = time.perf_counter() - t0
        log(f"engine started in {start_s:.1f}s")
        temp = args.temperature

        def sp(n: int) -> SamplingParams:
            return SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True, temperature=temp,
                                  top_p=args.top_p, top_k=0 if temp > 0 else -1, seed=None, detokenize=False)

        timed_generate(llm, prompts[:max(args.batches)], sp(min(8, args.tokens)))  # warm-up
        rows = []
        for b in args.batches:
            reset_peak()
            timed_generate(llm, prompts[:b], sp(min(8, args.tokens)))
            t1, _ = timed_generate(llm, prompts[:b], sp(1))
            tn, n = timed_generate(llm, prompts[:b], sp(args.tokens))
            if n != b * args.tokens:
                raise RuntimeError(f"batch {b}: got {n} tokens, expected {b * args.tokens}")
            decode = b * (args.tokens - 1) / max(tn - t1, 1e-9)
            rows.append({"batch": b, "tok_s": decode, "total_tok_s": n / tn, "total_s": tn,
                         "prefill_s": t1, "peak_mb": peak_mb()})
            log(f"batch {b}: {decode:.0f} tok/s decode, {n / tn:.0f} tok/s total, "
                f"peak {rows[-1]['peak_mb']:.0f} MB")
        return {"version": vllm.__version__, "dtype": dtype, "dtype_asked": args.dtype, "kv_gb": args.kv_gb,
                "start_s": start_s, "torch_threads": torch.get_num_threads(), "enforce_eager": args.eager,
                "rows": rows}
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--prompts", required=True, help="JSON file: list of token id lists")
    p.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], required=True)
    p.add_argument("--tokens", type=int, required=True)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass (1: none)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--kv-gb", type=int, default=1)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--threads", type=int, default=0, help="OMP_NUM_THREADS (default: all cores)")
    p.add_argument("--skip-tokenizer", action="store_true", help="skip_tokenizer_init=True")
    p.add_argument("--eager", action="store_true",
                   help="enforce_eager=True: no torch.compile (vLLM's default is to compile)")
    return p.parse_args(argv)


if __name__ == "__main__":
    result = run(parse())
    print(json.dumps(result), flush=True)
