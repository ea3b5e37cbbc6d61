"""``gambit bench search``: Gambit against SC@C, STEP and DeepConf on one engine, same capacity.

Held-out (test split) problems at two difficulties: the whole training range (2-8 operations) and
its hard end (6-8). Problems go in chunks of ``concurrency`` runs searched at once on the engine;
within a chunk every method runs in turn, in an order that rotates from chunk to chunk, so machine
noise hits all methods alike. KV memory is sized below what C full traces need, so memory pressure
(eviction, ghosts, recompute queueing) happens as on a full GPU.

``overhead_fraction`` (every method; the target is Gambit's) is the search's own time over the
chunks' wall time (first submit to last result), from the driver's timers (``SearchDriver.timings``):
guidance (scorer calls, score application, waiting on remote scores) + tree (per run and step: limit
checks, rounds with their engine fork/abort, round records and store writes, a finished run's vote
and last write) + scheduling (routing every engine event to the tree view, confidence features, the
KV-ratio eviction). Not in it: the engine step (forward, sampling, its own scheduler and KV
bookkeeping), run submission and loop glue ("other" in Table 3). The CPU-time view of the same parts,
per round and per step, is ``gambit bench rounds``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import ClassVar

import torch
from tqdm import tqdm

from gambit.bench import args as bench_args
from gambit.bench.kernel_note import cpu_kernels_note
from gambit.bench.search_report import headline, headline_set
from gambit.checks import at_least
from gambit.engine import Engine, EngineConfig
from gambit.engine.block_manager import shared_prompt_blocks
from gambit.engine.config import SpecConfig
from gambit.model.loader import DTYPES, load_model
from gambit.paths import TARGET
from gambit.scoring.spec import load_scorer_spec
from gambit.search.config import SearchConfig
from gambit.search.driver import SearchDriver
from gambit.search.results import RunResult
from gambit.search.run_state import TIMING_KEYS
from gambit.tasks.arithmetic import Problem, TaskConfig
from gambit.tasks.graded import answer_kind, check_benchmark, check_readable, graded_problems, task_problems

DIFFICULTIES = {"all": (2, 8), "hard": (6, 8)}


# the variants ``--methods`` can name (``variants``)
METHODS = ("gambit", "sc", "step", "deepconf", "gambit_pr", "gambit_mlp", "step_mlp", "gambit_seq",
           "step_seq", "gambit_ties")


@dataclass
class BenchSearchConfig:
    FLAG_ERRORS: ClassVar[bool] = True  # gambit.config_cli: its errors name the flags, exit 2
    quick: bool = False  # fewer problems and a smaller sensitivity sweep (a few minutes)
    model: str = str(TARGET)  # target model: a folder or a name such as smollm2
    problems: int = 0  # problems per difficulty (0: 8 with --quick, else 40)
    capacity: int = 16  # C: traces per problem, the same for every method
    concurrency: int = 4  # runs searched at once on the engine (the same for every method)
    kv_share: float = 0.6  # KV blocks per run as a share of what C full-length traces need
    swap: int = 4  # Gambit K: traces pruned and branched per round (0: none; a frontier pool: <= C/4)
    interval: int = 8  # Gambit Δ: decode steps between tournament rounds
    warmup: int = 24  # Gambit w: tokens of a trace before it is scored
    floor: float = 0.0  # Gambit δ: score floor in [0, 1]; a trace scoring below it is pruned (0: none)
    floor_refill: bool = True  # Gambit: refill a floor-pruned trace's slot (False: the pool shrinks)
    rank: str = "mean"  # Gambit/STEP ranking score: mean | last | min
    roots: int = 0  # Gambit: traces launched at the start (0: C)
    stop_when_decided: bool = False  # Gambit: end a run once the active traces cannot change the majority
    child_temperature: float = 1.0  # Gambit child temperature multiplier
    kv_ratio: float = 0.9  # r, Gambit and STEP: above this share of the KV cache in use, evict a trace
    temperature: float = 0.8  # sampling temperature
    seed: int = 0  # problem selection and trace seeds
    sensitivity: bool = True  # run the K / Δ / w / r sweep (Figure 10) on the hard problems
    frontier: bool = True  # SC and Gambit at C/4 and C/2 as well (Figure 5)
    pr: bool = True  # Gambit with PR decoding, when the engine has it
    pr_drafter: str = ""  # Gambit + PR drafter folder ("" = the shipped one; a real model needs its own)
    scorer: str = "process"  # Table 1's scorer (Gambit and STEP alike): a spec, gambit.scoring.spec
    scorer_mlp: str = "mlp"  # Table 2's MLP scorer: "mlp" (shipped) or any scorer spec
    scorer_sequence: str = "sequence"  # Table 2's sequence scorer: "sequence" (shipped) or any scorer spec
    threads: int = 2  # torch intra-op CPU threads
    device: str = "auto"  # torch device of the target: "auto" (CUDA when present, else CPU), "cpu", "cuda:N"
    dtype: str = "auto"  # target dtype: auto (CPU float32, CUDA bfloat16) | float32 | bfloat16 | float16
    # the engine's default cap suits the CPU, where a tree per trace makes a big step compute-bound
    spec_max_batch: int = SpecConfig.max_batch  # Gambit + PR drafts in steps of <= this many traces (0: all)
    plots: str = "results/bench_search"  # folder for the PNG figures
    difficulties: str = "all,hard"  # which difficulty sets to run (comma list of all, hard)
    methods: str = ""  # variants to run, comma list (empty: all but gambit_ties): gambit,sc,step,...
    merge: str = ""  # instead of running: merge these result JSONs (comma list) into one report
    # a graded benchmark's questions instead of the task's two difficulties (a real model, its format)
    benchmark: str = ""  # graded public benchmark: gsm8k | aime25 | hmmt24 | hmmt25 | gpqa ("" = the task)
    data: str = ""  # the benchmark's JSONL file ("" = ../shared/datasets/, or $GAMBIT_DATASETS)
    max_tokens: int = 0  # tokens per trace, every method (0: SearchConfig's default, 256)

    def __post_init__(self) -> None:
        at_least(4, capacity=self.capacity)
        at_least(1, concurrency=self.concurrency, threads=self.threads)  # torch takes no 0 threads
        if not 0 < self.kv_share <= 4:  # NaN is not
            raise ValueError(f"kv_share must be in (0, 4], got {self.kv_share!r}")
        at_least(0, problems=self.problems)
        bench_args.device("device", self.device)
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be auto or one of {', '.join(DTYPES)}, got {self.dtype!r}")
        bad = set(self.difficulties.split(",")) - set(DIFFICULTIES)
        if bad:
            raise ValueError(f"difficulties: unknown {sorted(bad)}; known {sorted(DIFFICULTIES)}")
        try:
            SpecConfig(max_batch=self.spec_max_batch)  # its check
        except ValueError as e:
            raise ValueError(f"spec_max_batch: {e}") from None
        bad = set(self.methods.split(",")) - set(METHODS) if self.methods else set()
        if bad:
            raise ValueError(f"methods: unknown {sorted(bad)}; known {list(METHODS)}")
        check_benchmark(self.benchmark, self.data)
        if self.max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0 (0: the default), got {self.max_tokens}")
        self.search()  # SearchConfig's checks (rank, temperature, ...): before the model loads, not after
        for f in (f for f in self.merge.split(",") if f):  # read instead of running: here, not at the end
            if not Path(f).is_file():
                raise ValueError(f"merge: {f}: no such file (a result JSON of an earlier bench search)")

    @property
    def n_problems(self) -> int:
        return self.problems or (8 if self.quick else 40)

    def search(self, **kw) -> SearchConfig:
        base = SearchConfig(method="gambit", capacity=self.capacity, swap=self.swap, interval=self.interval,
                            warmup=self.warmup, floor=self.floor, child_temperature=self.child_temperature,
                            kv_ratio=self.kv_ratio, temperature=self.temperature, seed=self.seed,
                            floor_refill=self.floor_refill, rank=self.rank, roots=self.roots,
                            stop_when_decided=self.stop_when_decided)
        if self.max_tokens:
            base = replace(base, max_tokens=self.max_tokens)
        return replace(base, **kw)


def variants(cfg: BenchSearchConfig) -> dict[str, tuple[str, SearchConfig]]:
    """name -> (scorer kind, config) for the main comparison (both difficulties)."""
    v = {"gambit": ("main", cfg.search()), "sc": ("", cfg.search(method="sc")),
         "step": ("main", cfg.search(method="step")),
         "deepconf": ("", cfg.search(method="deepconf")),
         "gambit_mlp": ("mlp", cfg.search(rank="mean", floor=0.0, roots=0)),
         "step_mlp": ("mlp", cfg.search(method="step", rank="mean")),
         "gambit_seq": ("sequence", cfg.search(rank="mean", floor=0.0, roots=0)),
         "step_seq": ("sequence", cfg.search(method="step", rank="mean")),
         "gambit_ties": ("main", cfg.search(swap_ties=True))}  # stop 60's rule: a swap need not gain
    if cfg.pr and (pr_available() or cfg.pr_drafter):
        v["gambit_pr"] = ("main", cfg.search(decoding="pr"))
    keep = set(cfg.methods.split(",")) if cfg.methods else set(v) - {"gambit_ties"}  # an A/B, when named
    if "gambit_pr" in keep and "gambit_pr" not in v:
        raise ValueError("methods: gambit_pr needs --pr and a PR drafter (--pr-drafter or a shipped one)")
    return {k: x for k, x in v.items() if k in keep}


def warm_up(engine: Engine, prompt: list[int], batch: int, decodings: set[str]) -> None:
    """Before timing: load each drafter and decode a few steps at the bench's batch with each decoding,
    so no method's first chunk pays for first calls (a drafter's load and packing, first-shape buffers:
    ~0.4 s of Gambit + PR's first chunk, measured) that a running server paid at start."""
    from gambit.engine import SamplingParams

    for dec in sorted(decodings):
        if dec != "plain":
            engine.speculator().prepare(dec)
        engine.generate([prompt] * batch, SamplingParams(temperature=0.8, max_tokens=8, ignore_eos=True,
                                                         decoding=dec))


