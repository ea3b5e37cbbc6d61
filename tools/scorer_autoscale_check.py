"""Live check of the Scorer's autoscaling: direct-endpoint load on a real local Ray Serve scales it up.

Why: Targets send most Score calls to each Scorer replica's own gRPC endpoint, which Serve neither routes
nor counts; the Scorer's policy (``gambit.deployments.scorer_autoscaling``) adds the replicas' reported
direct calls in flight to Serve's count. Its unit test checks the arithmetic; this runs the real thing:
Ray on this machine (127.0.0.1, Ray shut down from code at the end), the ``Scorer`` deployment with the
shipped policy (min 1 replica, a small max, no upscale delay), ``--clients`` threads calling Score back to
back on the first replica's direct endpoint until Serve runs more replicas (``serve.status()``), then no
load until it is back at one. Prints time, replicas running and starting, the clients' calls in flight;
exit 1 with a message when no scale-up (or scale-down) comes within its bound (about 2 min at most in all).
``--policy serve`` is the control: Serve's default policy, which never sees these calls, on the same load.

Usage: PYTHONPATH=services .venv/bin/python tools/scorer_autoscale_check.py [--clients 24]
       [--max-replicas 2] [--up-s 60] [--down-s 45] [--policy gambit|serve] [--json FILE]
"""
import argparse
import json
import os
import socket
import sys
import threading
import time

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                             formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
ap.add_argument("--clients", type=int, default=24, help="threads calling Score back to back on the endpoint")
ap.add_argument("--rows", type=int, default=64, help="state rows per Score call")
ap.add_argument("--hidden", type=int, default=256, help="the random MLP scorer's input width")
ap.add_argument("--max-replicas", type=int, default=2, help="the Scorer's max_replicas (min is 1)")
ap.add_argument("--target", type=float, default=8.0, help="target_ongoing_requests (the deployment's: 8)")
ap.add_argument("--up-s", type=float, default=60.0, help="seconds of load to wait for the scale-up")
ap.add_argument("--down-s", type=float, default=45.0, help="seconds without load to wait for one replica")
ap.add_argument("--downscale-delay-s", type=float, default=5.0, help="Serve's downscale_delay_s")
ap.add_argument("--interval", type=float, default=0.5, help="seconds between replica-count samples")
ap.add_argument("--policy", choices=("gambit", "serve"), default="gambit",
                help="gambit: the Scorer's (scorer_autoscaling.POLICY); serve: Serve's default, the control "
                     "(it does not count the direct calls: expect the timeout)")
ap.add_argument("--json", default="", help="write the samples and the outcome here")
args = ap.parse_args()
for flag, value, least in (("--clients", args.clients, 1), ("--rows", args.rows, 1),
                           ("--hidden", args.hidden, 1), ("--max-replicas", args.max_replicas, 2)):
    if value < least:
        ap.error(f"{flag} must be >= {least}, got {value}")
for flag, value in (("--target", args.target), ("--up-s", args.up_s), ("--down-s", args.down_s),
                    ("--interval", args.interval)):
    if not value > 0:  # NaN too
        ap.error(f"{flag} must be > 0, got {value}")
if not args.downscale_delay_s >= 0:
    ap.error(f"--downscale-delay-s must be >= 0, got {args.downscale_delay_s}")

import grpc  # noqa: E402 — after --help, which starts nothing
import ray  # noqa: E402
import torch  # noqa: E402
from ray import serve  # noqa: E402

from gambit.deployments.scorer import Scorer  # noqa: E402
from gambit.deployments.scorer_autoscaling import POLICY  # noqa: E402
from gambit.ops.serve_env import SERVE_ENV  # noqa: E402
from gambit.serving.payload import encode_states  # noqa: E402
from gambit.serving.protos import load  # noqa: E402

APP = "autoscale-check"
TOKEN_ENV = "GAMBIT_AUTOSCALE_CHECK_TOKEN"  # never set: the endpoint binds 127.0.0.1, no bearer token
pb2, pb2_grpc = load("scorer")


class Load:
    """``clients`` threads calling Score on ``address`` back to back; ``in_flight`` counts their calls."""

    def __init__(self, address: str, clients: int, rows: int, hidden: int) -> None:
        raw, dtype, shape = encode_states(torch.randn(rows, hidden))
        self.requests = [pb2.ScoreRequest(states=raw, dtype=dtype, shape=shape,
                                          trace_ids=[f"c{c}:{r}" for r in range(rows)])
                         for c in range(clients)]
        self.channel = grpc.insecure_channel(address)
        self.stub = pb2_grpc.ScorerServiceStub(self.channel)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.in_flight = self.done = self.errors = 0
        self.last_error = ""
        self.threads = [threading.Thread(target=self._run, args=(r,), daemon=True) for r in self.requests]
        for t in self.threads:
            t.start()

    def _run(self, request) -> None:
        while not self.stop.is_set():
            with self.lock:
                self.in_flight += 1
            try:
                self.stub.Score(request, timeout=30)
                ok, why = True, ""
            except grpc.RpcError as e:
                ok, why = False, f"{e.code().name}: {e.details()}"
            with self.lock:
                self.in_flight -= 1
                self.done += ok
                self.errors += not ok
                self.last_error = why or self.last_error
            if not ok:
                time.sleep(0.1)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(35)
        self.channel.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def replicas() -> tuple[int, int]:
    """The Scorer's replicas running, and starting (Serve has decided to add them)."""
    app = serve.status().applications.get(APP)
    dep = app.deployments.get("Scorer") if app is not None else None
    states = dep.replica_states if dep is not None else {}
    return states.get("RUNNING", 0), states.get("STARTING", 0)


