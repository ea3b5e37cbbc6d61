"""The load test's options and what it sends: the mix of problem sizes and methods, the option checks
(said before Ray starts, by ``gambit loadtest`` and by the locustfile's init event alike) and the
problem pool. Pure: no Locust, no Ray."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import ClassVar

from gambit.checks import above, at_least, finite, within
from gambit.paths import nearest_existing

# (name, weight, min_ops, max_ops, method, capacity, max_tokens)
MIX = (
    ("small-gambit", 4, 2, 3, "gambit", 4, 96),
    ("small-sc", 2, 2, 3, "sc", 4, 96),
    ("medium-gambit", 3, 4, 6, "gambit", 6, 160),
    ("medium-step", 1, 4, 6, "step", 4, 160),
    ("medium-deepconf", 1, 4, 6, "deepconf", 4, 160),
    ("large-gambit", 1, 7, 8, "gambit", 8, 224),
)
# SolveRequest.max_tokens is a uint32: a larger scale crashed every task with "Value out of range"
MAX_TOKENS_SCALE = (2**32 - 1) // max(m[6] for m in MIX)
MAX_USERS = 10_000  # gevent users in one Locust process; more is a typo, not a load test
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
