"""How much of Gambit-vs-STEP is the scorer? Both searches guided by an oracle of known quality.

Usage: PYTHONPATH=services .venv/bin/python tools/search_oracle.py [PROBLEMS] [SPLIT] [ORACLES] [METHODS]
[JSON] (defaults: 192 hard dev problems; ORACLES ``process=0,path=0,path=2,path=4,model``; METHODS
``step,gambit``, and ``gambit_ties``: the tournament before stop 61, tied swaps made;
results/search_oracle.json). ``--plot OUT.png JSON [JSON ...]`` draws result files
instead of running. An oracle is ``LABEL=SIGMA``:

* ``process``: every thought so far is a correct ``a op b = c`` line (``tasks.arithmetic.check_thought``);
* ``path``: every thought so far is the reference solution's step (right operands too);
* ``SIGMA``: Gaussian noise on the label's logit, so the oracle's AUC on its own label is
  Phi(4 / (SIGMA * sqrt 2)): 1.0 at 0, 0.92 at 2, 0.76 at 4. The noise is a hash of (trace, position):
  every search stays deterministic, and each boundary's error is independent of the others.
* ``LABEL~SIGMA``: the same noise drawn once per trace (a hash of the trace alone), so a trace the
  oracle misjudges stays misjudged at every boundary, as a scorer's errors that follow from the trace's
  content do (a branch child draws its own).

``model`` is the shipped process scorer (the bench's default). Each oracle reads the trace's text up to
the boundary, nothing later. Everything else is the bench's sizing (``tools/search_dev_sweep.py``): 6
runs at once, C = 16, 0.6 of the KV the pool needs, interleaved per chunk; SC@16 runs once as the
reference. The report: each method's vote, the share of problems with any right finished trace, and
the scorer's AUC against the ``path`` label over the boundaries it scored in the runs: pooled, and
within a group of one run and one thought index (the traces a round compares).
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from gambit.bench.search import BenchSearchConfig, bench_run_id, chunk_engine, run_variants
from gambit.model.loader import load_model
from gambit.scoring.auc import auc
from gambit.scoring.evaluate import grouped_auc
from gambit.scoring.spec import load_scorer_spec
from gambit.search import run_state
from gambit.search.driver import SearchDriver
from gambit.tasks.arithmetic import THOUGHT_SEP, TaskConfig, check_thought, format_step, generate

if {"-h", "--help"} & set(sys.argv[1:]):  # the usage (the positional form read "--help" as a value)
    print(__doc__)
    sys.exit(0)

CFG = BenchSearchConfig(quick=True, concurrency=6, capacity=16, sensitivity=False, frontier=False, pr=False)


class OracleScorer:
    """Scores a boundary from the feature column ``oracle_features`` put behind the state: the noisy
    oracle score itself (the next column is its clean label, unused here)."""

    confidence = True  # the driver then appends per-boundary features (the oracle's)

    def __init__(self, label: str, sigma: float, sticky: bool = False) -> None:
        self.label, self.sigma, self.sticky = label, sigma, sticky
        self.queued: list[tuple[bool, tuple]] = []  # (path label, group) per boundary to be scored
        self.seen: list[tuple[float, bool, tuple]] = []  # (score, path label, group) per boundary scored

    def score(self, keys: list[str], x: torch.Tensor) -> torch.Tensor:
        return record(self, keys, x[:, -2].clone())

    def fork(self, parent: str, child: str) -> None:
        pass

    def drop(self, key: str) -> None:
        pass


def record(scorer, keys: list[str], s: torch.Tensor) -> torch.Tensor:
    """Pair the scores with the labels queued for them, in order (one method per driver at a time,
    so deferral keeps the order in which ``boundary_features`` queued them)."""
    got, scorer.queued = scorer.queued[:len(keys)], scorer.queued[len(keys):]
    scorer.seen += [(v, y, g) for v, (y, g) in zip(s.tolist(), got, strict=True)]
    return s


def within_round_auc(seen: list[tuple[float, bool, tuple]]) -> float:
    """AUC over the pairs that share a group (one run, one thought index): what a round compares."""
    ids: dict[tuple, int] = {}
    groups = torch.tensor([ids.setdefault(g, len(ids)) for _, _, g in seen])
    v, y, _ = zip(*seen, strict=True) if seen else ((), (), ())
    return grouped_auc(torch.tensor(v), torch.tensor(y), groups, by_pairs=True)[0]


class MeasuredScorer:
    """The shipped scorer, unchanged, with its in-run scores kept beside the ``path`` label."""

    def __init__(self, inner) -> None:
        self.inner, self.queued, self.seen = inner, [], []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def score(self, keys: list[str], x: torch.Tensor) -> torch.Tensor:
        return record(self, keys, self.inner.score(keys, x))


def oracle_label(text: str, steps: list[str] | None) -> bool:
    """Every complete thought in ``text`` is right (``steps``: the reference's, else arithmetic)."""
    thoughts = text.split(THOUGHT_SEP)[:-1]  # the last piece is still being written
    for j, t in enumerate(thoughts):
        t = t.strip()
        if steps is not None:
            if j >= len(steps) or t != steps[j]:
                return False
        elif check_thought(t) is False:
            return False
    return True


def noise(key: str, position: int) -> float:
    """A standard normal draw fixed by (trace, position): Box-Muller on a hash."""
    h = hashlib.blake2b(f"{key}:{position}".encode(), digest_size=16).digest()
    u1 = (int.from_bytes(h[:8], "little") + 1) / 2**64
    u2 = int.from_bytes(h[8:], "little") / 2**64
    return math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)


