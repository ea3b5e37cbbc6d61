"""`gambit loadtest` / `make loadtest`: Locust (loadtest/locustfile.py) headless and bounded against a
local Ray Serve deployment it starts (or a running one), then checks no KV blocks are left behind.

The pure parts (the mix, option checks, summary rows, failure grouping, the summary files) live here so
the locustfile and ``gambit loadtest`` share them and tests need neither Locust nor Ray."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import ClassVar

from gambit.checks import above, at_least, finite, within
from gambit.paths import REPO, nearest_existing

LOCUSTFILE = REPO / "loadtest" / "locustfile.py"
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
# a failed call is fired as "<entry> (failed)": Locust times every request it is told of, so a refusal's
# 1 ms under "Solve first event" made the TTFT percentiles look fast exactly when the service failed
FAILED = " (failed)"
# SolveRequest.max_tokens is a uint32: a larger scale crashed every task with "Value out of range"
MAX_TOKENS_SCALE = (2**32 - 1) // max(m[6] for m in MIX)
MAX_USERS = 10_000  # gevent users in one Locust process; more is a typo, not a load test
FAILURE_LINES = 20  # failure kinds printed after the table (all of them are in Locust's failures CSV)
INTERRUPTED = 130  # exit code after Ctrl-C, as a shell reports SIGINT
LOCAL_ONLY = ("model", "num_blocks", "num_cpus", "grpc_port", "http_port", "metrics_port")


@dataclass
class LoadTestConfig:
    FLAG_ERRORS: ClassVar[bool] = True  # gambit.config_cli: its errors name the flags, exit 2
    address: str = ""  # host:port of a running deployment ("" = start a local one; no local-only options)
    users: int = 4  # concurrent Locust users, 1-10000 (each runs one Solve at a time)
    spawn_rate: float = 2.0  # users started per second (finite, > 0)
    run_time_s: int = 60  # seconds of load, >= 1 (in-flight runs then finish, bounded by stop_timeout_s)
    stop_timeout_s: int = 120  # seconds (>= 0) users get to finish their current run after run_time_s
    cancel_fraction: float = 0.1  # share of runs cancelled after their first progress event, 0-1
    max_tokens_scale: float = 1.0  # scales every mix entry's max_tokens (96-224), > 0 and <= 19173961
    problem_seed: int = 0  # seed of the problem pool and of each user's draws (with the user's index)
    token_env: str = "GAMBIT_TOKEN"  # env var with the bearer token
    # a TLS-terminating proxy in front of --address (Serve's own port is plaintext)
    tls_ca: str = ""  # PEM CA that signed the certificate of a TLS proxy at --address ("" = plaintext)
    tls_server_name: str = ""  # the host the proxy's certificate names (--address an IP or another name)
    csv_prefix: str = "results/loadtest"  # Locust's own CSVs (<prefix>_stats.csv, ...), from this folder
    summary_csv: str = "results/loadtest_summary.csv"  # summary table CSV (+ <name>.totals.json; "" = none)
    num_blocks: int = 0  # local deployment: KV blocks per Target, >= 0 (0 = from the memory budget)
    num_cpus: int = 2  # local deployment: CPUs Ray may schedule on, >= 1
    model: str = ""  # local deployment: target model, a folder or a name like smollm2 ("" = shipped target)
    grpc_port: int = 9000  # local deployment: Serve's gRPC proxy port, 1-65535
    http_port: int = 8000  # local deployment: Serve's HTTP proxy port, 1-65535
    metrics_port: int = 8080  # local deployment: Ray's Prometheus metrics port, 1-65535
    # questions of a graded benchmark instead of the task's problems: a deployment serving a real model
    benchmark: str = ""  # gsm8k | aime25 | hmmt24 | hmmt25 | gpqa ("" = the arithmetic task)
    data: str = ""  # the benchmark's JSONL file ("" = ../shared/datasets/, or $GAMBIT_DATASETS)

    def __post_init__(self):
        at_least(1, users=self.users, run_time_s=self.run_time_s)
        if self.users > MAX_USERS:
            raise ValueError(f"users must be <= {MAX_USERS}, got {self.users}")
        finite(spawn_rate=self.spawn_rate)  # Locust refuses inf, but only after Ray started
        above(0, spawn_rate=self.spawn_rate)
        at_least(0, stop_timeout_s=self.stop_timeout_s)
        at_least(1, num_cpus=self.num_cpus)
        at_least(0, num_blocks=self.num_blocks)
        for name in ("grpc_port", "http_port", "metrics_port"):
            within(1, 65535, **{name: getattr(self, name)})
        # Locust runs from the repo root: a relative path is the caller's, so make it absolute here
        self.data, self.csv_prefix, self.summary_csv, self.tls_ca = (
            absolute(p) for p in (self.data, self.csv_prefix, self.summary_csv, self.tls_ca))
        if not self.csv_prefix:
            raise ValueError("csv_prefix: give a path prefix for Locust's CSVs, e.g. results/loadtest")
        check_writable("csv_prefix", self.csv_prefix + "_stats.csv")
        check_options(self.cancel_fraction, self.max_tokens_scale, self.benchmark, self.data,
                      self.summary_csv, self.tls_ca, self.tls_server_name)
        if self.tls_ca and not self.address:
            raise ValueError("tls_ca: the local deployment the load test starts speaks plaintext; --tls-ca "
                             "is for --address of a TLS-terminating proxy in front of one")
        if self.address:  # "" is the local deployment; any other value a target as `gambit client` takes
            check_no_local_options(self)
            from gambit.serving.client import check_host_port
            from gambit.serving.security import check_address

            check_address(self.address)
            check_host_port(self.address)  # "localhost" dialled port 443 and every call failed the whole run


def absolute(path: str) -> str:
    """``path`` against this process's folder ("" stays ""): what the caller meant, wherever Locust runs."""
    return str(Path(path).expanduser().resolve()) if path else ""