def main() -> int:
    samples, out = [], {"args": vars(args), "policy": POLICY if args.policy == "gambit" else "serve default"}
    t0 = time.monotonic()

    printed = [-99.0]  # when the last row was printed: a row per change, else one per 5 s

    def sample(phase: str, load: Load) -> dict:
        run, start = replicas()
        s = {"t": round(time.monotonic() - t0, 2), "phase": phase, "replicas": run, "starting": start,
             "in_flight": load.in_flight, "done": load.done}
        key = ("phase", "replicas", "starting")
        changed = not samples or any(samples[-1][k] != s[k] for k in key)
        if changed or s["t"] - printed[0] >= 5:
            printed[0] = s["t"]
            print(f"{s['t']:7.1f}  {phase:5s}  {run:8d}  {start:8d}  {s['in_flight']:9d}  {s['done']:7d}",
                  flush=True)
        samples.append(s)
        return s

    for k, v in SERVE_ENV.items():
        os.environ.setdefault(k, v)
    os.environ.pop(TOKEN_ENV, None)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    load = None
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": free_port()})
        auto = {"min_replicas": 1, "max_replicas": args.max_replicas, "target_ongoing_requests": args.target,
                "upscale_delay_s": 0.0, "downscale_delay_s": args.downscale_delay_s,
                "metrics_interval_s": 0.5, "look_back_period_s": 2.0}
        if args.policy == "gambit":  # else no policy key: Serve's default_autoscaling_policy
            auto["policy"] = {"policy_function": POLICY}
        app = Scorer.options(autoscaling_config=auto).bind(
            scorer=f"random:mlp:{args.hidden}", hidden_size=args.hidden, max_rows=max(args.rows, 64),
            token_env=TOKEN_ENV, direct_host="127.0.0.1")
        handle = serve.run(app, name=APP, route_prefix=f"/{APP}", blocking=False)
        address = handle.address.remote().result(timeout_s=60)["address"]
        out["started_s"] = round(time.monotonic() - t0, 1)
        print(f"Scorer up after {out['started_s']} s, direct endpoint {address}; {args.clients} clients, "
              f"{args.rows} x {args.hidden} states per call, target_ongoing_requests {args.target:g}")
        print("      t  phase  replicas  starting  in_flight     done")
        load = Load(address, args.clients, args.rows, args.hidden)
        up = time.monotonic()
        while True:
            s = sample("load", load)
            if (s["starting"] or s["replicas"] >= 2) and "decided_s" not in out:  # Serve adds a replica
                out["decided_s"] = round(time.monotonic() - up, 1)
            if s["replicas"] >= 2:
                out["scale_up_s"] = round(time.monotonic() - up, 1)
                break
            if time.monotonic() - up > args.up_s:
                break
            time.sleep(args.interval)
        load.close()
        out.update(calls=load.done, errors=load.errors, last_error=load.last_error)
        if "scale_up_s" in out:
            idle = time.monotonic()
            while True:
                s = sample("idle", load)
                if s["replicas"] <= 1:
                    out["scale_down_s"] = round(time.monotonic() - idle, 1)
                    break
                if time.monotonic() - idle > args.down_s:
                    break
                time.sleep(args.interval)
    finally:
        if load is not None:
            load.close()
        serve.shutdown()
        ray.shutdown()
    out["samples"] = samples
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    if "scale_up_s" not in out:
        last = samples[-1]["replicas"] if samples else 0
        why = f", last: {out['last_error']}" if out.get("last_error") else ""
        print(f"TIMEOUT: still {last} replica(s) after {args.up_s:g} s of "
              f"{args.clients} clients on the direct endpoint ({out.get('calls', 0)} calls, "
              f"{out.get('errors', 0)} errors{why}): the policy did not scale up")
        return 1
    print(f"scaled up to {max(s['replicas'] for s in samples)} replicas after {out['scale_up_s']} s of load "
          f"(Serve added one after {out['decided_s']} s; {out['calls']} calls, {out['errors']} errors)")
    if "scale_down_s" not in out:
        print(f"TIMEOUT: not back at 1 replica after {args.down_s:g} s without load")
        return 1
    print(f"back at 1 replica {out['scale_down_s']} s after the load stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
