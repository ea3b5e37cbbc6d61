"""Search settings on the dev split, many problems: which ranking, floor, swap and vote to ship.

Usage: PYTHONPATH=services .venv/bin/python tools/search_dev_sweep.py [PROBLEMS] [SPLIT] [VARIANTS] [JSON]
(defaults: 192 hard problems of the dev split, the variants of ``DEFAULT``, results/search_dev_sweep.json;
VARIANTS: ``method[knob=value,...]`` separated by ';', knobs of ``SearchConfig``).

Every variant runs on the same problems with the bench's engine sizing (``bench.search.chunk_engine``:
6 runs at once, C = 16, 0.6 of the KV the pool needs) and the default process scorer, interleaved per
chunk (``bench.search.run_variants``). Searches are seeded and deterministic, so only the problem
count limits a comparison. Besides each method's own vote it scores, from the same finished traces,
other votes: majority, score-weighted by the mean / last boundary score, and a vote over the traces
whose last score is at least 0.5 (majority when none is). Model selection uses the dev split; the
test split only checks what was chosen.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from gambit.bench.search import BenchSearchConfig, bench_run_id, chunk_engine, run_variants
from gambit.model.loader import load_model
from gambit.scoring.spec import load_scorer_spec
from gambit.search import tree as T
from gambit.search.driver import SearchDriver
from gambit.search.vote import majority_vote, weighted_vote
from gambit.tasks.arithmetic import TaskConfig, generate

if {"-h", "--help"} & set(sys.argv[1:]):  # the usage (the positional form read "--help" as a value)
    print(__doc__)
    sys.exit(0)

CFG = BenchSearchConfig(quick=True, concurrency=6, capacity=16, sensitivity=False, frontier=False, pr=False)


DEFAULT = ("sc;step;step[rank=last];gambit;gambit[rank=last];gambit[rank=min];gambit[rank=last,floor=0.5];"
           "gambit[rank=last,floor=0.3];gambit[floor=0.5];gambit[rank=last,swap=2];gambit[rank=last,swap=8];"
           "gambit[rank=last,interval=16]")


def parse(spec: str) -> tuple[str, object]:
    """``method[knob=value,...]`` -> (scorer kind, SearchConfig): the bench's settings plus these knobs."""
    method, _, rest = spec.partition("[")
    kw: dict = {"method": method}
    for item in filter(None, rest.rstrip("]").split(",")):
        k, _, v = item.partition("=")
        kw[k] = v if k == "rank" else v == "true" if v in ("true", "false") else float(v) if "." in v \
            else int(v)
    return ("main" if method in ("gambit", "step") else ""), CFG.search(**kw)


def finished(store, run_id: str) -> list[tuple[str | None, list[float]]]:
    """(answer, boundary scores) of each trace that finished, from the run's tree-view record."""
    nodes = store.load(run_id)["nodes"].values()
    return [(n["answer"], n["scores"]) for n in nodes if n["state"] == T.FINISHED]


def votes(traces: list[tuple[str | None, list[float]]]) -> dict[str, str | None]:
    answers = [a for a, _ in traces]
    mean = [sum(s) / len(s) if s else 0.0 for _, s in traces]
    last = [s[-1] if s else 0.0 for _, s in traces]
    maj = majority_vote(answers)
    kept = [a for a, w in zip(answers, last, strict=True) if w >= 0.5]
    return {"majority": maj,
            "w_mean": weighted_vote(answers, mean) if sum(mean) > 0 else maj,
            "w_last": weighted_vote(answers, last) if sum(last) > 0 else maj,
            "kept_last>=0.5": majority_vote(kept) if kept else maj}


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 192
    split = sys.argv[2] if len(sys.argv) > 2 else "dev"
    specs = (sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] else DEFAULT).split(";")
    out_path = Path(sys.argv[4] if len(sys.argv) > 4 else "results/search_dev_sweep.json")
    torch.set_num_threads(CFG.threads)
    model, tok = load_model(CFG.model, device="cpu", dtype="float32")
    scorer = load_scorer_spec(CFG.scorer, model.config.hidden_size)
    vs = {k: parse(k) for k in specs}
    problems = generate(split, n, CFG.seed + 1, TaskConfig(6, 8))
    engine, per_run = chunk_engine(model, tok, problems, CFG)
    drivers = {"": SearchDriver(engine), "main": SearchDriver(engine, scorer)}
    records: dict = {}
    with tqdm(total=n * len(vs), desc=f"sweep {split}", mininterval=10) as bar:
        run_variants(drivers, list(vs), vs, problems, CFG, bar, records)
    table = {}
    for name in vs:
        runs = records[name]["runs"]
        store = drivers[vs[name][0]].store
        got = {k: 0 for k in ("majority", "w_mean", "w_last", "kept_last>=0.5")}
        for i, p in enumerate(problems):
            for k, a in votes(finished(store, bench_run_id(name, i))).items():
                got[k] += a == str(p.answer)
        table[name] = {"own": sum(r["correct"] for r in runs) / n,
                       "any": sum(r["pass_any"] for r in runs) / n,
                       "tokens": sum(r["tokens"] for r in runs) / n} | {k: v / n for k, v in got.items()}
    cols = ["own", "majority", "w_mean", "w_last", "kept_last>=0.5", "any", "tokens"]
    print(f"\n{split}, hard (6-8 ops), {n} problems, C = 16, {per_run} KV blocks per run")
    print("| variant | " + " | ".join(cols) + " |\n|---|" + "---:|" * len(cols))
    for name, row in table.items():
        print(f"| {name} | " + " | ".join(f"{row[c]:.1f}" if c == "tokens" else f"{100 * row[c]:.1f}%"
                                            for c in cols) + " |")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps({"split": split, "problems": n, "table": table}, indent=1))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
