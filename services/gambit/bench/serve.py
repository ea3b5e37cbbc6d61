"""``gambit bench serve``: the same runs through the embedded wiring and through Ray Serve + gRPC.

Interleaved (embedded, distributed, embedded, ...) on the same problems, seeds and scorer, so
both do the same work (the token totals are compared). Reports the wall-time ratio at one run,
the guidance-sync share (decoding blocked on the scorer / run time), throughput and latency at
1, 4 and 16 concurrent runs, and the scaling efficiency at 16 runs: the service's speed-up from 1
to 16 runs divided by the engine's own speed-up from batch C to batch 16·C (measured after each
level of each repetition, so it sees the same load as the services).

At n concurrent runs, n clients each send ``--waves`` runs back to back (a closed loop, as a load test
runs): throughput is sustained, not the makespan of one burst, whose wait for its slowest run
measures the spread of run lengths rather than the service. ``--waves 1`` gives the burst.

The wall ratio is the median over ``--one-run-pairs`` adjacent embedded/distributed pairs per
repetition of each pair's ratio (the order alternating), with their spread: on a shared machine the
speed drifts by tens of percent between hours, and a pair's two halves see the same drift, where a
ratio of medians taken over three repetitions moved by ±0.2 between runs of the same code. The
ratio of the medians is reported beside it.

The distributed wiring keeps its run records and trees in ``--store`` (a Redis) under a key prefix of
this run's own, deleted when the bench ends (``gambit.bench.serve_store``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import ClassVar

from gambit.bench import args as bench_args
from gambit.bench import record, serve_store
from gambit.bench.serve_report import finished, table
from gambit.bench.serve_runs import EngineBaseline, pct, problems, run_distributed, run_embedded
from gambit.bench.serve_runs import _threads as _threads  # re-exported: the tests drive it from here
from gambit.checks import at_least

QUICK = {"capacity": 4, "max_tokens": 96}  # `--quick` (with 2 repetitions); tools reuse it


@dataclass
class BenchServeConfig:
    """Embedded vs Ray Serve benchmark."""

    FLAG_ERRORS: ClassVar[bool] = True  # gambit.config_cli: its errors name the flags, exit 2
    capacity: int = 8  # C per run
    max_tokens: int = 160  # tokens per trace at most
    round_interval: int = 16  # Δ, decode steps
    reps: int = 3  # interleaved repetitions per system and concurrency
    concurrency: str = "1,4,16"  # concurrent runs to measure: increasing levels, the first 1
    waves: int = 3  # runs each concurrent client sends back to back (1: one burst of n runs)
    one_run_pairs: int = 4  # embedded/distributed pairs at one run per repetition; wall ratio: their median
    target_threads: int = 0  # torch threads of the Target's engine (0 = every core; embedded: the bench's)
    model: str = ""  # target model folder or name ("" = shipped target; another width: confidence scorer)
    scorer: str = ""  # scorer spec (gambit.scoring.spec): "" / process | mlp | sequence | confidence | folder
    batch_invariant: bool | None = None  # both wirings' Targets (EngineConfig; unset: on where it holds)
    grpc_port: int = 9310  # Serve gRPC port for the benchmark (its HTTP proxy takes this + 2)
    metrics_port: int = 9311  # Ray metrics port for the benchmark
    # the distributed wiring's run records and trees; password from GAMBIT_REDIS_PASSWORD
    store: str = serve_store.DEFAULT_STORE  # Redis URL (redis://HOST:PORT/DB) for the distributed runs
    prefix: str = ""  # key prefix there ("" = a fresh one per run); every key under it is deleted at the end

    def __post_init__(self) -> None:
        from gambit.ops.serve_config import check_ports

        at_least(1, capacity=self.capacity, max_tokens=self.max_tokens, reps=self.reps, waves=self.waves,
                 one_run_pairs=self.one_run_pairs)
        # before the wiring loads (a bad one was found after ~a minute of it, or not before a timeout)
        check_ports(**{"--grpc-port": self.grpc_port, "--metrics-port": self.metrics_port,
                       "the HTTP port (--grpc-port + 2)": self.grpc_port + 2})
        serve_store.check_store_url(self.store)
        need = f"concurrency: comma-separated integers >= 1, got {self.concurrency!r}"
        try:
            self.levels = [int(x) for x in self.concurrency.split(",")]
        except ValueError:
            raise ValueError(need) from None
        if not self.levels or min(self.levels) < 1:
            raise ValueError(need)
        if self.levels[0] != 1 or self.levels != sorted(set(self.levels)):  # the one-run wall ratio and the
            # scaling from it read levels[0] as one run: "2,4" printed its 2-run figures as "1 run"
            raise ValueError(f"concurrency: increasing levels starting at 1 (the one-run wall ratio and the "
                             f"scaling are measured from 1 run), got {self.concurrency!r}")
        if self.model:  # "": the shipped target (these two import torch: last)
            bench_args.model("--model", self.model)
        bench_args.scorer("--scorer", self.scorer)  # "": the shipped process scorer


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def serve_config(cfg: BenchServeConfig, prefix: str):
    """The distributed wiring's ``ServeConfig``: the bench's ports, model, scorer, store and prefix."""
    from gambit.deployments import local

    return local.ServeConfig(grpc_port=cfg.grpc_port, http_port=cfg.grpc_port + 2,
                             metrics_port=cfg.metrics_port, model=cfg.model, scorer=cfg.scorer,
                             tree=cfg.store, prefix=prefix, target_threads=cfg.target_threads,
                             batch_invariant=cfg.batch_invariant, token_env="GAMBIT_BENCH_NO_TOKEN")


def bench(cfg: BenchServeConfig, got: dict | None = None) -> dict:
    """Both wirings measured; the store's keys under this run's prefix deleted at the end, run or fail.
    ``got``: filled with the walls and one-run pairs as each finishes (``finished``: what a Ctrl-C keeps)."""
    from gambit.deployments import local

    prefix = cfg.prefix or serve_store.fresh_prefix()
    scfg = serve_config(cfg, prefix)
    serve_store.check_store(cfg.store, prefix, explicit=bool(cfg.prefix))
    local.check_startable(scfg)  # ports taken, the store, the model: before the wiring loads
    try:
        return measure(cfg, scfg) if got is None else measure(cfg, scfg, got)
    finally:
        where = serve_store.shown(cfg.store)
        try:
            n = serve_store.delete_prefix(cfg.store, prefix)
            log(f"removed the bench's {n} keys under {prefix!r} from {where}")
        except serve_store.store_errors() as e:  # said; the run's own error (if any) goes on
            log(f"could not remove the bench's keys under {prefix!r} from {where}: {e}")


def measure(cfg: BenchServeConfig, scfg, got: dict | None = None) -> dict:
    """``got``: the caller's dict, filled with ``rows`` and ``ratios`` as they are measured."""
    import grpc

    from gambit.deployments import local
    from gambit.serving.embedded import Embedded, EmbeddedConfig

    log(f"starting embedded wiring and Ray Serve (store {serve_store.shown(cfg.store)}, prefix "
        f"{scfg.prefix!r}) ...")
    emb = Embedded(EmbeddedConfig(model=cfg.model, scorer=cfg.scorer, batch_invariant=cfg.batch_invariant))
    address = f"127.0.0.1:{cfg.grpc_port}"
    channel = grpc.insecure_channel(address)  # one connection for the whole benchmark, like a real client
    try:
        local.start(scfg, wait_s=600)
        baseline = EngineBaseline(cfg, emb.target)
        warm = problems(2)
        run_embedded(emb, warm, cfg)
        run_distributed(address, warm, cfg, channel)
        got = {} if got is None else got
        rows: dict[tuple[str, int], list[dict]] = got.setdefault("rows", {})
        # distributed / embedded wall of each adjacent one-run pair (the order alternating): a pair is
        # close in time, so the machine's drift between hours cancels in its ratio
        ratios: list[float] = got.setdefault("ratios", [])
        got["prefix"] = scfg.prefix
        for rep in range(cfg.reps):
            for n in cfg.levels:
                ps = problems(n * cfg.waves)  # n clients, each sending `waves` runs back to back
                for pair in range(cfg.one_run_pairs if n == 1 else 1):
                    walls = {}
                    names = ("embedded", "distributed")
                    for name in names if (rep + pair) % 2 == 0 else names[::-1]:  # interleaved
                        t0 = time.perf_counter()
                        res = (run_embedded(emb, ps, cfg, n) if name == "embedded"
                               else run_distributed(address, ps, cfg, channel, n))
                        walls[name] = wall = time.perf_counter() - t0
                        rows.setdefault((name, n), []).append({"wall": wall, "runs": res})
                        log(f"rep {rep + 1}/{cfg.reps}  {name:11s}  {n:2d} runs  {wall:6.2f} s  "
                            f"{sum(r['tokens'] for r in res)} tokens")
                    if n == 1:
                        ratios.append(walls["distributed"] / walls["embedded"])
                baseline.measure(n)  # the engine alone at batch n*C, under the same load
    finally:
        channel.close()
        emb.close()
        local.stop()
    speedup = baseline.speedup()
    out: dict = {"config": {**asdict(cfg), "store": serve_store.shown(cfg.store), "prefix": scfg.prefix},
                 "systems": {}}
    for name in ("embedded", "distributed"):
        conc = []
        for n in cfg.levels:
            reps = rows[(name, n)]
            walls = [r["wall"] for r in reps]
            lats = [x["latency"] for r in reps for x in r["runs"]]
            conc.append({"runs": n, "runs_per_s": n * cfg.waves / statistics.median(walls),
                         "wall_s": statistics.median(walls),
                         "wall_spread_s": [min(walls), max(walls)], "p50_s": pct(lats, 0.5),
                         "p95_s": pct(lats, 0.95),
                         # the run as its driver timed it (engine side), against the client's latency
                         "run_p50_s": pct([x["total"] for r in reps for x in r["runs"]], 0.5),
                         "tokens": reps[0]["runs"] and sum(x["tokens"] for x in reps[0]["runs"])})
        one = [x for r in rows[(name, cfg.levels[0])] for x in r["runs"]]
        sync_share = statistics.median(x["sync"] / x["total"] for x in one if x["total"])
        out["systems"][name] = {"concurrency": conc, "sync_share": sync_share}
    d, e = out["systems"]["distributed"], out["systems"]["embedded"]
    top = cfg.levels[-1]
    svc_speedup = d["concurrency"][-1]["runs_per_s"] / d["concurrency"][0]["runs_per_s"]
    of_medians = d["concurrency"][0]["wall_s"] / e["concurrency"][0]["wall_s"]
    out.update({
        "wall_ratio": statistics.median(ratios) if ratios else of_medians,
        "wall_ratio_spread": [min(ratios), max(ratios)] if ratios else [of_medians, of_medians],
        "wall_ratio_pairs": len(ratios),
        "wall_ratio_values": ratios,
        "wall_ratio_of_medians": of_medians,
        "sync_share": d["sync_share"],
        "engine_speedup": {str(k): v for k, v in speedup.items()},
        "service_speedup": svc_speedup,
        "scaling_efficiency": svc_speedup / speedup[top],
        "embedded_scaling_efficiency": (e["concurrency"][-1]["runs_per_s"]
                                        / e["concurrency"][0]["runs_per_s"])
        / speedup[top],
        "concurrency": d["concurrency"],
        "same_tokens": all(a["tokens"] == b["tokens"] for a, b in zip(d["concurrency"], e["concurrency"],
                                                                        strict=True)),
    })
    return out


