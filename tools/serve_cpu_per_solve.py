"""CPU per solve of every process of the local Serve app (summed /proc/<pid>/task/*/schedstat, ns),
and of the Target's busiest threads: 20 one-run solves in a row, after a warm-up.

Usage: .venv/bin/python tools/serve_cpu_per_solve.py [quick]   (quick: `bench serve --quick` settings)
Reads other processes' /proc (Linux): a tool, not a test."""
import os
import sys
import time

import grpc
import psutil
import ray

from gambit.bench.serve import QUICK as QUICK_CFG
from gambit.bench.serve import BenchServeConfig, problems, run_distributed
from gambit.deployments import local

if {"-h", "--help"} & set(sys.argv[1:]):  # the usage (the positional form read "--help" as a value)
    print(__doc__)
    sys.exit(0)

if sys.argv[1:] not in ([], ["quick"]):  # anything else started the full settings' Ray app
    sys.exit(f"usage: tools/serve_cpu_per_solve.py [quick] (got {' '.join(sys.argv[1:])!r}); --help for more")
QUICK = sys.argv[1:] == ["quick"]
N = 20


def threads_ns(pid: int) -> dict[str, tuple[str, int]]:
    """tid -> (thread name, CPU ns so far)."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            ns = int(open(f"/proc/{pid}/task/{tid}/schedstat").read().split()[0])
            out[tid] = (open(f"/proc/{pid}/task/{tid}/comm").read().strip(), ns)
        except OSError:
            continue
    return out


def main() -> None:
    bcfg = BenchServeConfig(**QUICK_CFG) if QUICK else BenchServeConfig()
    cfg = local.ServeConfig(grpc_port=9450, http_port=9452, metrics_port=9451, prefix="cpu-per-solve:",
                            capacity=bcfg.capacity, max_tokens=bcfg.max_tokens)
    local.start(cfg, wait_s=400)
    try:
        pids = {}
        for a in ray.util.list_named_actors(all_namespaces=True):
            for key in ("Target", "Coordinator", "Scorer", "Proxy", "Controller"):
                if key.lower() in a["name"].lower() and key not in pids:
                    h = ray.get_actor(a["name"], namespace=a["namespace"])
                    pids[key] = ray.get(h.__ray_call__.remote(lambda s: os.getpid()))
        for p in psutil.process_iter(["name"]):
            if p.info["name"] in ("raylet", "gcs_server", "redis-server"):
                pids[p.info["name"]] = p.pid
        pids["client"] = os.getpid()
        address = f"127.0.0.1:{cfg.grpc_port}"
        ch = grpc.insecure_channel(address)
        ps = problems(8)
        run_distributed(address, ps[:2], bcfg, ch)  # warm
        before = {k: threads_ns(v) for k, v in pids.items()}
        t, tokens = time.perf_counter(), 0
        for i in range(N):
            tokens += sum(o["tokens"] for o in run_distributed(address, [ps[i % 8]], bcfg, ch))
        wall = (time.perf_counter() - t) / N
        after = {k: threads_ns(v) for k, v in pids.items()}
        print(f"per solve: wall {wall * 1e3:.1f} ms, tokens {tokens / N:.0f}")

        def delta(k, tid, ns):
            return (ns - before[k].get(tid, ("", 0))[1]) / N / 1e6

        rows = sorted(((sum(delta(k, tid, ns) for tid, (_, ns) in after[k].items()), k) for k in pids),
                      reverse=True)
        for ms, k in rows:
            print(f"  {k:14s} {ms:7.2f} ms CPU / solve")
        tgt = after["Target"].items()
        top = sorted(((delta("Target", tid, ns), f"{name}:{tid}") for tid, (name, ns) in tgt),
                     reverse=True)[:8]
        print("  Target threads:", [(n, round(x, 2)) for x, n in top])
    finally:
        local.stop()


if __name__ == "__main__":
    main()
