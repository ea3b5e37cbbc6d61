"""What each part of the distributed path costs a run: one-run (or n-run) solves through the embedded
wiring and through Ray Serve + gRPC, with parts of the Target's service work switched off on the
live replica between solves, all interleaved (the order rotates every repetition).

Usage: .venv/bin/python tools/serve_parts_ab.py REPS VARIANTS [RUNS]
  VARIANTS: comma-separated; each is "base" or "+"-joined switches:
    nodefer      send a remote scorer each step's boundaries as they come (before: rounds only)
    localscorer  an in-process scorer instead of the Scorer replica over gRPC
    norecords    no Redis writes (tree store and run records)
    nometrics    no Ray metrics
    noprogress   no progress events (started and result only)
    nopoll       no cancel-flag polling
    threads1     one torch thread in the Target
    allthreads   every step of the Target on all its threads (min_macs_per_thread 0)
    enginenice   the Target's engine thread at nice -10 (needs root or CAP_SYS_NICE)
    targetnice   every thread of the Target (its OpenMP workers too) at nice -10 (the same)
    switch       the Target's GIL switch interval 0.2 ms instead of 5 ms
  and "embedded_all": the embedded wiring with every step on all threads (beside "embedded").
  RUNS: concurrent runs per solve (default 1).
  GAMBIT_AB_FULL=1 in the environment: the bench's default sizing (C = 8, 160 tokens), not --quick.
Prints the median client latency, the run as its driver timed it, the scorer wait and the machine's
busy CPU during the solve (every process, from /proc/stat: what the service path adds beside the engine),
per variant.
It reaches into a Serve replica (``__ray_call__``) to switch parts off: a tool, not a test."""
import os
import statistics
import sys
import time

import grpc
import psutil
import ray

from gambit.bench.serve import QUICK, BenchServeConfig, problems, run_distributed, run_embedded
from gambit.deployments import local
from gambit.serving.embedded import Embedded, EmbeddedConfig

if {"-h", "--help"} & set(sys.argv[1:]):  # the usage (the positional form read "--help" as a value)
    print(__doc__)
    sys.exit(0)

SWITCHES = {"nodefer", "localscorer", "norecords", "nometrics", "noprogress", "nopoll", "threads1",
            "allthreads", "enginenice", "targetnice", "switch"}


def busy_cpu_s() -> float:
    """Seconds of CPU the whole machine has been busy (all cores, every process)."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def configure(actor_self, name: str) -> str:
    """Switch the Target's parts for variant ``name`` (on the replica; the originals are kept)."""
    import torch as _torch

    from gambit.scoring.spec import load_scorer_spec
    from gambit.serving.local_scorer import LocalScorer
    from gambit.serving.record_writer import InlineRecords

    svc = actor_self._replica_impl._user_callable_wrapper._callable.svc
    drv = svc.driver.driver
    if not hasattr(svc, "_ab"):
        local_scorer = svc.call(lambda: LocalScorer(load_scorer_spec("", svc.engine.model.config.hidden_size))
                                ).result()
        svc._ab = {"scorer": drv.scorer, "records": svc.records, "writes": drv.store.writes,
                   "metrics": (svc.metrics, svc.driver.metrics), "local": local_scorer,
                   "none": InlineRecords(None, None), "deliver": svc._deliver, "noprogress": False}

        def deliver(outs, gauges=True):
            if svc._ab["noprogress"]:
                outs = [o for o in outs if o is None or o["kind"] == "result"]
            return svc._ab["deliver"](outs, gauges)

        svc._deliver = deliver
    ab, flags = svc._ab, set(name.split("+")) - {"base"}
    drv.scorer = ab["local"] if "localscorer" in flags else ab["scorer"]
    drv.defers = "nodefer" not in flags
    svc.records = ab["none"] if "norecords" in flags else ab["records"]
    drv.store.writes = ab["none"] if "norecords" in flags else ab["writes"]
    svc.metrics, svc.driver.metrics = (None, None) if "nometrics" in flags else ab["metrics"]
    ab["noprogress"] = "noprogress" in flags
    svc.cancel_poll_s = 100.0 if "nopoll" in flags else 0.1
    sys.setswitchinterval(2e-4 if "switch" in flags else 5e-3)
    for tid in (int(t) for t in os.listdir("/proc/self/task")):
        nice = -10 if "targetnice" in flags or ("enginenice" in flags and tid == svc.engine_thread_id) else 0
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except ProcessLookupError:
            pass  # the thread ended since the listing
    ab.setdefault("min_macs", svc.engine.threads.min_macs)
    svc.engine.threads.min_macs = 0 if "allthreads" in flags else ab["min_macs"]
    threads = 1 if "threads1" in flags else 0
    svc.call(lambda: _torch.set_num_threads(threads or ab.setdefault("threads", _torch.get_num_threads()))
             ).result()
    return name