def check_no_local_options(cfg: LoadTestConfig) -> None:
    """With --address nothing is started here, so options that only shape the local deployment would be
    ignored without a word (``--model smollm2 --address X`` ran against the shipped target)."""
    given = [f"--{f.name.replace('_', '-')}" for f in fields(cfg)
             if f.name in LOCAL_ONLY and getattr(cfg, f.name) != f.default]
    if given:
        raise ValueError(f"{', '.join(given)} only shape the local deployment the load test starts; with "
                         "--address it runs against that deployment as it is: leave them out (or --address)")


def check_writable(name: str, path: str) -> None:
    """A file written at the end of the run: said at the start, not after Ray's start and the whole run."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{name}: {path} is a folder; give a file path")
    parent = nearest_existing(p.parent)  # the missing folders are made
    if not parent.is_dir():
        raise ValueError(f"{name}: {parent} is not a folder, so {path} cannot be written")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{name}: no permission to write in {parent}")


def check_options(cancel_fraction: float, max_tokens_scale: float, benchmark: str = "", data: str = "",
                  summary_csv: str = "", tls_ca: str = "", tls_server_name: str = "") -> None:
    """The locustfile's own options; ``gambit loadtest`` and Locust run directly (its init event) both
    check them, since a bad one made every task fail while the summary said "0 failures" (a missing CA
    file: every call UNAVAILABLE)."""
    from gambit.serving.security import check_client_tls

    within(0, 1, cancel_fraction=cancel_fraction)
    check_client_tls("tls_", tls_ca, server_name=tls_server_name)
    if not 0 < max_tokens_scale <= MAX_TOKENS_SCALE:  # NaN too
        raise ValueError(f"max_tokens_scale must be > 0 and <= {MAX_TOKENS_SCALE} (max_tokens is a uint32), "
                         f"got {max_tokens_scale}")
    from gambit.tasks.graded import check_benchmark

    check_benchmark(benchmark, data)
    if summary_csv:
        check_writable("summary_csv", summary_csv)
    problem_pool(((2, 3),), 0, benchmark, data)  # a missing file is said before Ray starts


def problem_pool(sizes, seed: int, benchmark: str = "", data: str = "",
                 per_size: int = 40) -> dict[tuple[int, int], list[tuple[str, str, str]]]:
    """(problem, answer_rule, gold) for each (min_ops, max_ops) of the mix: the task's test problems, or
    with ``benchmark`` its questions for every size (both sent bare, as a backend sends them: the Target
    applies its model's format; the rule reads the benchmark's answers). ``gold``: a right run's
    ``Result.answer``, so the load test counts the answers it got right under load."""
    if benchmark:
        from gambit.tasks.graded import answer_kind, gold_key, load_graded

        items = load_graded(benchmark, data)
        pool = [(it.prompt, answer_kind(it), gold_key(it)) for it in items]
        return {size: pool for size in sizes}
    from gambit.tasks.arithmetic import TaskConfig, generate

    return {(lo, hi): [(p.question, "", str(p.answer)) for p in generate("test", per_size, seed,
                                                                         TaskConfig(lo, hi))]
            for lo, hi in dict.fromkeys(sizes)}


def failure_kind(text: str) -> str:
    """The group a failure is counted in: Locust groups by the exact message, and the server's details
    (free KV blocks, a run id) split one overload into dozens of "x1" lines that pushed the table out."""
    return re.sub(r"\d+", "N", text)


def summary_rows(stats, elapsed_s: float) -> list[dict]:
    """One row per entry: every call (requests) and the failed ones; p50/p95/p99/mean (ms) and per s
    of the calls that succeeded only (failures are their own "<entry> (failed)" Locust entries)."""
    rows = []
    for name in ENTRIES:
        ok, bad = (stats.entries.get((n, "grpc")) for n in (name, name + FAILED))
        n_ok = ok.num_requests - ok.num_failures if ok is not None else 0
        n_bad = (ok.num_failures if ok is not None else 0) + (bad.num_failures if bad is not None else 0)
        if n_ok + n_bad == 0:
            continue
        row = {"entry": name, "requests": n_ok + n_bad, "failures": n_bad}
        for q in (50, 95, 99):
            row[f"p{q}_ms"] = ok.get_response_time_percentile(q / 100) if n_ok else ""
        row["mean_ms"] = round(ok.avg_response_time, 1) if n_ok else ""
        row["per_s"] = round(n_ok / max(elapsed_s, 1e-9), 3)
        rows.append(row)
    return rows


COLUMNS = ("entry", "requests", "failures", "p50_ms", "p95_ms", "p99_ms", "mean_ms", "per_s")
METHOD_ENTRY = "end to end "  # + method: the per-method rows after Locust's entries


def method_rows(by_method: dict[str, tuple[list[float], int]], elapsed_s: float) -> list[dict]:
    """"Solve end to end" split by method: (end-to-end ms of its runs with a result, failed Solve calls)
    per method. Methods differ in cost by design (a gambit run is not an sc run), so one row over the
    mix hid which method was slow or failing; cancelled runs are in neither (their end is the cancel)."""
    rows = []
    for method in sorted(by_method):
        times, n_bad = by_method[method]
        ms = sorted(times)
        row = {"entry": METHOD_ENTRY + method, "requests": len(ms) + n_bad, "failures": n_bad}
        for q in (50, 95, 99):  # nearest rank, as exact as the sample allows
            row[f"p{q}_ms"] = round(ms[max(0, -(-q * len(ms) // 100) - 1)]) if ms else ""
        row["mean_ms"] = round(sum(ms) / len(ms), 1) if ms else ""
        row["per_s"] = round(len(ms) / max(elapsed_s, 1e-9), 3)
        if row["requests"]:
            rows.append(row)
    return rows


def run_totals(elapsed_s: float, runs: int, generated: int, request_failures: int, task_errors: int,
               by_mix: dict[str, list[int]]) -> dict:
    """The headline's numbers; ``failures`` counts a task's exception too (a crashing task said 0)."""
    finished, correct = (sum(c[i] for c in by_mix.values()) for i in (0, 1))
    return {"elapsed_s": round(elapsed_s, 1), "runs": runs, "generated_tokens": generated,
            "tokens_per_s": round(generated / max(elapsed_s, 1e-9), 1),
            "failures": request_failures + task_errors, "task_errors": task_errors,
            "finished": finished, "correct": correct}


def summary_lines(rows: list[dict], totals: dict, by_mix: dict[str, list[int]]) -> list[str]:
    t = totals
    lines = [f"Gambit load test: {t['elapsed_s']:.1f} s, {t['runs']} runs with a result, "
             f"{t['tokens_per_s']:.1f} generated tokens/s, {t['failures']} failures"
             + (f" ({t['task_errors']} task errors)" if t["task_errors"] else "")
             + f"; answers right {t['correct']} of {t['finished']} finished runs "
             f"({100 * t['correct'] / max(t['finished'], 1):.1f}%)",
             "percentiles, mean and per s: the calls that succeeded",
             f"{'entry':<20} {'requests':>8} {'failures':>8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} "
             f"{'mean ms':>8} {'per s':>7}"]
    for r in rows:
        lines.append(f"{r['entry']:<20} {r['requests']:>8} {r['failures']:>8} {r['p50_ms']:>8} "
                     f"{r['p95_ms']:>8} {r['p99_ms']:>8} {r['mean_ms']:>8} {r['per_s']:>7}")
    if by_mix:
        lines.append("right answers by mix entry: " + ", ".join(
            f"{k} {r}/{n}" for k, (n, r) in sorted(by_mix.items())))
    return lines


def failure_lines(failures: list[tuple[str, str, int]], samples: dict[tuple[str, str], str],
                  limit: int = FAILURE_LINES) -> list[str]:
    """(entry, kind, count) most frequent first, each with one sample of the server's details."""
    ranked = sorted(failures, key=lambda f: (-f[2], f[0], f[1]))
    lines = [f"failure: {entry}: {kind} x{n}" + (f" (e.g. {samples[entry, kind]})"
                                                   if samples.get((entry, kind)) else "")
             for entry, kind, n in ranked[:limit]]
    if len(ranked) > limit:
        lines.append(f"... and {len(ranked) - limit} more failure kinds (Locust's <csv-prefix>_failures.csv)")
    return lines


