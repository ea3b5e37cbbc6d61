"""The environment every Ray node of the services runs with: one source for `gambit serve`
(``gambit.deployments.local`` sets it before Ray starts), the chart (``helm/gambit/files/serve-env.yaml``,
put on the head and every worker group's container) and ``deploy/serve.env`` (source it before
``ray start`` / ``serve run``). `gambit deploy generate` writes both files from ``SERVE_ENV``.

Ray reads these in the raylet and in each worker it starts, so they must be in the node's environment
when Ray starts; a Serve app's ``runtime_env`` comes too late for ``RAY_worker_niceness`` and the proxy.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from gambit.serving.limits import (  # the Scorer path's limits, read by client and server alike
    EDIT_BYTES,
    GRPC_MAX_MESSAGE_BYTES,
    ROW_EXTRA_BYTES,
    SCORER_ENDPOINT_MESSAGE_BYTES,
    STATE_VALUE_BYTES,
)

# * RAY_worker_niceness 0: Ray starts its workers, hence every Serve replica and the Target's engine,
#   at nice 15, below every ordinary process on the host; on a shared machine the engine then only
#   gets the CPU others leave (it decoded ~20% slower than the same engine in a nice-0 process).
# * Ray Serve's own knobs for request-path overhead (its RAY_SERVE_THROUGHPUT_OPTIMIZED set, without
#   direct ingress, which would move the ports): user code and the router on the replica's main
#   event loop instead of extra threads, gRPC between proxy and replicas, buffered access logs.
#   Measured on 2 cores: the Coordinator's CPU per run halves and the Target's drops ~13%.
# * The Serve controller's control loop every 0.5 s instead of 0.1 s, and Serve's cached metrics
#   exported every 1 s instead of 0.1 s: with no run in flight the controller took 7.6% of a core and
#   the GCS it polls 3.0% (2.4% and 1.1% at 1 s); under 16 runs the services' CPU per token fell by a
#   third (`tools/profile_serve_cpu.py`), CPU that the Target's engine threads lose on a shared node.
#   The cost: the controller reacts to a dead replica or a new deployment state up to 0.4 s later.
# * gRPC message sizes, both 128 MiB: the proxy took up to 2 GiB - 1 from anyone before a replica checks
#   the token, and its hop to a replica capped at 4 MiB, so a Score call through the proxy (the chart's
#   cross-node Targets, the fallback path) over 4 MiB failed INTERNAL. The largest legal Score request:
#   4096 rows (the Scorer's max_rows) x width 4096 (an 8B model, e.g. Qwen3-8B) x 4 bytes = 64 MiB of
#   float32 states, plus 2 confidence floats and one trace id per row (~0.4 MiB), plus the forks and
#   drops a Target queued while its Scorer was down (up to ~35 MiB of ids): ~100 MiB, 128 MiB with
#   margin. Wider models or more rows: raise both (serve.extraEnv, deploy/serve.env); ServeAppSpec,
#   ServeConfig and the Scorer itself at start refuse a max_rows whose full call would not fit
#   (``check_score_message``). The sizes (GRPC_MAX_MESSAGE_BYTES, EDIT_BYTES, ...) live in
#   ``gambit.serving.limits``.
PROXY_CAPS = ("RAY_SERVE_GRPC_MAX_MESSAGE_SIZE", "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH")
SERVE_ENV: dict[str, str] = {
    "RAY_worker_niceness": "0",
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
    "RAY_SERVE_USE_GRPC_BY_DEFAULT": "1",
    "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": "1000",
    "RAY_SERVE_LOG_TO_STDERR": "0",
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5",
    "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000",
    "RAY_SERVE_GRPC_MAX_MESSAGE_SIZE": str(GRPC_MAX_MESSAGE_BYTES),
    "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH": str(GRPC_MAX_MESSAGE_BYTES),
}


def env_file(env: dict[str, str] | None = None) -> str:
    """``KEY=VALUE`` lines (``set -a; . deploy/serve.env; set +a``, or a systemd EnvironmentFile)."""
    env = SERVE_ENV if env is None else env
    for k, v in env.items():
        if not k.replace("_", "").isalnum() or k[0].isdigit() or any(c in v for c in " \n'\"$\\`"):
            raise ValueError(f"{k}={v!r} cannot be written as a plain KEY=VALUE line")
    return "".join(f"{k}={v}\n" for k, v in env.items())


def score_message_bytes(max_rows: int, width: int) -> int:
    """The largest Score request a Target sends a Scorer of ``max_rows`` reading ``width``-wide rows."""
    return max_rows * (width * STATE_VALUE_BYTES + ROW_EXTRA_BYTES) + EDIT_BYTES


def message_cap(env: Mapping[str, str] | None = None) -> int:
    """The largest message a Score call may be on every path (the proxy, its hop to a replica, the direct
    endpoint): the proxy's caps as ``env`` (this process's environment) sets them, else ``SERVE_ENV``'s."""
    env = os.environ if env is None else env
    caps = []
    for k in PROXY_CAPS:
        try:
            caps.append(int(env.get(k, SERVE_ENV[k])))
        except ValueError:
            raise ValueError(f"{k}={env[k]!r} is not a number of bytes") from None
    return min(*caps, SCORER_ENDPOINT_MESSAGE_BYTES)


def check_score_message(max_rows: int, width: int, env: Mapping[str, str] | None = None,
                        endpoint_only: bool = False) -> None:
    """ValueError naming max_rows when a full Score call of ``width``-wide rows (0: not known here, no
    check) exceeds ``message_cap``: every such call was refused RESOURCE_EXHAUSTED and fell back unguided.
    ``endpoint_only``: the Scorer's own endpoint alone (`gambit scorer serve`: no proxy on the way)."""
    cap = SCORER_ENDPOINT_MESSAGE_BYTES if endpoint_only else message_cap(env)
    if width <= 0 or (need := score_message_bytes(max_rows, width)) <= cap:
        return
    most = max(0, (cap - EDIT_BYTES) // (width * STATE_VALUE_BYTES + ROW_EXTRA_BYTES))
    raise_caps = ("" if endpoint_only else f", or raise {' and '.join(PROXY_CAPS)} (serve.extraEnv, "
                  f"deploy/serve.env; at most {SCORER_ENDPOINT_MESSAGE_BYTES >> 20} MiB helps)")
    raise ValueError(f"max_rows: {max_rows} rows of width {width} make a Score call of up to "
                     f"{need / 2**20:.0f} MiB, over the {cap / 2**20:.0f} MiB gRPC message cap; lower "
                     f"max_rows to {most} or less{raise_caps}")