def install(tok, problems) -> None:
    """Route every oracle-scored run's boundary features through the oracle (a patch of this process)."""
    refs = {p.prompt: [format_step(*s, spell=p.spell_products) for s in p.steps] for p in problems}
    plain = run_state.SearchRun.boundary_features

    def oracle_features(self, node, position: int):
        sc = self.scorer
        if not isinstance(sc, OracleScorer | MeasuredScorer) or not self.confidence:
            return plain(self, node, position)
        text = tok.decode(node.tokens)
        path_ok = oracle_label(text, refs[self.prompt])
        if self.wants_score(node):  # the driver scores this boundary: queue what the report needs
            sc.queued.append((path_ok, (self.run_id, text.count(THOUGHT_SEP))))
        if isinstance(sc, MeasuredScorer):
            return plain(self, node, position)
        ok = path_ok if sc.label == "path" else oracle_label(text, None)
        logit = (4.0 if ok else -4.0) / 2 + sc.sigma * noise(self.key(node.id), -1 if sc.sticky else position)
        return [1 / (1 + math.exp(-logit)), float(ok)]

    run_state.SearchRun.boundary_features = oracle_features


def plot(paths: list[str], out: str) -> None:
    """Accuracy of STEP and Gambit under each guide, SC@16 as a line, one panel per result JSON (merged
    by split): ``tools/search_oracle.py --plot OUT.png JSON [JSON ...]``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_split: dict[str, dict] = {}
    for path in paths:
        d = json.loads(Path(path).read_text())
        by_split.setdefault(f"{d['split']}, {d['problems']} hard problems", {}).update(d["table"])
    fig, axes = plt.subplots(1, len(by_split), figsize=(6.5 * len(by_split), 4), squeeze=False)
    for ax, (title, table) in zip(axes[0], by_split.items(), strict=True):
        guides = list(dict.fromkeys(k.split("/", 1)[1] for k in table if "/" in k))
        # by the oracle's noise (per boundary before per trace), the shipped scorer last
        guides.sort(key=lambda g: (g == "model", float(g.replace("~", "=").partition("=")[2] or 0), "~" in g))
        x = range(len(guides))
        for i, (m, color) in enumerate((("step", "tab:orange"), ("gambit", "tab:blue"))):
            ys = [100 * table[f"{m}/{g}"]["accuracy"] if f"{m}/{g}" in table else 0 for g in guides]
            ax.bar([j + (i - 0.5) * 0.38 for j in x], ys, 0.38, color=color, label=m.upper() if m == "step"
                   else "Gambit")
        ax.axhline(100 * table["sc"]["accuracy"], color="gray", ls="--", label="SC@16")
        labels = []
        for g in guides:
            r = table.get(f"gambit/{g}", {})
            au = r.get("auc_path_within") or r.get("auc_path") or r.get("oracle_auc")  # older files: the last
            label, sticky, sigma = g.replace("~", "=~").partition("=")[0], "~" in g, g.partition("=")[2] or \
                g.partition("~")[2]
            name = "shipped\nscorer" if g == "model" else \
                f"oracle {label}\nσ={sigma}" + (" per trace" if sticky else "")
            labels.append(f"{name}\nAUC {au:.2f}" if au else name)
        ax.set_xticks(list(x), labels, fontsize=7)
        ax.set_ylabel("accuracy (%)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle("Same search, different guides: the tournament turns an independent signal into accuracy",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


def main() -> None:
    a = sys.argv[1:]
    if a and a[0] == "--plot":
        plot(a[2:], a[1])
        return
    n = int(a[0]) if a else 192
    split = a[1] if len(a) > 1 else "dev"
    oracles = (a[2] if len(a) > 2 and a[2] else "process=0,path=0,path=2,path=4,model").split(",")
    methods = (a[3] if len(a) > 3 and a[3] else "step,gambit").split(",")
    out_path = Path(a[4] if len(a) > 4 else "results/search_oracle.json")
    torch.set_num_threads(CFG.threads)
    model, tok = load_model(CFG.model, device="cpu", dtype="float32")
    problems = generate(split, n, CFG.seed + 1, TaskConfig(6, 8))
    install(tok, problems)
    engine, per_run = chunk_engine(model, tok, problems, CFG)
    drivers = {"": SearchDriver(engine)}
    scorers = {}
    for o in oracles:
        if o == "model":
            scorers[o] = MeasuredScorer(load_scorer_spec(CFG.scorer, model.config.hidden_size))
        else:
            sticky = "~" in o
            label, _, sigma = o.replace("~", "=").partition("=")
            if label not in ("process", "path"):
                raise SystemExit(f"oracle {o!r}: the label must be process or path")
            scorers[o] = OracleScorer(label, float(sigma or 0), sticky)
        drivers[o] = SearchDriver(engine, scorers[o])
    vs = {"sc": ("", CFG.search(method="sc"))}
    for o in oracles:
        for m in methods:
            # gambit_ties: the tournament's rule before stop 61 (a swap need not gain)
            vs[f"{m}/{o}"] = (o, CFG.search(method="gambit", swap_ties=True) if m == "gambit_ties"
                              else CFG.search(method=m))
    records: dict = {}
    with tqdm(total=n * len(vs), desc=f"oracle {split}", mininterval=10) as bar:
        run_variants(drivers, list(vs), vs, problems, CFG, bar, records)
    table = {}
    for name, (kind, _) in vs.items():
        runs = records[name]["runs"]
        sc = scorers.get(kind)
        pooled = within = sc_right = sc_wrong = None
        if isinstance(sc, OracleScorer | MeasuredScorer):
            # this variant's boundaries (a scorer serves both methods), and whether SC@16's majority
            # vote solved each run's problem
            sc_ok = {bench_run_id(name, i): r["correct"] for i, r in enumerate(records["sc"]["runs"])}
            mine = [row for row in sc.seen if row[2][0] in sc_ok]
            v, y, _ = zip(*mine, strict=True)
            pooled, within = auc(torch.tensor(v), torch.tensor(y)), within_round_auc(mine)
            sc_right = within_round_auc([row for row in mine if sc_ok[row[2][0]]])
            sc_wrong = within_round_auc([row for row in mine if not sc_ok[row[2][0]]])
        table[name] = {"accuracy": sum(r["correct"] for r in runs) / n,
                       "any_right": sum(r["pass_any"] for r in runs) / n,
                       "tokens": sum(r["tokens"] for r in runs) / n, "auc_path": pooled,
                       "auc_path_within": within,
                       "auc_path_within_sc_right": sc_right, "auc_path_within_sc_wrong": sc_wrong}
    print(f"\n{split}, hard (6-8 ops), {n} problems, C = 16, {per_run} KV blocks per run")
    print("| variant | accuracy | any trace right | tokens/problem | scorer AUC (path label): all | "
          "within run and thought | within, where SC@16 is right | within, where SC@16 is wrong |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    keys = ("auc_path", "auc_path_within", "auc_path_within_sc_right", "auc_path_within_sc_wrong")
    for name, r in table.items():
        au = ["—" if r[k] is None else f"{r[k]:.3f}" for k in keys]
        print(f"| {name} | {100 * r['accuracy']:.1f}% | {100 * r['any_right']:.1f}% | {r['tokens']:.0f} | "
              + " | ".join(au) + " |")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps({"split": split, "problems": n, "table": table}, indent=1))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
