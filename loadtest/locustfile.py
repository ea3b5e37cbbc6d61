"""Locust load test of gambit.v1.ReasoningService (gRPC, server-streaming Solve).

Each user calls Solve and reads the stream; two entries per run: "Solve first event" (time to the
first stream event, TTFT) and "Solve end to end" (to the Result). A mix of problem sizes (2-3, 4-6,
7-8 operations; or with --benchmark gsm8k a graded benchmark's questions, read by its answer rule) and
methods (gambit, sc, step, deepconf); a fraction of runs is cancelled with
CancelRun after their first progress event ("CancelRun" entry, and "Solve cancelled" for those runs).

    locust -f loadtest/locustfile.py --headless --host 127.0.0.1:9000 -u 4 -r 2 -t 60s
    make loadtest   # starts a local deployment, runs this bounded, prints the summary table + CSV

At the end it prints TTFT / end-to-end percentiles, throughput (runs/s, generated tokens/s) and
failures as a table, and writes it as CSV (--summary-csv).
"""

from __future__ import annotations

import csv
import os
import random
import threading
import time
from pathlib import Path

import grpc
import grpc.experimental.gevent as grpc_gevent
from locust import User, between, events, task

grpc_gevent.init_gevent()  # gRPC's blocking calls must yield to gevent, or one user stalls them all

# (name, weight, min_ops, max_ops, method, capacity, max_tokens)
MIX = (
    ("small-gambit", 4, 2, 3, "gambit", 4, 96),
    ("small-sc", 2, 2, 3, "sc", 4, 96),
    ("medium-gambit", 3, 4, 6, "gambit", 6, 160),
    ("medium-step", 1, 4, 6, "step", 4, 160),
    ("medium-deepconf", 1, 4, 6, "deepconf", 4, 160),
    ("large-gambit", 1, 7, 8, "gambit", 8, 224),
)
ENTRIES = ("Solve first event", "Solve end to end", "Solve cancelled", "CancelRun")
_tokens = {"generated": 0, "runs": 0}
_by_mix: dict[str, list[int]] = {}  # mix entry -> [finished runs, right answers] (their sums: the totals)
_lock = threading.Lock()


@events.init_command_line_parser.add_listener
def _args(parser):
    parser.add_argument("--application", default="gambit", help="Ray Serve application (gRPC metadata)")
    parser.add_argument("--token-env", default="GAMBIT_TOKEN", help="env var with the bearer token")
    parser.add_argument("--cancel-fraction", type=float, default=0.1, help="share of runs cancelled")
    parser.add_argument("--max-tokens-scale", type=float, default=1.0, help="scale every mix's max_tokens")
    parser.add_argument("--problem-seed", type=int, default=0, help="seed of the problem pool")
    parser.add_argument("--summary-csv", default="results/loadtest_summary.csv", help="summary CSV path")
    parser.add_argument("--benchmark", default="", help="graded benchmark whose questions are sent "
                        "(gsm8k | aime25 | hmmt24 | hmmt25 | gpqa; '' = the arithmetic task)")
    parser.add_argument("--data", default="", help="the benchmark's JSONL file ('' = ../shared/datasets/)")


def _problems(opts) -> dict[tuple[int, int], list[tuple[str, str, str]]]:
    from gambit.ops.loadtest import problem_pool

    return problem_pool([(lo, hi) for _, _, lo, hi, *_ in MIX], opts.problem_seed, opts.benchmark, opts.data)


