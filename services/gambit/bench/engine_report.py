"""Rows, ratios and the printed table of ``gambit bench engine``: per-round results joined per batch
size, the median over rounds with its spread, and the table the run prints."""

from __future__ import annotations

import statistics

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