def main() -> int:
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 12
    variants = sys.argv[2].split(",") if len(sys.argv) > 2 else ["base", "nodefer"]
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    known = SWITCHES | {"base", "embedded_all"}
    bad = [f for v in variants for f in v.split("+") if f not in known]
    if bad:
        print(f"unknown switches {bad}; known: {', '.join(sorted(known))}", file=sys.stderr)
        return 2
    bcfg = BenchServeConfig() if os.environ.get("GAMBIT_AB_FULL") == "1" else BenchServeConfig(**QUICK)
    cfg = local.ServeConfig(grpc_port=9430, http_port=9432, metrics_port=9431,
                            tree="redis://127.0.0.1:6379/0", prefix="serve-parts-ab:", capacity=bcfg.capacity,
                            max_tokens=bcfg.max_tokens)
    local.start(cfg, wait_s=400)
    try:
        target = next(ray.get_actor(a["name"], namespace=a["namespace"])
                      for a in ray.util.list_named_actors(all_namespaces=True)
                      if "target" in a["name"].lower())
        emb = Embedded(EmbeddedConfig())
        address = f"127.0.0.1:{cfg.grpc_port}"
        channel = grpc.insecure_channel(address)
        ps = problems(8)
        run_embedded(emb, ps[:2], bcfg)  # warm both paths
        run_distributed(address, ps[:2], bcfg, channel)
        res: dict[str, list[dict]] = {k: [] for k in ["embedded", *variants]}
        emb_macs = emb.target.engine.threads.min_macs
        order = list(res)
        for i in range(reps):
            batch = [ps[(i + j) % len(ps)] for j in range(runs)]
            k = i % len(order)
            for v in order[k:] + order[:k]:
                local_run = v.startswith("embedded")
                emb.target.engine.threads.min_macs = 0 if v == "embedded_all" else emb_macs
                if not local_run:
                    ray.get(target.__ray_call__.remote(configure, v))
                    time.sleep(0.05)
                c, t = busy_cpu_s(), time.perf_counter()
                out = (run_embedded(emb, batch, bcfg, runs) if local_run
                       else run_distributed(address, batch, bcfg, channel, runs))
                res[v].append({"wall": time.perf_counter() - t, "driver": max(o["total"] for o in out),
                               "sync": max(o["sync"] for o in out), "cpu": busy_cpu_s() - c})
            print(f"rep {i + 1}/{reps}", flush=True)
        base = statistics.median(r["wall"] for r in res["embedded"])
        print(f"\n{runs} run(s) per solve, {reps} interleaved repetitions, medians")
        print("| variant | wall ms | ratio to embedded | driver-timed run ms | scorer wait ms "
              "| machine CPU ms |")
        print("|---|---:|---:|---:|---:|---:|")
        for v, rs in res.items():
            w, d, s, c = (statistics.median(r[k] for r in rs) for k in ("wall", "driver", "sync", "cpu"))
            print(f"| {v} | {1e3 * w:.1f} | {w / base:.3f} | {1e3 * d:.1f} | {1e3 * s:.1f} | {1e3 * c:.0f} |")
        emb.close()
    finally:
        local.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
