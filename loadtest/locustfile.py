"""Locust load test of gambit.v1.ReasoningService (gRPC, server-streaming Solve).

Each user calls Solve and reads the stream; two entries per run: "Solve first event" (time to the
first stream event, RunStarted, sent at admission: TTFT in the README's table) and "Solve end to end"
(to the Result). A failed call is its own entry, "<entry> (failed)", so the percentiles are those of the
calls that succeeded. A mix of problem sizes (2-3, 4-6, 7-8 operations; or with --benchmark gsm8k a graded
benchmark's questions, read by its answer rule) and methods (gambit, sc, step, deepconf); a fraction of
runs is cancelled with CancelRun after their first progress event ("CancelRun" entry, and "Solve
cancelled" for those runs). Options: loadtest/README.md (Locust's --help does not list them).

    locust -f loadtest/locustfile.py --headless --host 127.0.0.1:9000 -u 4 -r 2 -t 60s
    make loadtest   # starts a local deployment, runs this bounded, prints the summary table + CSV

At the end it prints TTFT / end-to-end percentiles (end to end also per method: "end to end gambit",
...), throughput (runs/s, generated tokens/s) and failures (grouped by entry and gRPC code, one sample
of the details each) as a table, and writes it as CSV (--summary-csv; the totals beside it in
<name>.totals.json).
"""

from __future__ import annotations

import collections
import itertools
import random
import re
import sys
import threading
import time

import gevent
import grpc
import grpc.experimental.gevent as grpc_gevent
from locust import User, between, events, task

from gambit.ops.loadtest_config import MIX, check_options, problem_pool
from gambit.ops.loadtest_summary import (
    FAILED,
    failure_kind,
    failure_lines,
    method_rows,
    run_totals,
    summary_lines,
    summary_rows,
    totals_path,
    write_summary,
)
from gambit.serving.security import check_address, open_channel, read_token

grpc_gevent.init_gevent()  # gRPC's blocking calls must yield to gevent, or one user stalls them all

_tokens = {"generated": 0, "runs": 0}
_by_mix: dict[str, list[int]] = {}  # mix entry -> [finished runs, right answers] (their sums: the totals)
_samples: dict[tuple[str, str], str] = {}  # (entry, failure kind) -> the first one's details
_method_ms: dict[str, list[float]] = {}  # method -> end-to-end ms of its runs with a result, not cancelled
_method_failed: collections.Counter[str] = collections.Counter()  # method -> its failed Solve calls
_user_index = itertools.count()  # spawn order: seeds each user's draws reproducibly
_lock = threading.Lock()


@events.init_command_line_parser.add_listener
def _args(parser):
    parser.add_argument("--application", default="gambit", help="Ray Serve application (gRPC metadata)")
    parser.add_argument("--token-env", default="GAMBIT_TOKEN", help="env var with the bearer token "
                        "('' = send none)")
    parser.add_argument("--cancel-fraction", type=float, default=0.1,
                        help="share of runs cancelled after their first progress event, 0-1")
    parser.add_argument("--max-tokens-scale", type=float, default=1.0,
                        help="scales every mix entry's max_tokens (96-224), > 0 and <= 19173961")
    parser.add_argument("--problem-seed", type=int, default=0,
                        help="seed of the problem pool and of each user's draws (with its index)")
    parser.add_argument("--summary-csv", default="results/loadtest_summary.csv",
                        help="summary CSV path, totals in <name>.totals.json ('' = none)")
    parser.add_argument("--benchmark", default="", help="graded benchmark whose questions are sent "
                        "(gsm8k | aime25 | hmmt24 | hmmt25 | gpqa; '' = the arithmetic task)")
    parser.add_argument("--data", default="", help="the benchmark's JSONL file ('' = ../shared/datasets/)")
    parser.add_argument("--progress-s", type=float, default=10.0,
                        help="seconds between progress lines while it runs (0 = none)")
    parser.add_argument("--tls-ca", default="", help="PEM CA that signed the certificate of a TLS proxy in "
                        "front of --host ('' = plaintext, as `gambit serve` speaks)")
    parser.add_argument("--tls-server-name", default="", help="the host the proxy's certificate names, "
                        "where --host is an IP or another name")


