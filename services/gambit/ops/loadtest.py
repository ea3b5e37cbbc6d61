"""`gambit loadtest` / `make loadtest`: Locust (loadtest/locustfile.py) headless and bounded against a
local Ray Serve deployment it starts (or a running one), then checks no KV blocks are left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass

from gambit.checks import above, at_least
from gambit.paths import REPO

LOCUSTFILE = REPO / "loadtest" / "locustfile.py"


@dataclass
class LoadTestConfig:
    address: str = ""  # host:port of a running deployment ("" = start a local Ray Serve one here)
    users: int = 4  # concurrent Locust users (each runs one Solve at a time)
    spawn_rate: float = 2.0  # users started per second
    run_time_s: int = 60  # seconds of load (in-flight runs then finish, bounded by stop_timeout_s)
    stop_timeout_s: int = 120  # seconds users get to finish their current run after run_time_s
    cancel_fraction: float = 0.1  # share of runs cancelled after their first progress event
    max_tokens_scale: float = 1.0  # scales every mix entry's max_tokens (smaller: shorter runs)
    token_env: str = "GAMBIT_TOKEN"  # env var with the bearer token
    csv_prefix: str = "results/loadtest"  # Locust's own CSVs (<prefix>_stats.csv, ...)
    summary_csv: str = "results/loadtest_summary.csv"  # the summary table as CSV
    num_blocks: int = 0  # local deployment: KV blocks per Target (0 = from the memory budget)
    num_cpus: int = 2  # local deployment: CPUs Ray may schedule on
    model: str = ""  # local deployment: target model, a folder or a name like smollm2 ("" = shipped target)
    # questions of a graded benchmark instead of the task's problems: a deployment serving a real model
    benchmark: str = ""  # gsm8k | aime25 | hmmt24 | hmmt25 | gpqa ("" = the arithmetic task)
    data: str = ""  # the benchmark's JSONL file ("" = ../shared/datasets/, or $GAMBIT_DATASETS)

    def __post_init__(self):
        at_least(1, users=self.users, run_time_s=self.run_time_s)
        above(0, spawn_rate=self.spawn_rate)
        at_least(0, stop_timeout_s=self.stop_timeout_s)
        if not 0 <= self.cancel_fraction <= 1:
            raise ValueError(f"cancel_fraction must be in [0, 1], got {self.cancel_fraction}")
        if not 0 < self.max_tokens_scale < float("inf"):  # NaN too
            raise ValueError(f"max_tokens_scale must be a finite number > 0, got {self.max_tokens_scale}")
        at_least(1, num_cpus=self.num_cpus)
        at_least(0, num_blocks=self.num_blocks)
        from gambit.tasks.graded import check_benchmark

        check_benchmark(self.benchmark, self.data)
        if self.address:
            from gambit.serving.security import check_address

            check_address(self.address)
        problem_pool(((2, 3),), 0, self.benchmark, self.data)  # a missing file is said before Ray starts


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


def locust_command(cfg: LoadTestConfig, address: str, application: str = "gambit") -> list[str]:
    return [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--host", address,
            "-u", str(cfg.users), "-r", str(cfg.spawn_rate), "-t", f"{cfg.run_time_s}s",
            "--stop-timeout", str(cfg.stop_timeout_s), "--csv", cfg.csv_prefix, "--only-summary",
            "--application", application, "--token-env", cfg.token_env,
            "--cancel-fraction", str(cfg.cancel_fraction), "--max-tokens-scale", str(cfg.max_tokens_scale),
            "--summary-csv", cfg.summary_csv, "--benchmark", cfg.benchmark, "--data", cfg.data]


def run_locust(cfg: LoadTestConfig, address: str) -> subprocess.CompletedProcess:
    timeout = cfg.run_time_s + cfg.stop_timeout_s + 120
    return subprocess.run(locust_command(cfg, address), cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


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


def read_summary(path) -> tuple[list[dict], str]:
    import csv

    lines = open(path).read().splitlines()
    rows = list(csv.DictReader([ln for ln in lines if not ln.startswith("#")]))
    note = next((ln[2:] for ln in lines if ln.startswith("# ")), "")
    return rows, note


def main(cfg: LoadTestConfig) -> int:
    from gambit.deployments import local

    started = False
    address = cfg.address
    if address:  # say at once that nothing answers there, not after run_time_s of failed calls
        try:
            token = os.environ.get(cfg.token_env, "") if cfg.token_env else ""
            local.wait_ready(address, wait_s=10.0, token=token)
        except TimeoutError as e:
            print(f"error: no ReasoningService answers at {address} ({e}); start one (`gambit serve`), or "
                  "leave --address empty and the load test starts a local one", file=sys.stderr)
            return 2
    else:
        scfg = local.ServeConfig(num_cpus=cfg.num_cpus, num_blocks=cfg.num_blocks, token_env=cfg.token_env,
                                 model=cfg.model)
        print(f"starting a local Ray Serve deployment (gRPC 127.0.0.1:{scfg.grpc_port}) ...", flush=True)
        local.start(scfg, wait_s=600)
        started, address = True, f"127.0.0.1:{scfg.grpc_port}"
    try:
        print(f"locust: {cfg.users} users for {cfg.run_time_s} s against {address}", flush=True)
        r = run_locust(cfg, address)
        print(r.stdout[-6000:] + r.stderr[-6000:])
        rc = r.returncode
        if started:
            load = target_load_when_idle()
            leaked = load["reserved_blocks"] != 0 or load["kv_usage"] != 0.0 or load["runs"] != 0
            print(f"after the load: runs {load['runs']}, reserved KV blocks {load['reserved_blocks']}, "
                  f"KV usage {load['kv_usage']:.3f} -> {'LEAK' if leaked else 'no leaked KV blocks'}")
            rc = rc or int(leaked)
        return rc
    finally:
        if started:
            local.stop()
