"""``gambit bench linears``: each CPU GEMM backend at a model's linear shapes, the measurement behind
``engine/linear.py``'s choices (transposed layout, MKL-packed, oneDNN-packed).

For every weight shape of the model (fused q/k/v, o, fused gate/up, down, LM head) and every row count,
the backends run in turn (A B C A B C ...) on random fp32 weights; the table gives the median µs per
call over ``--repeats`` rounds and the weight bytes read per second, and the JSON the same.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def shapes(cfg) -> dict[str, tuple[int, int]]:
    """name → (in, out) of each distinct linear of a Llama-family config."""
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * d
    return {"qkv": (h, qkv), "o": (cfg.num_attention_heads * d, h), "gate_up": (h, 2 * i), "down": (i, h),
            "head": (h, cfg.vocab_size)}


def backends(ws: list):
    """name → callable(x) that multiplies x by each of the weights ``ws`` [out, in] in turn."""
    import torch
    import torch.nn.functional as F

    wts = [w.t().contiguous().t() for w in ws]
    fs = {"row-major F.linear": lambda x: [F.linear(x, w) for w in ws],
          "transposed F.linear": lambda x: [F.linear(x, w) for w in wts]}
    if torch.backends.mkl.is_available():
        pm = [torch.ops.mkl._mkl_reorder_linear_weight(w, 16) for w in ws]
        fs["MKL packed"] = lambda x: [torch.ops.mkl._mkl_linear(x, p, w, None, x.shape[0])
                                      for p, w in zip(pm, ws, strict=True)]
    if torch.backends.mkldnn.is_available():
        po = [torch.ops.mkldnn._reorder_linear_weight(w, 16) for w in ws]
        fs["oneDNN packed"] = lambda x: [torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")
                                         for p in po]
    from gambit.engine import cpu_attention

    if cpu_attention.kernel() is not None:  # one row only: cpu_gemv over the transposed layout
        from gambit.engine.cpu_gemv import gemv

        fs[GEMV] = lambda x: [gemv(x, w.t()) for w in wts]
    return fs


GEMV = "streamed gemv"
SEED = 0


def measure(folder: str, rows: list[int], repeats: int, threads: int, calls: int = 10,
            distinct_mb: float = 0.0, out: dict | None = None) -> dict:
    """``distinct_mb`` > 0: each call cycles through that many MB of distinct copies of the weight, so it
    streams from memory as a model's layers do (more than the last-level cache), not from the cache.
    ``out``: the dict filled shape by shape (a stopped run keeps the shapes it finished)."""
    import torch

    from gambit.cpu_info import cpu_vendor
    from gambit.model import load_model

    torch.set_num_threads(threads)
    torch.manual_seed(SEED)  # the weights and inputs: the same on a rerun
    cfg = load_model(folder)[0].config
    out = {} if out is None else out
    out.update({"model": folder, "threads": threads, "vendor": cpu_vendor(), "distinct_mb": distinct_mb,
                "repeats": repeats, "us": {}, "us_spread": {}, "gb_s": {}})
    todo = shapes(cfg)
    for n_shape, (name, (i, o)) in enumerate(todo.items()):
        print(f"[bench linears] shape {n_shape + 1}/{len(todo)}: {name} {i}->{o}", file=sys.stderr,
              flush=True)
        copies = max(1, round(distinct_mb * 1e6 / (i * o * 4)))
        fs = backends([torch.randn(o, i) * 0.02 for _ in range(copies)])
        for r in rows:
            x = torch.randn(r, i)
            fr = {k: f for k, f in fs.items() if k != GEMV or r == 1}
            times: dict[str, list[float]] = {k: [] for k in fr}
            for f in fr.values():
                f(x)  # warm-up
            for _ in range(repeats):
                for k, f in fr.items():
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        f(x)
                    times[k].append((time.perf_counter() - t0) / (calls * copies) * 1e6)
            key = f"{name} {i}->{o} x{r}"
            out["us"][key] = {k: statistics.median(v) for k, v in times.items()}
            out["us_spread"][key] = {k: [min(v), max(v)] for k, v in times.items()}  # over the rounds
            out["gb_s"][key] = {k: i * o * 4 / (v * 1e3) for k, v in out["us"][key].items()}
    return out


def format_table(r: dict) -> str:
    """µs per call: the median over the rounds, [min-max] beside it, and the weight GB/s at the median."""
    names = list(dict.fromkeys(n for v in r["us"].values() for n in v))
    lines = [f"CPU {r['vendor'] or '?'}, {r['threads']} threads, µs per call, median [min-max] of "
             f"{r['repeats']} interleaved rounds",
             "| shape x rows | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for k, v in r["us"].items():
        g, sp = r["gb_s"][k], r.get("us_spread", {}).get(k, {})
        lines.append(f"| {k} | " + " | ".join(
            (f"{v[n]:.0f} [{sp[n][0]:.0f}-{sp[n][1]:.0f}] ({g[n]:.1f} GB/s)" if n in sp else
             f"{v[n]:.0f} ({g[n]:.1f} GB/s)") if n in v else "—" for n in names) + " |")
    return "\n".join(lines)


def row_counts(text: str) -> list[int]:
    """``--rows``: comma-separated row counts >= 1 (0 rows timed an empty product)."""
    try:
        rows = [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"--rows must be comma-separated integers >= 1, got {text!r}") from None
    if min(rows) < 1:
        raise ValueError(f"--rows must be comma-separated integers >= 1, got {text!r}")
    return rows


def main(argv: list[str] | None = None) -> int:
    from gambit.bench import args as bench_args
    from gambit.checks import at_least, finite
    from gambit.config_cli import DefaultsFormatter

    p = argparse.ArgumentParser(prog="gambit bench linears", formatter_class=DefaultsFormatter,
                                description=" ".join(__doc__.split("\n\n")[0].split()))  # the whole sentence
    p.add_argument("--model", default="smollm2", help="model folder or registered name whose shapes to time")
    p.add_argument("--rows", default="1,16,64", help="comma-separated row counts (tokens per product)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds; the median is reported")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--distinct-mb", type=float, default=0.0,
                   help="MB of distinct weight copies each call cycles through (default: 0 = one weight, "
                        "cache-warm)")
    p.add_argument("--json", default=None, help="write the result JSON here")
    args = p.parse_args(argv)
    rows = row_counts(args.rows)
    at_least(1, **{"--repeats": args.repeats, "--threads": args.threads})  # 0 repeats: no median
    finite(**{"--distinct-mb": args.distinct_mb})
    if not 0 <= args.distinct_mb:
        raise ValueError(f"--distinct-mb must be >= 0, got {args.distinct_mb!r}")
    folder = bench_args.model("--model", args.model)
    bench_args.out_path("--json", args.json)  # written after the measurement: checked first
    from gambit.bench import record

    r: dict = {"provenance": record.provenance("linears", argv, {"torch": SEED})}
    with record.on_interrupt("linears", args.json, lambda: r if r.get("us") else None):
        measure(str(folder), rows, args.repeats, args.threads, calls=1 if args.distinct_mb else 10,
                distinct_mb=args.distinct_mb, out=r)
    print(format_table(r))
    if args.json:
        record.write_json(r, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