@events.init.add_listener
def _check(environment, **_):
    """Refuse bad options at the start: run directly, a bad one made every task fail (or silently
    clamp) while the summary said "0 failures"."""
    opts = environment.parsed_options
    if opts is None:  # an Environment built without Locust's parser (a library use)
        return
    try:
        check_options(opts.cancel_fraction, opts.max_tokens_scale, opts.benchmark, opts.data,
                      opts.summary_csv, opts.tls_ca, opts.tls_server_name)
        if not opts.progress_s >= 0:
            raise ValueError(f"progress_s must be >= 0, got {opts.progress_s}")
        if not re.search(r":\d+$", environment.host or ""):  # gRPC dials 443 without one
            raise ValueError(f"--host: give the service's host:port, got {environment.host!r}")
        check_address(environment.host, "--host")
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def _problems(opts) -> dict[tuple[int, int], list[tuple[str, str, str]]]:
    return problem_pool([(lo, hi) for _, _, lo, hi, *_ in MIX], opts.problem_seed, opts.benchmark, opts.data)


class SolveUser(User):
    """One backend calling Solve in a loop."""

    wait_time = between(0.05, 0.3)

    def on_start(self):
        from gambit.serving.protos import load

        opts = self.environment.parsed_options
        self.pb2, grpc_mod = load("reasoning")
        # TLS or plaintext: gevent (init_gevent above) serves both kinds of channel
        self.channel = open_channel(self.host, opts.tls_ca, server_name=opts.tls_server_name)
        self.stub = grpc_mod.ReasoningServiceStub(self.channel)
        token = read_token(opts.token_env)  # stripped, as the servers read it
        self.md = ((("authorization", f"Bearer {token}"),) if token else ()) + (
            (("application", opts.application),) if opts.application else ())
        self.problems = _problems(opts)
        self.rng = random.Random(f"{opts.problem_seed}:{next(_user_index)}")
        self.cancel_fraction = opts.cancel_fraction
        self.scale = opts.max_tokens_scale

    def on_stop(self):
        self.channel.close()

    def _fire(self, name, t0, length=0):
        self.environment.events.request.fire(request_type="grpc", name=name,
                                             response_time=(time.perf_counter() - t0) * 1000,
                                             response_length=length, exception=None, context={})

    def _fail(self, entry, t0, kind, details, method=""):
        """A failure under "<entry> (failed)", grouped by its kind (a gRPC code), one sample kept; a
        Solve's (``method``) counted against its method too."""
        if method:
            with _lock:
                _method_failed[method] += 1
        name, kind = entry + FAILED, failure_kind(kind)
        _samples.setdefault((name, kind), details)
        self.environment.events.request.fire(request_type="grpc", name=name,
                                             response_time=(time.perf_counter() - t0) * 1000,
                                             response_length=0, exception=RuntimeError(kind), context={})

    @task
    def solve(self):
        name, _, lo, hi, method, capacity, max_tokens = self.rng.choices(MIX, weights=[m[1] for m in MIX])[0]
        problem, answer_rule, gold = self.rng.choice(self.problems[(lo, hi)])
        cancel = self.rng.random() < self.cancel_fraction
        t0 = time.perf_counter()
        first = None
        try:
            req = self.pb2.SolveRequest(problem=problem, method=method, capacity=capacity,
                                        max_tokens=max(1, int(max_tokens * self.scale)),
                                        seed=self.rng.randrange(2**31), answer_rule=answer_rule)
            t0 = time.perf_counter()
            run_id = ""
            result = None
            for ev in self.stub.Solve(req, metadata=self.md, timeout=600):
                if first is None:
                    first = time.perf_counter()
                    self._fire("Solve first event", t0)
                kind = ev.WhichOneof("event")
                if kind == "started":
                    run_id = ev.started.run_id
                elif kind == "progress" and cancel and run_id:
                    self._cancel(run_id, name)
                    cancel = False  # once
                    run_id = ""
                elif kind == "result":
                    result = ev.result
        except grpc.RpcError as e:
            entry = "Solve first event" if first is None else "Solve end to end"
            self._fail(entry, t0, e.code().name, f"{name}: {e.details()}", method)
            return
        except Exception as e:  # a crash is a failure too, not a traceback beside "0 failures"
            entry = "Solve first event" if first is None else "Solve end to end"
            self._fail(entry, t0, type(e).__name__, f"{name}: {e}", method)
            return
        self._record(name, method, gold, t0, result)

    def _cancel(self, run_id, name):
        tc = time.perf_counter()
        try:
            self.stub.CancelRun(self.pb2.CancelRunRequest(run_id=run_id), metadata=self.md, timeout=30)
            self._fire("CancelRun", tc)
        except grpc.RpcError as e:
            self._fail("CancelRun", tc, e.code().name, f"{name}: {e.details()}")

    def _record(self, name, method, gold, t0, result):
        cancelled = result is not None and result.status == "cancelled"
        entry = "Solve cancelled" if cancelled else "Solve end to end"
        if result is None:
            self._fail(entry, t0, "no result", f"{name}: the stream ended without a result", method)
        elif result.status not in ("done", "cancelled"):
            self._fail(entry, t0, f"run ended {result.status}", f"{name}: {result.message}", method)
        else:
            ms = (time.perf_counter() - t0) * 1000
            self._fire(entry, t0, length=result.generated_tokens)
            with _lock:
                if not cancelled:
                    _method_ms.setdefault(method, []).append(ms)
                _tokens["generated"] += result.generated_tokens
                _tokens["runs"] += 1
                if result.status == "done":
                    mix = _by_mix.setdefault(name, [0, 0])
                    mix[0] += 1
                    mix[1] += result.answer == gold


