"""``gambit bench profile``: where one decode step's time goes, grouped the way the speed work reads it.

Runs the native engine on a model folder at one batch size, warms up, then records ``--steps``
decode steps with ``torch.profiler`` and groups self CPU time by what it is: each linear layer by
its shape (q/k/v, o, gate/up, down, LM head), the paged-attention kernel and KV writes, the
sampler's vocabulary-wide ops, norms/RoPE/activations, and the rest. Prints a table (ms per step,
share) and writes JSON. The profiler adds per-op overhead, so the small-op shares are upper bounds;
the wall time per step without the profiler is measured first and reported beside it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from gambit.bench import record

LINEAR_OPS = {"mkldnn::_linear_pointwise", "aten::mm", "aten::addmm", "mkl::_mkl_linear", "aten::bmm",
              "gambit::gemv_t"}
SAMPLER_OPS = {"aten::div", "aten::amax", "aten::sub_", "aten::exp_", "aten::cumsum_", "aten::searchsorted",
               "aten::argmax", "aten::sum"}
ATTENTION_OPS = {"aten::index_copy_", "aten::_scaled_dot_product_flash_attention_for_cpu"}
ELEMENTWISE_OPS = {"aten::rms_norm", "aten::_fused_rms_norm", "aten::pow", "aten::mean", "aten::rsqrt",
                   "aten::mul", "aten::add", "aten::silu", "aten::cat", "aten::neg", "aten::copy_"}


def _linear_name(shapes: list, cfg) -> str:
    """Name a matmul by its weight's output width (the model's shapes are distinct)."""
    dims = [d for s in shapes if isinstance(s, list) and len(s) == 2 for d in s]
    i, v = cfg.intermediate_size, cfg.vocab_size
    qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
    for width, name in ((v, "linear: LM head"), (2 * i, "linear: gate/up"), (qkv, "linear: q/k/v")):
        if width in dims:
            return name
    return "linear: down" if i in dims else "linear: o"


def _stream_ab(eng, steps: int) -> dict[bool, list[float]]:
    """Steps with one-row products through cpu_gemv and without (MKL/oneDNN), alternating, each after a
    re-install of the linears and one untimed step."""
    from gambit.engine.linear import install_cpu_linears

    ab: dict[bool, list[float]] = {False: [], True: []}
    for i in range(2 * steps):
        on = bool(i % 2)
        install_cpu_linears(eng.model, eng.config.cpu_linear, stream=on)
        eng.step()
        t0 = time.perf_counter()
        eng.step()
        ab[on].append(time.perf_counter() - t0)
    install_cpu_linears(eng.model, eng.config.cpu_linear, stream=eng.config.cpu_stream)
    return ab


def profile(folder: str, batch: int, steps: int, threads: int, cpu_linear: str,
            compare_layers: bool = False, compare_stream: bool = False) -> dict:
    import torch
    from torch.profiler import profile as torch_profile

    from gambit.bench.engine_backends import make_prompts
    from gambit.engine import Engine, EngineConfig, SamplingParams

    torch.set_num_threads(threads)
    prompts = make_prompts(Path(folder), batch)
    need = sum(-(-(len(p) + 9 * steps + 16) // 16) for p in prompts)
    cfg = EngineConfig(model=folder, device="cpu", dtype="float32", block_size=16, num_blocks=need + 4,
                       max_num_seqs=batch, cpu_linear=cpu_linear)
    eng = Engine.from_pretrained(folder, cfg)
    for p in prompts:
        eng.add(p, SamplingParams(temperature=0.8, max_tokens=9 * steps + 8, ignore_eos=True, seed=1))
    for _ in range(3):
        eng.step()
    walls, ab = [], {False: [], True: []}
    for _ in range(steps):
        t0 = time.perf_counter()
        eng.step()
        walls.append(time.perf_counter() - t0)
    if compare_layers:  # Python layer loop vs the C++ one, interleaved step by step (same floats)
        for i in range(2 * steps):
            eng.runner.cpp_layers = on = bool(i % 2)
            t0 = time.perf_counter()
            eng.step()
            ab[on].append(time.perf_counter() - t0)
        eng.runner.cpp_layers = True
    stream_ab = _stream_ab(eng, steps) if compare_stream else {}
    with torch_profile(record_shapes=True) as prof:
        for _ in range(steps):
            eng.step()
    groups: dict[str, float] = defaultdict(float)
    cfg, vocab = eng.model.config, eng.model.config.vocab_size
    for ev in prof.key_averages(group_by_input_shape=True):
        name = ev.key
        if name in LINEAR_OPS:
            key = _linear_name(ev.input_shapes, cfg)
        elif name in ATTENTION_OPS or "paged_decode" in name:
            key = "attention + KV write"
        elif name in SAMPLER_OPS and any(isinstance(s, list) and vocab in s for s in ev.input_shapes):
            key = "sampler (vocabulary-wide)"
        elif name in ELEMENTWISE_OPS:
            key = "norms, RoPE, activations, residuals"
        else:
            key = "other ops"
        groups[key] += ev.self_cpu_time_total / 1e3 / steps
    total = sum(groups.values())
    ranked = sorted(groups.items(), key=lambda kv: -kv[1])
    return {"model": folder, "batch": batch, "threads": threads, "cpu_linear": cpu_linear, "steps": steps,
            "wall_ms_per_step": statistics.median(walls) * 1e3, "profiled_ms_per_step": total,
            "groups": {k: {"ms": v, "share": v / total} for k, v in ranked},
            **ab_summary("layer_loop", {"python": ab[False], "cpp": ab[True]}),
            **ab_summary("stream", {"gemm": stream_ab.get(False, []), "gemv": stream_ab.get(True, [])})}


def ab_summary(name: str, sides: dict[str, list[float]]) -> dict:
    """An interleaved A/B's JSON: per side the median ms (``NAME_ms``, as before) and the min-max
    (``NAME_spread_ms``), and first / second as the median of adjacent steps' ratios with its spread
    (``NAME_ratio``): a median alone hid a noisy A/B. Empty where the A/B did not run."""
    xs, ys = sides.values()
    if not xs or not ys:
        return {f"{name}_ms": {}, f"{name}_spread_ms": {}}
    ms = {k: [x * 1e3 for x in v] for k, v in sides.items()}
    return {f"{name}_ms": {k: statistics.median(v) for k, v in ms.items()},
            f"{name}_spread_ms": {k: [min(v), max(v)] for k, v in ms.items()},
            f"{name}_ratio": record.pair_ratios(xs, ys)}


def _ab_line(r: dict, name: str, a: str, b: str) -> str:
    """``A x ms [lo-hi], B y ms [lo-hi] (ratio, lo-hi)`` of an A/B in ``profile``'s result."""
    ms, spread, ratio = r[f"{name}_ms"], r[f"{name}_spread_ms"], r[f"{name}_ratio"]
    a_ms, b_ms = (f"{ms[k]:.1f} ms [{spread[k][0]:.1f}-{spread[k][1]:.1f}]" for k in (a, b))
    return (f"{a_ms} vs {b_ms}: {ratio['median']:.2f}x (adjacent-step ratios {ratio['min']:.2f}-"
            f"{ratio['max']:.2f}, {ratio['n']} pairs)")


