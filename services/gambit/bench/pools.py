"""``gambit bench pools``: A/B of the one-OpenMP-pool rule (``gambit.engine.torch_threads``) on
embedded Gambit runs.

Each repetition starts two fresh processes, interleaved: "one pool" (the wiring as shipped) and
"two pools" (the main thread ran torch parallel work before the wiring was built, as the previous
commits' Target replica and ``bench serve`` did). Each process times `--runs` one-problem Solves
after a warm one and counts the engine thread's voluntary context switches per step.

``python -m gambit.bench.pools --child MODE C TOKENS RUNS [MODEL SCORER]`` is one such process (the
test's too); it prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MODES = ("one pool", "two pools")


def child(mode: str, capacity: int, max_tokens: int, runs: int, model: str = "", scorer: str = "") -> dict:
    """One process's figures: median Solve latency and engine-thread switches per step."""
    import torch

    torch.set_num_threads(os.cpu_count() or 1)  # every core, as the Target runs: with two pools, more
    # pooled threads than CPUs on any machine of 2+ cores (libgomp's condition for short spins)
    if mode == "two pools":  # parallel regions on the main thread: its OpenMP pool stays for its life
        x = torch.randn(512, 512)
        for _ in range(20):
            (x @ x).sum()
    from gambit.bench.serve import problems
    from gambit.engine.torch_threads import voluntary_switches
    from gambit.serving.embedded import Embedded, EmbeddedConfig
    from gambit.serving.solve_config import SolveConfig

    emb = Embedded(EmbeddedConfig(model=model, scorer=scorer))
    stats = emb.target.engine.stats  # stats.steps: the engine's forward steps
    prompt = problems(1)[0]
    cfg = SolveConfig(capacity=capacity, swap=min(2, capacity), round_interval=16, max_tokens=max_tokens,
                      seed=0)
    list(emb.solve(prompt, cfg))  # warm: kernels compiled, pools made
    tid = emb.target.engine_thread_id
    s0, n0, lat = voluntary_switches(tid), stats.steps, []
    for _ in range(runs):
        t0 = time.perf_counter()
        list(emb.solve(prompt, cfg))
        lat.append(time.perf_counter() - t0)
    steps = stats.steps - n0
    out = {"latency_s": statistics.median(lat), "steps": steps,
           "switches_per_step": (voluntary_switches(tid) - s0) / max(1, steps)}
    emb.close()
    return out