_t_start = {"t": None, "stopped": False}


def _failures(environment) -> tuple[int, int]:
    """(failed calls, task exceptions: a task or on_start that raised)."""
    errors = sum(row["count"] for row in environment.runner.exceptions.values())
    return environment.stats.total.num_failures, errors


def _progress(environment, every_s: float):
    while not _t_start["stopped"]:
        gevent.sleep(every_s)
        if _t_start["stopped"]:
            return
        failed, errors = _failures(environment)
        t = time.perf_counter() - _t_start["t"]
        print(f"progress: {t:.0f} s, {environment.runner.user_count} users, {_tokens['runs']} runs "
              f"with a result, {failed + errors} failures", flush=True)


@events.test_start.add_listener
def _on_start(environment, **_):
    _t_start["t"] = time.perf_counter()
    opts = environment.parsed_options
    if opts is not None and opts.progress_s > 0:
        gevent.spawn(_progress, environment, opts.progress_s)


@events.test_stop.add_listener
def _on_stop(environment, **_):
    _t_start["stopped"] = True


@events.quitting.add_listener
def _on_quit(environment, **_):
    if _t_start["t"] is None:
        return
    _t_start["stopped"] = True
    elapsed = time.perf_counter() - _t_start["t"]
    failed, errors = _failures(environment)
    totals = run_totals(elapsed, _tokens["runs"], _tokens["generated"], failed, errors, _by_mix)
    with _lock:
        by_method = {m: (list(_method_ms.get(m, ())), _method_failed[m])
                     for m in {*_method_ms, *_method_failed}}
    rows = summary_rows(environment.stats, elapsed) + method_rows(by_method, elapsed)
    kinds = [(e.name, str(e.error), e.occurrences) for e in environment.stats.errors.values()]
    kinds += [("task error", failure_kind(row["msg"]), row["count"])
              for row in environment.runner.exceptions.values()]
    print("\n" + "\n".join(summary_lines(rows, totals, _by_mix) + failure_lines(kinds, _samples)), flush=True)
    if environment.parsed_options.summary_csv:
        path = write_summary(environment.parsed_options.summary_csv, rows, totals).resolve()
        print(f"wrote {path} (totals: {totals_path(path)})", flush=True)