def main(argv: list[str] | None = None) -> int:
    from gambit.bench import args as bench_args
    from gambit.checks import at_least
    from gambit.config_cli import DefaultsFormatter

    p = argparse.ArgumentParser(prog="gambit bench profile", formatter_class=DefaultsFormatter,
                                description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2", help="model folder or registered name (default smollm2)")
    p.add_argument("--batch", type=int, default=16, help="decode batch size (traces per step)")
    p.add_argument("--steps", type=int, default=5, help="decode steps timed, then profiled")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--cpu-linear", default="transposed", choices=("transposed", "packed", "plain"),
                   help="EngineConfig.cpu_linear: weight layout/kernel of the linear layers")
    p.add_argument("--compare-layers", action="store_true",
                   help="also time steps with the Python and the C++ layer loop, interleaved (ms medians)")
    p.add_argument("--compare-stream", action="store_true",
                   help="also time steps with one-row products through cpu_gemv and through MKL/oneDNN, "
                        "alternating (ms medians; batch 1 is where it applies)")
    p.add_argument("--json", default=None, help="write the result JSON here")
    args = p.parse_args(argv)
    # before the model loads: 0 steps left no step to take the median of, 0 threads torch refuses
    at_least(1, **{"--batch": args.batch, "--steps": args.steps, "--threads": args.threads})
    folder = bench_args.model("--model", args.model)
    bench_args.out_path("--json", args.json)  # written after the profile: checked first
    r = profile(str(folder), args.batch, args.steps, args.threads, args.cpu_linear,
                args.compare_layers, args.compare_stream)
    print(f"batch {r['batch']}, {r['threads']} threads, cpu_linear={r['cpu_linear']}: "
          f"{r['wall_ms_per_step']:.1f} ms per step unprofiled, {r['profiled_ms_per_step']:.1f} ms profiled")
    if r["layer_loop_ms"]:
        print("step with the Python layer loop vs the C++ one, median [min-max]: "
              + _ab_line(r, "layer_loop", "python", "cpp"))
    if r["stream_ms"]:
        print("step with MKL/oneDNN one-row products vs streamed through cpu_gemv, median [min-max]: "
              + _ab_line(r, "stream", "gemm", "gemv"))
    print("| part | ms / step | share |\n|---|---:|---:|")
    for k, g in r["groups"].items():
        print(f"| {k} | {g['ms']:.2f} | {g['share']:.1%} |")
    if args.json:
        record.write_json({**r, "provenance": record.provenance("profile", argv, {"sampling": 1})}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