class SolveUser(User):
    """One backend calling Solve in a loop."""

    wait_time = between(0.05, 0.3)

    def on_start(self):
        from gambit.serving.protos import load

        opts = self.environment.parsed_options
        self.pb2, grpc_mod = load("reasoning")
        self.channel = grpc.insecure_channel(self.host)
        self.stub = grpc_mod.ReasoningServiceStub(self.channel)
        token = os.environ.get(opts.token_env, "") if opts.token_env else ""
        self.md = ((("authorization", f"Bearer {token}"),) if token else ()) + (
            (("application", opts.application),) if opts.application else ())
        self.problems = _problems(opts)
        self.rng = random.Random(f"{opts.problem_seed}:{id(self)}")
        self.cancel_fraction = opts.cancel_fraction
        self.scale = opts.max_tokens_scale

    def on_stop(self):
        self.channel.close()

    def _fire(self, name, t0, exc=None, length=0):
        self.environment.events.request.fire(request_type="grpc", name=name,
                                             response_time=(time.perf_counter() - t0) * 1000,
                                             response_length=length, exception=exc, context={})

    @task
    def solve(self):
        name, _, lo, hi, method, capacity, max_tokens = self.rng.choices(MIX, weights=[m[1] for m in MIX])[0]
        problem, answer_rule, gold = self.rng.choice(self.problems[(lo, hi)])
        cancel = self.rng.random() < self.cancel_fraction
        req = self.pb2.SolveRequest(problem=problem, method=method, capacity=capacity,
                                    max_tokens=max(1, int(max_tokens * self.scale)),
                                    seed=self.rng.randrange(2**31), answer_rule=answer_rule)
        t0 = time.perf_counter()
        first = None
        run_id = ""
        result = None
        try:
            for ev in self.stub.Solve(req, metadata=self.md, timeout=600):
                if first is None:
                    first = time.perf_counter()
                    self._fire("Solve first event", t0)
                kind = ev.WhichOneof("event")
                if kind == "started":
                    run_id = ev.started.run_id
                elif kind == "progress" and cancel and run_id:
                    tc = time.perf_counter()
                    try:
                        self.stub.CancelRun(self.pb2.CancelRunRequest(run_id=run_id), metadata=self.md,
                                            timeout=30)
                        self._fire("CancelRun", tc)
                    except grpc.RpcError as e:
                        self._fire("CancelRun", tc, exc=RuntimeError(f"{e.code().name}: {e.details()}"))
                    cancel = False  # once
                    run_id = ""
                elif kind == "result":
                    result = ev.result
        except grpc.RpcError as e:
            entry = "Solve first event" if first is None else "Solve end to end"
            self._fire(entry, t0, exc=RuntimeError(f"{name}: {e.code().name}: {e.details()}"))
            return
        cancelled = result is not None and result.status == "cancelled"
        entry = "Solve cancelled" if cancelled else "Solve end to end"
        if result is None:
            self._fire(entry, t0, exc=RuntimeError(f"{name}: stream ended without a result"))
        elif result.status not in ("done", "cancelled"):
            self._fire(entry, t0, exc=RuntimeError(f"{name}: run ended {result.status}: {result.message}"))
        else:
            self._fire(entry, t0, length=result.generated_tokens)
            with _lock:
                _tokens["generated"] += result.generated_tokens
                _tokens["runs"] += 1
                if result.status == "done":
                    mix = _by_mix.setdefault(name, [0, 0])
                    mix[0] += 1
                    mix[1] += result.answer == gold


def summary_rows(stats, elapsed_s: float) -> list[dict]:
    """One row per entry: count, failures, p50/p95/p99 (ms), and throughput."""
    rows = []
    for name in ENTRIES:
        e = stats.entries.get((name, "grpc"))
        if e is None or e.num_requests + e.num_failures == 0:
            continue
        rows.append({"entry": name, "requests": e.num_requests, "failures": e.num_failures,
                     "p50_ms": e.get_response_time_percentile(0.5),
                     "p95_ms": e.get_response_time_percentile(0.95),
                     "p99_ms": e.get_response_time_percentile(0.99), "mean_ms": round(e.avg_response_time, 1),
                     "per_s": round(e.num_requests / max(elapsed_s, 1e-9), 3)})
    return rows


_t_start = {"t": None}


@events.test_start.add_listener
def _on_start(environment, **_):
    _t_start["t"] = time.perf_counter()


@events.quitting.add_listener
def _on_quit(environment, **_):
    if _t_start["t"] is None:
        return
    elapsed = time.perf_counter() - _t_start["t"]
    rows = summary_rows(environment.stats, elapsed)
    tot = environment.stats.total
    done, right = (sum(c[i] for c in _by_mix.values()) for i in (0, 1))
    print(f"\nGambit load test: {elapsed:.1f} s, {_tokens['runs']} runs with a result, "
          f"{_tokens['generated'] / elapsed:.1f} generated tokens/s, {tot.num_failures} failures; "
          f"answers right {right} of {done} finished runs ({100 * right / max(done, 1):.1f}%)")
    print(f"{'entry':<20} {'requests':>8} {'failures':>8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} "
          f"{'mean ms':>8} {'per s':>7}")
    for r in rows:
        print(f"{r['entry']:<20} {r['requests']:>8} {r['failures']:>8} {r['p50_ms']:>8} {r['p95_ms']:>8} "
              f"{r['p99_ms']:>8} {r['mean_ms']:>8} {r['per_s']:>7}")
    if _by_mix:
        print("right answers by mix entry: " + ", ".join(
            f"{k} {r}/{n}" for k, (n, r) in sorted(_by_mix.items())))
    for err in environment.stats.errors.values():
        print(f"failure: {err.name}: {err.error} x{err.occurrences}")
    path = Path(environment.parsed_options.summary_csv)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["entry", "requests", "failures", "p50_ms", "p95_ms", "p99_ms",
                                          "mean_ms", "per_s"])
        w.writeheader()
        w.writerows(rows)
        f.write(f"# elapsed_s={elapsed:.1f} runs={_tokens['runs']} generated_tokens={_tokens['generated']} "
                f"tokens_per_s={_tokens['generated'] / elapsed:.1f} failures={tot.num_failures} "
                f"finished={done} correct={right}\n")
    print(f"wrote {path}")
