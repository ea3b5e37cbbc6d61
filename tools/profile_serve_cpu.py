"""CPU accounting of `gambit bench serve`'s two paths (counters, not wall clocks): CPU seconds per 1k
generated tokens by Ray process and by Target thread, the Target's per-step hooks, and every engine
step's (resident traces, thread CPU, wall), against the embedded wiring in this process.

Usage: .venv/bin/python tools/profile_serve_cpu.py 16,16,1   (levels of concurrent runs; JSON to
/tmp/prof_serve.json). It reaches into a Serve replica (``__ray_call__``) to wrap methods: a tool,
not a test."""
import json
import os
import sys
import threading
import time

import grpc
import psutil

from gambit.bench.serve import BenchServeConfig, problems, run_distributed, run_embedded
from gambit.deployments import local

if {"-h", "--help"} & set(sys.argv[1:]):  # the usage (the positional form read "--help" as a value)
    print(__doc__)
    sys.exit(0)

LEVELS = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "1,16").split(",")]
bcfg = BenchServeConfig()  # bench serve's defaults


def instrument(actor_self):
    import time as _t

    tgt = actor_self._replica_impl._user_callable_wrapper._callable
    svc = tgt.svc
    acc = {}

    def wrap(obj, name, key):
        fn = getattr(obj, name)

        def w(*a, **k):
            t = _t.thread_time()
            try:
                return fn(*a, **k)
            finally:
                d = acc.setdefault(key, [0.0, 0])
                d[0] += _t.thread_time() - t
                d[1] += 1
        setattr(obj, name, w)

    wrap(svc, "_gauges", "gauges")
    wrap(svc, "_counters", "counters")
    wrap(svc, "_deliver", "deliver")
    wrap(svc.driver, "step", "driver.step")
    wrap(svc.engine, "step", "engine.step")
    sample(svc, acc)
    svc._prof_acc = acc
    return os.getpid()


def sample(svc, acc):
    import time as _t
    fn = svc.engine.step
    acc["samples"] = []

    def w(*a, **k):
        n = len(svc.engine.traces)
        t, c = _t.perf_counter(), _t.thread_time()
        out = fn(*a, **k)
        acc["samples"].append((n, _t.thread_time() - c, _t.perf_counter() - t))
        return out
    svc.engine.step = w


def read_acc(actor_self):
    svc = actor_self._replica_impl._user_callable_wrapper._callable.svc
    import threading as th
    return {"acc": {k: list(v) for k, v in svc._prof_acc.items() if k != "samples"},
            "samples": list(svc._prof_acc["samples"]),
            "threads": {t.name: t.native_id for t in th.enumerate()}}


def pid_of(actor_self):
    return os.getpid()


def cpu(pids):
    out = {}
    for name, pid in pids.items():
        try:
            t = psutil.Process(pid).cpu_times()
            out[name] = t.user + t.system
        except psutil.Error:
            out[name] = 0.0
    return out


def thread_cpu(pid):
    out = {}
    for t in psutil.Process(pid).threads():
        out[t.id] = t.user_time + t.system_time
    return out


