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
from dataclasses import asdict, replace
from pathlib import Path

import torch
from tqdm import tqdm

from gambit.bench import args as bench_args
from gambit.bench import record
from gambit.bench.kernel_note import cpu_kernels_note
from gambit.bench.search_config import DIFFICULTIES, BenchSearchConfig, hard_only, variants
from gambit.bench.search_config import METHODS as METHODS  # the tools and tests import these from here
from gambit.bench.search_config import pr_available as pr_available
from gambit.bench.search_report import headline, headline_set
from gambit.engine import Engine, EngineConfig
from gambit.engine.block_manager import shared_prompt_blocks
from gambit.engine.config import SpecConfig
from gambit.model.loader import load_model
from gambit.scoring.spec import load_scorer_spec
from gambit.search.driver import SearchDriver
from gambit.search.results import RunResult
from gambit.search.run_state import TIMING_KEYS
from gambit.tasks.arithmetic import Problem, TaskConfig
from gambit.tasks.graded import answer_kind, check_readable, graded_problems, task_problems


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
    prov = record.provenance("search", argv, {"seed": cfg.seed})

    def partial() -> dict | None:  # Ctrl-C: the chunks finished (the last checkpoint), marked interrupted
        return {**out, "provenance": prov} if out["by_difficulty"] else None

    with record.on_interrupt("search", json_path, partial), tqdm(total=total, desc="bench search",
                                                                  mininterval=5) as bar:
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
                if json_path:  # through a temporary file: a kill mid-write keeps the last one whole
                    record.write_json({**out, "provenance": prov}, json_path + ".partial")

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
    out["provenance"] = record.provenance("search", argv, {"seed": cfg.seed})
    if json_path:
        print(f"wrote {record.write_json(out, json_path)}")
        # the checkpoints after every chunk: a finished run's would be left beside it, read as a stopped run
        Path(json_path + ".partial").unlink(missing_ok=True)
    return out
