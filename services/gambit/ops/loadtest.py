"""`gambit loadtest` / `make loadtest`: Locust (loadtest/locustfile.py) headless and bounded against a
local Ray Serve deployment it starts (or a running one), then checks no KV blocks are left behind.

The pure parts live beside it, one concept each, so the locustfile and ``gambit loadtest`` share them
and tests need neither Locust nor Ray: the options, mix and problem pool (``loadtest_config``) and the
summary table, totals and failure grouping (``loadtest_summary``); their names are importable from
here too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from gambit.ops.loadtest_config import (  # noqa: F401 (re-exported: the CLI, the tests, the locustfile)
    LOCAL_ONLY,
    MAX_TOKENS_SCALE,
    MAX_USERS,
    MIX,
    LoadTestConfig,
    absolute,
    check_no_local_options,
    check_options,
    check_writable,
    problem_pool,
)
from gambit.ops.loadtest_summary import (  # noqa: F401 (re-exported)
    COLUMNS,
    ENTRIES,
    FAILED,
    FAILURE_LINES,
    METHOD_ENTRY,
    failure_kind,
    failure_lines,
    method_rows,
    read_summary,
    run_totals,
    summary_lines,
    summary_rows,
    totals_path,
    write_summary,
)
from gambit.paths import REPO

LOCUSTFILE = REPO / "loadtest" / "locustfile.py"
INTERRUPTED = 130  # exit code after Ctrl-C, as a shell reports SIGINT


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