def main():
    import ray

    cfg = local.ServeConfig(grpc_port=9410, http_port=9412, metrics_port=9411, tree="redis://127.0.0.1:6379/0",
                            prefix="prof-serve:", capacity=8, max_tokens=160)
    local.start(cfg, wait_s=400)
    actors = {}
    for a in ray.util.list_named_actors(all_namespaces=True):
        for key in ("Target", "Coordinator", "Scorer", "Proxy", "Controller"):
            if key.lower() in a["name"].lower() and key not in actors:
                actors[key] = ray.get_actor(a["name"], namespace=a["namespace"])
    pids = {k: ray.get(h.__ray_call__.remote(pid_of)) for k, h in actors.items()}
    ray.get(actors["Target"].__ray_call__.remote(instrument))
    for p in psutil.process_iter(["name", "ppid"]):  # the node's own processes, started by this driver
        if p.info["name"] in ("raylet", "gcs_server") and p.info["ppid"] == os.getpid():
            pids[p.info["name"]] = p.pid
    pids["client(driver)"] = os.getpid()
    for p in psutil.process_iter(["name"]):  # read only: the machine's Redis, which the runs write to
        if p.info["name"] == "redis-server":
            pids.setdefault("redis-server", p.pid)
    print("pids", pids, flush=True)
    address = f"127.0.0.1:{cfg.grpc_port}"
    ch = grpc.insecure_channel(address)
    run_distributed(address, problems(2), bcfg, ch)  # warm
    res = {}
    before = cpu(pids)
    time.sleep(5.0)  # idle: what the services cost with no run in flight
    after = cpu(pids)
    res["idle_cpu_pct"] = {k: round(100 * (after[k] - before[k]) / 5.0, 2) for k in pids}
    print("idle CPU % of a core", res["idle_cpu_pct"], flush=True)
    for i, n in enumerate(LEVELS):
        prompts = problems(n)
        before, tb = cpu(pids), thread_cpu(pids["Target"])
        a0 = ray.get(actors["Target"].__ray_call__.remote(read_acc))
        t0 = time.perf_counter()
        out = run_distributed(address, prompts, bcfg, ch)
        wall = time.perf_counter() - t0
        after, ta = cpu(pids), thread_cpu(pids["Target"])
        a1 = ray.get(actors["Target"].__ray_call__.remote(read_acc))
        tokens = sum(o["tokens"] for o in out)
        names = {v: k for k, v in a1["threads"].items()}
        per = {k: round(1000 * (after[k] - before[k]) / tokens, 4) for k in pids}
        thr = sorted(((names.get(tid, str(tid)), round(1000 * (ta[tid] - tb.get(tid, 0)) / tokens, 4))
                      for tid in ta), key=lambda x: -x[1])[:8]
        samples = a1["samples"][len(a0["samples"]):]
        base = {k: a0["acc"].get(k, [0, 0]) for k in a1["acc"]}
        hooks = {k: (round(1000 * (v[0] - base[k][0]) / tokens, 4), v[1] - base[k][1])
                 for k, v in a1["acc"].items()}
        res[f"dist{n}_{i}"] = {"wall": wall, "tokens": tokens, "cpu_s_per_1k_tok": per, "target_threads": thr,
                           "hooks_cpu_s_per_1k_tok_and_calls": hooks, "samples": samples}
        print("dist", n, wall, flush=True)
    local.stop()
    from gambit.serving.embedded import Embedded, EmbeddedConfig

    emb = Embedded(EmbeddedConfig(scorer=""))
    eacc = {}
    sample(emb.target, eacc)
    run_embedded(emb, problems(2), bcfg)
    me = psutil.Process()
    for i, n in enumerate(LEVELS):
        prompts = problems(n)
        tb = thread_cpu(me.pid)
        k0 = len(eacc["samples"])
        c0 = sum(me.cpu_times()[:2])
        t0 = time.perf_counter()
        out = run_embedded(emb, prompts, bcfg)
        wall = time.perf_counter() - t0
        c1 = sum(me.cpu_times()[:2])
        ta = thread_cpu(me.pid)
        tokens = sum(o["tokens"] for o in out)
        names = {t.native_id: t.name for t in threading.enumerate()}
        thr = sorted(((names.get(tid, str(tid)), round(1000 * (ta[tid] - tb.get(tid, 0)) / tokens, 4))
                      for tid in ta), key=lambda x: -x[1])[:6]
        per_1k = round(1000 * (c1 - c0) / tokens, 4)
        res[f"emb{n}_{i}"] = {"wall": wall, "tokens": tokens, "cpu_s_per_1k_tok": per_1k,
                          "threads": thr, "samples": eacc["samples"][k0:]}
        print("emb", n, wall, flush=True)
    emb.close()
    json.dump(res, open("/tmp/prof_serve.json", "w"), indent=1)


if __name__ == "__main__":
    main()