def main(argv: list[str] | None = None) -> int:
    from gambit.config_cli import DefaultsFormatter, add_dataclass_args, from_args

    p = argparse.ArgumentParser(prog="gambit bench serve", formatter_class=DefaultsFormatter,
                                description=__doc__.split("\n")[0])
    add_dataclass_args(p, BenchServeConfig)
    p.add_argument("--quick", action="store_true", help="C=4, 96 tokens, 2 repetitions")
    p.add_argument("--json", help="write the result JSON here")
    p.add_argument("--plot", help="write a PNG here: runs/s and latency by concurrency, one-run pair ratios")
    args = p.parse_args(argv)
    fixed = {**QUICK, "reps": 2} if args.quick else {}
    fixed = {k: v for k, v in fixed.items() if getattr(args, k, None) is None}
    cfg = from_args(BenchServeConfig, args, **fixed)
    bench_args.out_path("--json", args.json)  # written after the whole run: checked first
    bench_args.out_path("--plot", args.plot, image=True)
    seeds = {"run": "run index i of each level's problems"}
    got: dict = {}  # the walls and pairs as they finish: a Ctrl-C writes them

    def partial() -> dict | None:
        done = finished(cfg, got)
        return done and {**done, "provenance": record.provenance("serve", argv, seeds)}

    with record.on_interrupt("serve", args.json, partial):
        res = bench(cfg, got)
    res["provenance"] = record.provenance("serve", argv, seeds)
    print(table(res))
    if args.json:
        record.write_json(res, args.json)
        print(f"wrote {args.json}")
    if args.plot:
        from gambit.bench.bench_plots import plot_serve

        plot_serve(res, args.plot)
        print(f"wrote {args.plot}")
    return 0
