"""``gambit bench rounds``: the tournament's own cost, in main-thread CPU time, per round and per step.

Runs Gambit (default scorer) on the search bench's hard problems, ``concurrency`` runs at once on one
engine with the same KV sizing as ``gambit bench search``, ``--repeat`` times (seeded: every repeat
makes the same rounds), and reads the driver's CPU counters (``SearchDriver.cpu``). Reported per
repeat and as the median: µs per round for the round decision + engine fork/abort (``round``) and
the store write (``store``), µs per step for event routing, guidance and the KV-ratio check, and
the overhead share = everything but the forward, over the loop's main-thread CPU. Thread CPU time
does not grow when other processes take the cores, so this is the figure to compare before and
after a change on a shared machine (the bench's ``overhead_fraction`` is the same parts over wall).
``--profile N`` also prints cProfile's top N functions of the rounds and store writes of one repeat.

``--ops`` times a round's operations one by one on a live pool (the first run, ``--ops-steps`` steps
in), each as the best of several batches (preemption only adds time, so the minimum is what the
code costs): the round decision, one fork + abort in the engine, writing the whole pool's nodes
(memory store), one round record, the scorer on one step's boundaries, reading 8 new tokens per
resident node back from the engine traces (``SearchRun.sync_all``, what a round does for the tokens).
These are the numbers to compare between two versions on a busy machine.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time

PARTS = ("round", "store", "finish", "routing", "guidance", "kv_evict")
OVERHEAD = ("guidance", "tree", "scheduling")  # the bench's overhead_fraction parts (wall time)


def _one(model, tok, scorer, problems, args, store, profiler=None) -> dict:
    from gambit.bench.search import BenchSearchConfig, chunk_engine
    from gambit.search.driver import SearchDriver

    bcfg = BenchSearchConfig(capacity=args.capacity, concurrency=len(problems))
    engine, _ = chunk_engine(model, tok, problems, bcfg)
    driver = SearchDriver(engine, scorer, store, cpu_clock=True)
    if profiler is not None:
        _wrap(driver, profiler)
    scfg = bcfg.search()
    c0, t0 = time.thread_time(), time.perf_counter()
    ids = [driver.submit(p, scfg) for p in problems]
    res = driver.run_until_done(ids)
    cpu_total, wall = time.thread_time() - c0, time.perf_counter() - t0
    cpu = driver.cpu
    over = sum(cpu[k] for k in PARTS)
    return {"steps": driver.steps, "rounds": driver.rounds, "cpu_s": cpu_total, "wall_s": wall,
            "cpu": dict(cpu), "us_per_round": {k: 1e6 * cpu[k] / max(1, driver.rounds)
                                               for k in ("round", "store")},
            "us_per_step": {k: 1e6 * cpu[k] / max(1, driver.steps)
                            for k in ("routing", "guidance", "kv_evict")},
            "overhead_cpu_fraction": over / cpu_total, "tree_cpu_fraction":
                (cpu["round"] + cpu["store"] + cpu["finish"]) / cpu_total,
            "wall_overhead_fraction": sum(driver.timings[k] for k in OVERHEAD) / wall,
            "correct": sum(bool(r.correct) for r in res.values()),
            "branched": sum(r.branched for r in res.values()),
            "score_calls": getattr(driver, "score_calls", -1)}  # -1: a driver without the counter


def _wrap(driver, profiler) -> None:
    """Profile only the rounds and the store writes (the tournament's tree management)."""
    from gambit.search import run_state

    orig_round, orig_flush = run_state.SearchRun.do_round, run_state.SearchRun.flush
    orig_update = driver.store.update

    def do_round(self, usage):
        return profiler.runcall(orig_round, self, usage)

    def flush(self, lazy=False):
        return profiler.runcall(orig_flush, self, lazy)

    def update(run_id, up):
        return profiler.runcall(orig_update, run_id, up)

    run_state.SearchRun.do_round, run_state.SearchRun.flush = do_round, flush
    driver.store.update = update


def _best(fn, n: int, batches: int = 7) -> float:
    """Microseconds per call: the best of ``batches`` batches of ``n`` calls, in thread CPU time."""
    best = float("inf")
    for _ in range(batches):
        t = time.thread_time()
        for _ in range(n):
            fn()
        best = min(best, (time.thread_time() - t) / n)
    return 1e6 * best


def ops(model, tok, scorer, problems, args) -> dict:
    """A round's operations timed one by one on a live pool (see the module docstring)."""
    import torch

    from gambit.bench.search import BenchSearchConfig, chunk_engine
    from gambit.search.driver import SearchDriver
    from gambit.search.store import MemoryStore
    from gambit.search.tournament import plan_round
    from gambit.search.tree import RoundRecord

    bcfg = BenchSearchConfig(capacity=args.capacity, concurrency=len(problems))
    engine, _ = chunk_engine(model, tok, problems, bcfg)
    driver = SearchDriver(engine, scorer, MemoryStore(), cpu_clock=True)
    ids = [driver.submit(p, bcfg.search()) for p in problems]
    for _ in range(args.ops_steps):
        driver.step()
    run = driver.runs[ids[0]]
    c = run.cfg
    pool = [run.nodes[i] for i in sorted(run.active)]
    parent = max((n for n in pool if n.resident), key=lambda n: n.rank_score(c.rank))
    out = {"pool": len(pool), "resident": sum(n.resident for n in pool),
           "mean_depth": sum(n.depth for n in pool) / len(pool)}
    out["plan_round"] = _best(lambda: plan_round(pool, run.target, c.swap, c.warmup, c.floor, c.rank,
                                                 c.floor_refill, c.swap_ties), 200)

    def fork_abort():
        (e,) = engine.fork(parent.engine_id, 1, seeds=[1], temperatures=[parent.temperature], priority=0.5)
        engine.abort(e)

    out["fork_abort"] = _best(fork_abort, 50)
    engine._pending.clear()  # the aborts' FinishedEvents (no one routes them)
    store = MemoryStore()

    def write_pool():
        run.dirty = set(run.active)
        for n in pool:  # a round's worth of new tokens, so cached encodings do their real work
            n.tokens.extend(n.tokens[-8:])
        store.update(run.run_id, run.flush())
        for n in pool:
            del n.tokens[-8:]

    out["write_pool_nodes"] = _best(write_pool, 20)
    rec = RoundRecord(1, 8, 2, 16, 0, 16, [1, 2, 3, 4], [[5, 16], [6, 17], [7, 18], [8, 19]], 0.5, 1000, 1.0)
    out["round_record"] = _best(lambda: json.dumps(rec.to_dict()), 500)
    rows = max(1, round(len(problems) * args.capacity / 10))  # ~one boundary per 10 tokens per trace
    x = torch.randn(rows, scorer.input_size)
    keys = [f"ops:{i}" for i in range(rows)]
    out["scorer_rows"] = rows
    out["scorer_call"] = _best(lambda: scorer.score(keys, x), 50)
    resident = [n for n in pool if n.resident]

    def sync_pool():  # each resident node 8 tokens behind its engine trace, read back at a round
        for n in resident:
            del n.tokens[-8:]
            run.tokens -= 8
            c = run.conf.get(n.id)
            if c is not None:
                del c.positions[-8:], c.logprobs[-8:]
        run.synced_at = -1  # as if the engine had stepped (``sync_all`` skips otherwise)
        run.sync_all()

    out["sync_pool_8_tokens"] = _best(sync_pool, 50)
    for rid in list(driver.runs):
        driver.cancel(rid)
    return out


def summary(reps: list[dict]) -> dict:
    """The repeats' medians, and for the per-round and per-step costs their min and max (``min_*``,
    ``max_*``): a median of three alone hid whether one repeat ran on a busy machine. {} for none."""
    if not reps:
        return {}
    per = {f"us_per_round_{k}": [r["us_per_round"][k] for r in reps] for k in ("round", "store")}
    per |= {f"us_per_step_{k}": [r["us_per_step"][k] for r in reps]
            for k in ("routing", "guidance", "kv_evict")}
    med = {k: statistics.median(r[k] for r in reps) for k in
           ("overhead_cpu_fraction", "tree_cpu_fraction", "wall_overhead_fraction")}
    med |= {k: statistics.median(v) for k, v in per.items()}
    med |= {"finish_cpu_s": statistics.median(r["cpu"]["finish"] for r in reps)}
    med |= {f"min_{k}": min(v) for k, v in per.items()}
    med |= {f"max_{k}": max(v) for k, v in per.items()}
    return med


def format_summary(med: dict, n: int) -> str:
    """One line: the fractions and seconds to 4 places; each µs cost as median [min-max]."""
    costs = [k for k in med if k.startswith("us_per_")]
    other = [k for k in med if not k.startswith(("us_per_", "min_", "max_"))]
    parts = [f"{k} {med[k]:.4f}" for k in other]
    parts += [f"{k} {med[k]:.0f} [{med['min_' + k]:.0f}-{med['max_' + k]:.0f}]" for k in costs]
    return f"median of {n} repeats [min-max]: " + ", ".join(parts)


def check_args(args: argparse.Namespace) -> None:
    """The flags, before the model loads: ValueError naming the one that is wrong."""
    from gambit.bench import args as bench_args
    from gambit.checks import at_least

    at_least(1, **{"--problems": args.problems, "--threads": args.threads, "--ops-steps": args.ops_steps})
    at_least(4, **{"--capacity": args.capacity})
    at_least(0, **{"--repeat": args.repeat, "--profile": args.profile})
    if not (args.repeat or args.ops or args.profile):  # it once ran, printed nothing and exited 0
        raise ValueError("--repeat 0 measures nothing without --ops or --profile")
    if args.store:  # once checked by the first repeat's open, after the model and scorer had loaded
        from gambit.bench import serve_store
        from gambit.search.store import is_redis_url

        if not is_redis_url(args.store):
            raise ValueError(f"--store must be a redis://, rediss:// or unix:// URL (\"\" = in memory), got "
                             f"{args.store!r}")
        serve_store.check_store(args.store, "bench-rounds:", explicit=False)  # it answers
    bench_args.scorer("--scorer", args.scorer)
    bench_args.out_path("--json", args.json)  # written after the whole run: checked first


def main(argv: list[str] | None = None) -> int:
    from gambit.config_cli import DefaultsFormatter

    ap = argparse.ArgumentParser(prog="gambit bench rounds", formatter_class=DefaultsFormatter,
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--problems", type=int, default=6, help="hard test problems searched at once")
    ap.add_argument("--capacity", type=int, default=16, help="C: traces per problem")
    ap.add_argument("--repeat", type=int, default=3, help="repeats (the median is reported)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--store", default="", help="redis://... for the tree view (default: in memory)")
    ap.add_argument("--scorer", default="process", help="scorer spec: process | mlp | sequence | confidence "
                    "| a folder (gambit.scoring.spec)")
    ap.add_argument("--profile", type=int, default=0, help="print cProfile's top N functions of the rounds, "
                    "from one more repeat (default: 0 = no profile)")
    ap.add_argument("--ops", action="store_true", help="also time a round's operations one by one")
    ap.add_argument("--ops-steps", type=int, default=48, help="--ops: steps of the search before timing")
    ap.add_argument("--json", default="", help="write the result JSON here (\"\" = not written)")
    args = ap.parse_args(argv)
    check_args(args)
    import torch

    from gambit.bench.search import DIFFICULTIES
    from gambit.model.loader import load_model
    from gambit.paths import TARGET
    from gambit.scoring.spec import load_scorer_spec
    from gambit.tasks.arithmetic import TaskConfig, generate

    torch.set_num_threads(args.threads)
    print(f"loading the target and the {args.scorer} scorer ...", file=sys.stderr, flush=True)
    model, tok = load_model(str(TARGET), device="cpu", dtype="float32")
    scorer = load_scorer_spec(args.scorer, model.config.hidden_size)
    problems = generate("test", args.problems, 1, TaskConfig(*DIFFICULTIES["hard"]))
    from gambit.bench import record, serve_store

    reps: list[dict] = []
    prov = record.provenance("rounds", argv, {"problems": 1})

    def partial() -> dict | None:  # Ctrl-C: the repeats that finished
        return {"args": vars(args), "repeats": reps, "provenance": prov} if reps else None

    # a Redis store: the bench's runs under a prefix of its own, deleted at the end (they went under the
    # services' default prefix, kept a day beside the served runs)
    prefix = serve_store.fresh_prefix("rounds", sep="") if args.store else ""
    try:
        return _measure(args, argv, model, tok, scorer, problems, prefix, reps, prov, partial)
    finally:
        if prefix:
            try:
                n = serve_store.delete_prefix(args.store, prefix + ":")
                print(f"removed the bench's {n} keys under {prefix!r}", file=sys.stderr, flush=True)
            except serve_store.store_errors() as e:  # said; the run's own error (if any) goes on
                print(f"could not remove the bench's keys under {prefix!r}: {e}", file=sys.stderr, flush=True)


def _measure(args, argv, model, tok, scorer, problems, prefix: str, reps: list, prov: dict, partial) -> int:
    """The repeats, ``--ops`` and ``--profile``; the JSON written. ``prefix``: the Redis store's."""
    from gambit.bench import record
    from gambit.search import run_state
    from gambit.search.store import MemoryStore, open_store

    with record.on_interrupt("rounds", args.json, partial):
        for i in range(args.repeat):  # each a search of minutes: said as it starts
            print(f"repeat {i}: searching {args.problems} problems at C = {args.capacity} ...",
                  file=sys.stderr, flush=True)
            store = open_store(args.store, prefix) if args.store else MemoryStore()
            r = _one(model, tok, scorer, problems, args, store)
            reps.append(r)
            print(f"repeat {i}: {r['rounds']} rounds, {r['steps']} steps, {r['score_calls']} scorer calls; "
                  f"µs/round round "
                  f"{r['us_per_round']['round']:.0f} store {r['us_per_round']['store']:.0f}; µs/step routing "
                  f"{r['us_per_step']['routing']:.0f} guidance {r['us_per_step']['guidance']:.0f}; overhead "
                  f"{100 * r['overhead_cpu_fraction']:.2f}% of CPU "
                  f"({100 * r['wall_overhead_fraction']:.2f}% of wall)")
    med = summary(reps)
    if med:
        print(format_summary(med, len(reps)))
    out = {"args": vars(args), "repeats": reps, "median": med, "provenance": prov}
    if args.ops:
        out["ops"] = ops(model, tok, scorer, problems, args)
        print("ops (µs, best of batches): " + ", ".join(
            f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in out["ops"].items()))
    if args.profile:
        prof = cProfile.Profile()
        store = open_store(args.store, prefix) if args.store else MemoryStore()
        orig = run_state.SearchRun.do_round, run_state.SearchRun.flush
        try:
            _one(model, tok, scorer, problems, args, store, prof)
        finally:
            run_state.SearchRun.do_round, run_state.SearchRun.flush = orig
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(args.profile)
        print(s.getvalue())
    if args.json:
        record.write_json(out, args.json)
        print(f"wrote {args.json}")
    return 0