def run_child(mode: str, capacity: int = 16, max_tokens: int = 96, runs: int = 6, model: str = "",
              scorer: str = "") -> dict:
    """``child`` in a fresh process (no OpenMP settings inherited)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    out = subprocess.run([sys.executable, "-m", "gambit.bench.pools", "--child", mode, str(capacity),
                          str(max_tokens), str(runs), model, scorer], capture_output=True, text=True,
                         timeout=1200, env=env)
    if out.returncode:
        raise RuntimeError(f"{mode} process failed: {out.stderr[-3000:]}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    got["warned"] = "the engine thread slept" in out.stderr  # TargetService's check of its switches
    return got


def check_args(a: argparse.Namespace) -> None:
    """The flags, in this process: a bad one once failed in each child with a traceback of its own (and 0
    reps or runs left no median)."""
    from gambit.bench import args as bench_args
    from gambit.checks import at_least

    at_least(1, **{"--reps": a.reps, "--runs": a.runs, "--capacity": a.capacity,
                   "--max-tokens": a.max_tokens})
    if a.model:  # "": the shipped target
        bench_args.model("--model", a.model)
    bench_args.scorer("--scorer", a.scorer)  # "": the shipped process scorer
    bench_args.out_path("--json", a.json)  # written after every child: checked first


def summary(got: dict[str, list[dict]], a: argparse.Namespace, argv: list[str]) -> dict | None:
    """The JSON of the repetitions in ``got`` (None before any pair finished): per mode the median and
    min-max latency; two pools / one pool as the median of each repetition's own ratio (the two
    processes ran next to each other), its spread beside it."""
    from gambit.bench import record

    done = min(len(v) for v in got.values())
    if not done:
        return None
    res: dict = {"config": vars(a), "modes": {}, "reps_done": done,
                 "provenance": record.provenance("pools", argv, {"solve_seed": 0})}
    for mode in MODES:
        lat = [r["latency_s"] * 1e3 for r in got[mode][:done]]
        res["modes"][mode] = {"latency_ms": statistics.median(lat), "spread_ms": [min(lat), max(lat)],
                              "switches_per_step": statistics.median(r["switches_per_step"]
                                                                     for r in got[mode][:done]),
                              "latency_ms_per_rep": lat}
    pairs = record.pair_ratios(res["modes"]["two pools"]["latency_ms_per_rep"],
                               res["modes"]["one pool"]["latency_ms_per_rep"])
    res["two_over_one"], res["two_over_one_pairs"] = pairs["median"], pairs
    return res


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--child"]:
        print(json.dumps(child(argv[1], int(argv[2]), int(argv[3]), int(argv[4]), *argv[5:7])), flush=True)
        sys.stderr.flush()
        # the figures are out: skip interpreter teardown, where daemon threads still inside torch or
        # libgomp (the second pool's workers) once aborted the process ("terminate called without an
        # active exception") after a complete measurement
        os._exit(0)
    from gambit.config_cli import DefaultsFormatter

    ap = argparse.ArgumentParser(prog="gambit bench pools", formatter_class=DefaultsFormatter,
                                 description="one OpenMP pool vs two, "
                                 "interleaved fresh processes of embedded Gambit runs")
    ap.add_argument("--reps", type=int, default=4, help="interleaved repetitions (processes per mode)")
    ap.add_argument("--capacity", type=int, default=16, help="C of each run (traces; the shipped target "
                    "steps fewer than 12 rows on one thread, min_macs_per_thread, so no second pool shows)")
    ap.add_argument("--max-tokens", type=int, default=96, help="tokens per trace at most")
    ap.add_argument("--runs", type=int, default=6, help="timed Solves per process")
    ap.add_argument("--model", default="", help="target model folder or registry name (\"\" = the shipped "
                    "target; smollm2 after `gambit models fetch smollm2`)")
    ap.add_argument("--scorer", default="", help="scorer spec: \"\" = the shipped process scorer (a model "
                    "of another width: the confidence scorer) | mlp | confidence | a folder")
    ap.add_argument("--json", default="", help="write the result JSON here (\"\" = not written)")
    a = ap.parse_args(argv)
    check_args(a)
    from gambit.bench import record

    got: dict[str, list[dict]] = {m: [] for m in MODES}
    with record.on_interrupt("pools", a.json, lambda: summary(got, a, argv)):
        for rep in range(a.reps):
            for mode in MODES if rep % 2 == 0 else MODES[::-1]:  # A B B A: neither always goes first
                got[mode].append(run_child(mode, a.capacity, a.max_tokens, a.runs, a.model, a.scorer))
                last = got[mode][-1]
                print(f"rep {rep + 1}/{a.reps}  {mode:9s}  {last['latency_s'] * 1e3:6.1f} ms per run  "
                      f"{last['switches_per_step']:5.1f} switches/step", file=sys.stderr, flush=True)
    res = summary(got, a, argv)
    print(f"| wiring ({a.model or 'shipped target'}, C = {a.capacity}, {a.max_tokens} tokens) | "
          "run latency ms, median [min, max] | "
          "engine-thread voluntary switches per step |\n|---|---|---:|")
    for mode, m in res["modes"].items():
        print(f"| {mode} | {m['latency_ms']:.1f} [{m['spread_ms'][0]:.1f}, {m['spread_ms'][1]:.1f}] | "
              f"{m['switches_per_step']:.1f} |")
    r = res["two_over_one_pairs"]
    print(f"two pools / one pool: {res['two_over_one']:.2f}x run latency (median of {r['n']} per-repetition "
          f"ratios, [{r['min']:.2f}, {r['max']:.2f}]); the wiring as shipped (one pool) vs the old one")
    if a.json:  # its folder made, as every bench does (a missing results/ once lost the measurement)
        record.write_json(res, a.json)
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