def totals_path(summary_csv) -> Path:
    """The totals beside the summary CSV, which stays plain CSV (its "# …" line read as a data row)."""
    return Path(summary_csv).with_suffix(".totals.json")


def write_summary(path, rows: list[dict], totals: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    totals_path(path).write_text(json.dumps(totals, indent=1) + "\n")
    return path


def read_summary(path) -> tuple[list[dict], str]:
    """The rows, and the totals as one "key=value ..." line."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(ln for ln in f if not ln.startswith("#")))
    tp = totals_path(path)
    totals = json.loads(tp.read_text()) if tp.exists() else {}
    return rows, " ".join(f"{k}={v}" for k, v in totals.items())


def locust_command(cfg: LoadTestConfig, address: str, application: str = "gambit") -> list[str]:
    # --json-file: Locust's own final tables go to a file (its CSVs hold them too), so the gambit summary
    # is the last thing printed
    return [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--host", address,
            "-u", str(cfg.users), "-r", str(cfg.spawn_rate), "-t", f"{cfg.run_time_s}s",
            "--stop-timeout", str(cfg.stop_timeout_s), "--csv", cfg.csv_prefix, "--only-summary",
            "--json-file", cfg.csv_prefix + "_stats",
            "--application", application, "--token-env", cfg.token_env,
            "--cancel-fraction", str(cfg.cancel_fraction), "--max-tokens-scale", str(cfg.max_tokens_scale),
            "--problem-seed", str(cfg.problem_seed), "--tls-ca", cfg.tls_ca, "--tls-server-name",
            cfg.tls_server_name,
            "--summary-csv", cfg.summary_csv, "--benchmark", cfg.benchmark, "--data", cfg.data]


def locust_timeout_s(cfg: LoadTestConfig) -> float:
    return cfg.run_time_s + cfg.stop_timeout_s + 120


def run_locust(cfg: LoadTestConfig, address: str) -> subprocess.CompletedProcess:
    """Locust with its output captured (for tests; ``gambit loadtest`` streams it: ``stream``)."""
    Path(cfg.csv_prefix).parent.mkdir(parents=True, exist_ok=True)  # Locust opens its CSVs as they are
    return subprocess.run(locust_command(cfg, address), cwd=REPO, capture_output=True, text=True,
                          timeout=locust_timeout_s(cfg))


def stream(cmd: list[str], timeout_s: float) -> tuple[int, bool]:
    """Run ``cmd`` (Locust) with its output on this terminal as it comes (progress, and a summary no
    tail cut can drop), in its own session: a Ctrl-C (or SIGTERM) here is passed on once, as SIGTERM (a
    SIGINT is ignored where the shell started us in the background), so Locust stops early, prints its
    summary and writes its CSVs; a second one kills it. Returns (exit code, whether interrupted)."""
    sys.stdout.flush()
    sys.stderr.flush()
    proc = subprocess.Popen(cmd, cwd=REPO, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    got: list[int] = []

    def forward(signum, _frame):
        got.append(signum)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM if len(got) == 1 else signal.SIGKILL)

    main_thread = threading.current_thread() is threading.main_thread()
    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)} if main_thread else {}
    deadline = time.monotonic() + timeout_s
    try:
        # short waits: a signal another thread takes (gRPC's, Ray's) runs its handler only once this one
        # wakes, and a blocking wait held the Ctrl-C until Locust had run its whole time
        while (rc := _wait(proc, 0.2)) is None:
            if time.monotonic() > deadline:
                print(f"error: Locust still running after {timeout_s:.0f} s; stopping it", file=sys.stderr)
                proc.send_signal(signal.SIGTERM)
                if _wait(proc, 30) is None:
                    proc.kill()
                rc = proc.wait() or 1
                break
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return rc, bool(got)


def _wait(proc: subprocess.Popen, timeout_s: float) -> int | None:
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None


def target_load_when_idle(timeout_s: float = 60.0) -> dict:
    """The Target's load (runs, reserved_blocks, kv_usage) once no run is left, via a Serve handle
    (needs this process to be the local deployment's Ray driver)."""
    from ray import serve

    h = serve.get_deployment_handle("Target", app_name="gambit")
    deadline = time.monotonic() + timeout_s
    while True:
        load = h.load.remote().result(timeout_s=30)
        if load["runs"] == 0 or time.monotonic() > deadline:
            return load
        time.sleep(0.5)


def check_running(cfg: LoadTestConfig) -> str:
    """'' when a ReasoningService answers at ``cfg.address``, else the error to print (said at once, not
    after run_time_s of failed calls)."""
    from gambit.deployments import local
    from gambit.serving.security import read_token

    token = read_token(cfg.token_env)
    try:
        if cfg.tls_ca:
            tls_ready(cfg, token)
        else:
            local.wait_ready(cfg.address, wait_s=10.0, token=token, scorer=None)  # or an outside Scorer
    except PermissionError as e:
        where = f"${cfg.token_env}" if cfg.token_env else "no token (--token-env '')"
        return (f"the service at {cfg.address} refused the token ({e}); the load test sends {where}: set "
                "it to the service's GAMBIT_TOKEN, or name the variable that holds it with --token-env")
    except TimeoutError as e:
        if cfg.tls_ca:
            return (f"no service answers through TLS at {cfg.address} ({e}); check the proxy there, --tls-ca "
                    "(the CA that signed its certificate) and --tls-server-name (a name it holds)")
        return (f"no ReasoningService answers at {cfg.address} ({e}); start one (`gambit serve`), or "
                "leave --address empty and the load test starts a local one")
    return ""


def tls_ready(cfg: LoadTestConfig, token: str) -> None:
    """local.wait_ready's last probe (the Scorer's ``Info``, with the token) through a TLS proxy, which
    wait_ready cannot dial (plaintext): a wrong CA, name or token said before the load, not as failures."""
    import grpc

    from gambit.deployments.local import AUTH_CODES
    from gambit.serving.protos import load
    from gambit.serving.security import auth_metadata, open_channel

    pb2, g = load("scorer")
    with open_channel(cfg.address, cfg.tls_ca, server_name=cfg.tls_server_name) as ch:
        try:
            g.ScorerServiceStub(ch).Info(pb2.InfoRequest(), timeout=10,
                                         metadata=auth_metadata(token) + (("application", "scorer"),))
        except grpc.RpcError as e:
            if e.code() in AUTH_CODES:
                raise PermissionError(f"{e.code().name}: {e.details()}") from None
            raise TimeoutError(f"{e.code().name}: {e.details()}") from None


def main(cfg: LoadTestConfig) -> int:
    from gambit.deployments import local

    started = False
    address = cfg.address
    if address:
        why = check_running(cfg)
        if why:
            print(f"error: {why}", file=sys.stderr)
            return 2
    else:
        scfg = local.ServeConfig(num_cpus=cfg.num_cpus, num_blocks=cfg.num_blocks, token_env=cfg.token_env,
                                 model=cfg.model, grpc_port=cfg.grpc_port, http_port=cfg.http_port,
                                 metrics_port=cfg.metrics_port)
        print(f"starting a local Ray Serve deployment (gRPC 127.0.0.1:{scfg.grpc_port}) ...", flush=True)
        local.start(scfg, wait_s=600)
        started, address = True, f"127.0.0.1:{scfg.grpc_port}"
    try:
        print(f"locust: {cfg.users} users for {cfg.run_time_s} s against {address}", flush=True)
        Path(cfg.csv_prefix).parent.mkdir(parents=True, exist_ok=True)
        rc, interrupted = stream(locust_command(cfg, address), locust_timeout_s(cfg))
        print(f"Locust's own CSVs: {cfg.csv_prefix}_*.csv")
        if interrupted:
            print("interrupted: Locust stopped early; leak check skipped (interrupted)")
            return INTERRUPTED
        if not started:
            print("leak check skipped (--address): only a deployment the load test starts is checked")
            return rc
        load = target_load_when_idle()
        leaked = load["reserved_blocks"] != 0 or load["kv_usage"] != 0.0 or load["runs"] != 0
        print(f"after the load: runs {load['runs']}, reserved KV blocks {load['reserved_blocks']}, "
              f"KV usage {load['kv_usage']:.3f} -> {'LEAK' if leaked else 'no leaked KV blocks'}")
        return rc or int(leaked)
    finally:
        if started:
            local.stop()