def pr_available() -> bool:
    """The engine decodes speculatively and the PR drafter ships."""
    from gambit import paths

    folder = getattr(paths, "DRAFTER_PR", None)
    return folder is not None and (Path(folder) / "config.json").is_file()


def hard_only(cfg: BenchSearchConfig) -> dict[str, tuple[str, SearchConfig]]:
    """Frontier points and the sensitivity sweep, on the hard problems only."""
    v: dict[str, tuple[str, SearchConfig]] = {}
    c = cfg.capacity
    if cfg.frontier:
        for cap in sorted({max(2, c // 4), c // 2}):
            v[f"sc@{cap}"] = ("", cfg.search(method="sc", capacity=cap))
            v[f"gambit@{cap}"] = ("main", cfg.search(capacity=cap, swap=min(cfg.swap, max(1, cap // 4)),
                                                     roots=cfg.roots * cap // c))
    if cfg.sensitivity:
        q = cfg.quick
        sweep = {"swap": [1, 8] if q else [1, 2, 8], "interval": [4, 16] if q else [4, 16, 32],
                 "warmup": [12, 48] if q else [12, 48, 72], "kv_ratio": [0.6] if q else [0.5, 0.7]}
        for name, vals in sweep.items():
            for x in vals:
                if x != getattr(cfg, name):
                    v[f"gambit[{name}={x}]"] = ("main", cfg.search(**{name: x}))
    return v


def blocks_needed(problems, tokenizer, capacity: int, block_size: int, max_tokens: int = 0) -> int:
    """KV blocks C full-length traces of the longest problem need: the prompt's full blocks once (a
    run's traces share one prefill, ``Engine.add_samples``), the rest per trace. A task problem's
    trace, in the format the target learnt, is as long as its solution; a benchmark question's or a
    chat model's (no solution it learnt) ``max_tokens``."""
    def need(p) -> int:
        n = len(tokenizer.encode(p.prompt))
        out = len(tokenizer.encode(p.solution)) + 8 if isinstance(p, Problem) else max_tokens
        return shared_prompt_blocks(n, n + out, capacity, block_size)

    return max(need(p) for p in problems)


def chunk_engine(model, tok, problems, cfg: BenchSearchConfig) -> tuple[Engine, int]:
    """The bench's engine for ``cfg.concurrency`` runs of these problems at once, and its KV blocks
    per run: ``kv_share`` of what C full traces need, evicting under pressure (as on a full GPU)."""
    per_run = max(4, int(cfg.kv_share * blocks_needed(problems, tok, cfg.capacity, 16,
                                                        cfg.search().max_tokens)))
    w = model.model.embed_tokens.weight  # the engine runs where the caller loaded the model
    engine = Engine(model, tok, EngineConfig(preemption="evict", num_blocks=per_run * cfg.concurrency,
                                             seed=cfg.seed, device=str(w.device),
                                             dtype=str(w.dtype).removeprefix("torch."),
                                             spec=SpecConfig(max_batch=cfg.spec_max_batch)))
    return engine, per_run


def bench_run_id(variant: str, problem: int) -> str:
    """The run id of a variant's run on problem ``problem`` (a valid store key: no brackets)."""
    return f"{variant.replace('@', '-at-')}-{problem}".translate(str.maketrans("[]=", "___"))


def run_variants(drivers, names, vs, problems, cfg, bar, records, checkpoint=None) -> None:
    """Chunks of ``concurrency`` problems; every variant on each chunk, rotating the order."""
    for ci in range(0, len(problems), cfg.concurrency):
        chunk = problems[ci:ci + cfg.concurrency]
        k = (ci // cfg.concurrency) % len(names)
        for name in names[k:] + names[:k]:
            kind, scfg = vs[name]
            d = drivers[kind]
            before = dict(d.timings)
            st = d.engine.stats
            spec0 = (st.spec_drafts, st.spec_capped_steps)
            t0 = time.perf_counter()
            ids = [d.submit(p, scfg, run_id=bench_run_id(name, ci + j)) for j, p in enumerate(chunk)]
            # the bar moves as each run ends: per chunk it once stood still for minutes
            res = d.run_until_done(ids, on_event=lambda ev: isinstance(ev, RunResult) and bar.update(1))
            wall = time.perf_counter() - t0
            rec = records.setdefault(name, {"runs": [], "series": None,
                                            "spec_drafts": 0, "spec_capped_steps": 0,
                                            "timings": dict.fromkeys(TIMING_KEYS, 0.0),
                                            "chunk_walls": [], "chunk_finished": []})
            rec["chunk_walls"].append(wall)  # per chunk: the variants' paired comparisons
            rec["chunk_finished"].append(sum(res[rid].finished_traces for rid in ids))
            rec["spec_drafts"] += st.spec_drafts - spec0[0]  # trees drafted
            rec["spec_capped_steps"] += st.spec_capped_steps - spec0[1]  # steps a batch cap made plain
            for key in TIMING_KEYS:
                rec["timings"][key] += d.timings[key] - before[key]
            for rid, p in zip(ids, chunk, strict=True):
                r, gold = res[rid], str(p.answer)
                rec["runs"].append({"correct": bool(r.correct), "tokens": r.tokens, "wall_s": r.wall_s,
                                    "finished": r.finished_traces, "branched": r.branched, "pruned": r.pruned,
                                    "evicted": r.evicted, "majority_ok": r.majority == gold,
                                    "weighted_ok": r.weighted == gold,
                                    "pass_any": any(t["answer"] == gold for t in r.traces)})
            if rec["series"] is None:  # Figures 3/6: the first run's pool and KV over time
                rounds = d.store.load(ids[0])["rounds"]
                rec["series"] = [[r["t"], r["resident"], r["active"], r["kv_usage"]] for r in rounds]
            if checkpoint is not None:
                checkpoint()


def summarise(rec: dict) -> dict:
    runs = rec["runs"]
    n = len(runs)
    t = rec["timings"]
    wall = sum(rec["chunk_walls"])  # in chunk order, as it was accumulated
    spent = sum(t.values())
    out = {"problems": n, "accuracy": sum(r["correct"] for r in runs) / n,
           "majority_accuracy": sum(r["majority_ok"] for r in runs) / n,
           "weighted_accuracy": sum(r["weighted_ok"] for r in runs) / n,
           "any_trace_correct": sum(r["pass_any"] for r in runs) / n,
           "tokens": sum(r["tokens"] for r in runs) / n, "wall_s": sum(r["wall_s"] for r in runs) / n,
           "trace_throughput": sum(r["finished"] for r in runs) / wall if wall else 0.0,
           "finished_traces": sum(r["finished"] for r in runs) / n,
           "branched": sum(r["branched"] for r in runs) / n, "pruned": sum(r["pruned"] for r in runs) / n,
           "evicted": sum(r["evicted"] for r in runs) / n, "chunk_wall_s": wall,
           "time_split": {k: v / wall for k, v in t.items()} | {"other": max(0.0, wall - spent) / wall},
           # the search's own time (module docstring): everything the driver does but the engine step
           "overhead_fraction": (t["guidance"] + t["tree"] + t["scheduling"]) / wall if wall else 0.0,
           "spec_drafts": rec["spec_drafts"], "spec_capped_steps": rec["spec_capped_steps"],
           "chunk_walls": rec["chunk_walls"], "chunk_finished": rec["chunk_finished"],
           "series": rec["series"]}
    return out


def run_bench(cfg: BenchSearchConfig, json_path: str | None, argv: list[str] | None = None) -> dict:
    """Every table; ``argv``: the flags after ``gambit bench search``, recorded as the command line in
    the JSON (None: this process's own, which is not the command where a caller passes its own)."""
    from gambit.bench.search_report import check_targets, format_tables, merge_results, plot_all

    bench_args.out_path("--json", json_path)  # written after the whole run: checked first
    bench_args.out_path("--plots", cfg.plots, folder=True)
    if cfg.merge:
        out = merge_results(cfg.merge.split(","))
        return _report(out, cfg, json_path, check_targets, format_tables, plot_all, argv)
    torch.set_num_threads(cfg.threads)
    where = EngineConfig(device=cfg.device, dtype=cfg.dtype)
    model, tok = load_model(cfg.model, device=where.torch_device(), dtype=where.torch_dtype())
    main = load_scorer_spec(cfg.scorer, model.config.hidden_size)
    mlp = load_scorer_spec(cfg.scorer_mlp, model.config.hidden_size)
    seq = load_scorer_spec(cfg.scorer_sequence, model.config.hidden_size)
    main_vs, extra_vs = variants(cfg), hard_only(cfg)
    out: dict = {"config": asdict(cfg), "by_difficulty": {},
                 "scorers": {"main": cfg.scorer, "mlp": mlp.kind, "sequence": seq.kind}}
    t_start = time.perf_counter()
    sets = problem_sets(cfg)
    for _, ps in sets.values():  # before any method runs
        check_readable(ps, tok)
    total = sum(len(ps) * (len(main_vs) + (len(extra_vs) if headline(diff) else 0))
                for diff, (_, ps) in sets.items())
    with tqdm(total=total, desc="bench search", mininterval=5) as bar:
        for diff, (ops, problems) in sets.items():
            ops = list(ops) if ops else None  # None: a benchmark's questions
            if cfg.benchmark:  # one answer rule for the whole set: the benchmark's
                rule = answer_kind(problems[0].item)
                main_vs = {k: (kind, replace(sc, answer_rule=rule)) for k, (kind, sc) in main_vs.items()}
                extra_vs = {k: (kind, replace(sc, answer_rule=rule)) for k, (kind, sc) in extra_vs.items()}
            engine, per_run = chunk_engine(model, tok, problems, cfg)
            if cfg.pr_drafter:  # "pr" drafts with this drafter (the shipped one fits only its target)
                from gambit.speculative import load_drafter

                engine.register_drafter("pr", load_drafter(cfg.pr_drafter, engine.model))
            warm_up(engine, tok.encode(problems[0].prompt), cfg.capacity * cfg.concurrency,
                    {sc.decoding for _, sc in (*main_vs.values(), *extra_vs.values())})
            drivers = {"": SearchDriver(engine), "main": SearchDriver(engine, main),
                       "mlp": SearchDriver(engine, mlp),
                       "sequence": SearchDriver(engine, seq)}
            records: dict = {}

            def checkpoint(diff=diff, ops=ops, per_run=per_run, records=records) -> None:
                """Partial results after every chunk (a long run that is stopped keeps them)."""
                out["by_difficulty"][diff] = {"ops": ops, "kv_blocks_per_run": per_run, "partial": True,
                                              "methods": {k: summarise(v) for k, v in records.items()}}
                if json_path:  # through a temporary file: a Ctrl-C mid-write keeps the last one whole
                    from gambit.bench import record

                    record.write_json(out, json_path + ".partial")

            run_variants(drivers, list(main_vs), main_vs, problems, cfg, bar, records, checkpoint)
            if headline(diff) and extra_vs:
                run_variants(drivers, list(extra_vs), extra_vs, problems, cfg, bar, records, checkpoint)
            out["by_difficulty"][diff] = {"ops": ops, "kv_blocks_per_run": per_run,
                                          "methods": {k: summarise(v) for k, v in records.items()}}
    out["seconds"] = time.perf_counter() - t_start
    out["notes"] = [n for n in (cpu_kernels_note(),) if n]  # timed the PyTorch path: said
    return _report(out, cfg, json_path, check_targets, format_tables, plot_all, argv)


def problem_sets(cfg: BenchSearchConfig) -> dict[str, tuple[tuple[int, int] | None, list]]:
    """name -> (operations range or None, problems): the task's difficulties, or one benchmark's questions
    (a seeded pick of ``n_problems``) in the model's prompt format."""
    if cfg.benchmark:
        return {cfg.benchmark: (None, graded_problems(cfg.benchmark, cfg.data, cfg.model, cfg.n_problems,
                                                      cfg.seed + 1))}
    return {diff: ((lo, hi), task_problems(cfg.model, "test", cfg.n_problems, cfg.seed + 1,
                                           TaskConfig(lo, hi)))
            for diff, (lo, hi) in DIFFICULTIES.items() if diff in cfg.difficulties.split(",")}


def _report(out, cfg, json_path, check_targets, format_tables, plot_all, argv=None) -> dict:
    head = headline_set(out) or next(iter(out["by_difficulty"].values()))
    out["methods"] = {k: v for k, v in head["methods"].items()
                      if k in ("sc", "step", "deepconf", "gambit", "gambit_pr")}
    out["targets"] = check_targets(out)
    print(format_tables(out))
    out["plots"] = plot_all(out, cfg.plots)
    from gambit.bench import record

    out["provenance"] = record.provenance("search", argv, {"seed": cfg.seed})
    if json_path:
        print(f"wrote {record.write_json(out, json_path)}")
    return out
