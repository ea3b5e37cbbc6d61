"""The configuration of ``gambit bench search``: its flags (``BenchSearchConfig``, every value checked
before a model loads) and the method variants they select (the main comparison, and the frontier points
and sensitivity sweep on the hard problems)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

from gambit.bench import args as bench_args
from gambit.checks import at_least
from gambit.engine.config import SpecConfig
from gambit.model.loader import DTYPES
from gambit.paths import TARGET
from gambit.scoring.spec import check_scorer_spec
from gambit.search.config import SearchConfig
from gambit.tasks.graded import check_benchmark

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
        for name in ("scorer", "scorer_mlp", "scorer_sequence"):  # after the model's load, all as "scorer"
            try:
                check_scorer_spec(getattr(self, name))
            except ValueError as e:
                raise ValueError(re.sub(r"^scorer\b", name, str(e))) from None
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
