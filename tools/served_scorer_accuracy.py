"""Served Gambit's accuracy by the ScorerService's scorer: the same Solves, the same seeds, scored over real
gRPC by each scorer in turn (interleaved per problem).

Why: the served default was ``scorer-mlp`` (the hidden state only: the ScoreRequest carried no
confidence features), which scores a problem's traces at chance; ``gambit run`` and the benchmarks search
with ``scorer-process`` (hidden state + the target's sampled-token confidence). Each run goes through the
Target's own code (``serving.embedded.build_target``: engine, driver, ``RemoteScorer``) to a standalone
ScorerService on 127.0.0.1 (``serving.scorer_server``), with the service's default Solve settings.

Usage: PYTHONPATH=services .venv/bin/python tools/served_scorer_accuracy.py [--problems 48]
       [--ops 6,8] [--scorers mlp,process] [--json FILE]
"""
import argparse
import json

from gambit import paths
from gambit.scoring.spec import load_scorer_spec
from gambit.serving.embedded import Embedded, EmbeddedConfig
from gambit.serving.scorer_server import ScorerServerConfig, start_scorer_server
from gambit.serving.solve_config import SolveConfig
from gambit.tasks.arithmetic import TaskConfig, generate

SPECS = {"mlp": str(paths.SCORER_MLP), "process": "", "sequence": str(paths.SCORER_SEQUENCE),
         "confidence": "confidence"}

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--problems", type=int, default=48, help="test-split problems, each solved once per scorer")
ap.add_argument("--ops", default="6,8", help="operations per problem, lo,hi (6,8: the hard end)")
ap.add_argument("--seed", type=int, default=11, help="seed of the problems (each Solve's seed is its index)")
ap.add_argument("--scorers", default="mlp,process",
                help="comma-separated: mlp (the old served default) | process (the new: '') | sequence | "
                     "confidence (the training-free fallback for a model no shipped scorer reads)")
ap.add_argument("--json", default="", help="write the table here")
args = ap.parse_args()
lo, hi = (int(x) for x in args.ops.split(","))
problems = generate("test", args.problems, args.seed, TaskConfig(lo, hi))
names = args.scorers.split(",")
servers, targets = {}, {}
for name in names:
    spec = SPECS[name]
    cfg = ScorerServerConfig(port=0, metrics_port=0)
    servers[name] = start_scorer_server(cfg, scorer=load_scorer_spec(spec))
    targets[name] = Embedded(EmbeddedConfig(scorer=spec, scorer_address=f"127.0.0.1:{servers[name].port}"))
got = {n: {"correct": 0, "fallbacks": 0, "traces": 0} for n in names}
try:
    for i, p in enumerate(problems):
        for name in (names if i % 2 == 0 else names[::-1]):
            res = list(targets[name].solve(p.prompt, SolveConfig(seed=i)))[-1]
            got[name]["correct"] += res["answer"] == str(p.answer)
            got[name]["traces"] += len(res["traces"])
        print(f"\r{i + 1}/{len(problems)} " + "  ".join(f"{n} {got[n]['correct']}" for n in names),
              end="", flush=True)
    print()
    for name in names:
        got[name]["fallbacks"] = targets[name].target.scorer.fallbacks
finally:
    for name in names:
        targets[name].close()
        servers[name].stop()
rows = []
print("| served scorer | reads | accuracy | traces a Solve | scorer fallbacks |")
print("|---|---|---:|---:|---:|")
for name in names:
    g = got[name]
    rows.append({"scorer": name, "spec": SPECS[name], "correct": g["correct"], "problems": len(problems),
                 "accuracy": g["correct"] / len(problems), "traces_per_solve": g["traces"] / len(problems),
                 "fallbacks": g["fallbacks"]})
    r = rows[-1]
    reads = {"process": "hidden + confidence", "confidence": "confidence"}.get(name, "hidden")
    print(f"| {name} | {reads} | {100 * r['accuracy']:.1f}% ({r['correct']}/{r['problems']}) | "
          f"{r['traces_per_solve']:.1f} | {r['fallbacks']} |")
if args.json:
    with open(args.json, "w") as f:
        json.dump({"args": vars(args), "rows": rows}, f, indent=1)
