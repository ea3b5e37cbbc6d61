"""The main job on the embedded default (``make run`` / ``gambit run``): the shipped target solves
held-out problems with Gambit in one process (engine + scorer + tournament + in-memory tree store),
with a live view of the pool, and ends with each answer and its lineage."""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields, replace
from typing import ClassVar

from gambit.checks import at_least
from gambit.cpu_info import check_cpu_weights, check_kv_dtype
from gambit.drafter_map import parse_drafters
from gambit.engine import Engine, EngineConfig
from gambit.engine.config import SpecConfig
from gambit.paths import TARGET, check_output
from gambit.scoring.spec import check_scorer_spec, load_scorer_spec
from gambit.search.config import SearchConfig, check_batch, check_deepconf_pool, check_greedy_pool
from gambit.search.driver import SearchDriver
from gambit.search.lineage import lineage_png, lineage_text
from gambit.search.live import LiveView
from gambit.search.store import MemoryStore
from gambit.tasks.arithmetic import TaskConfig, TooFewProblems
from gambit.tasks.graded import (
    GradedProblem,
    answer_key,
    answer_kind,
    check_answer_rule,
    check_benchmark,
    check_readable,
    graded_name,
    graded_problems,
    task_problems,
)


@dataclass
class Question:
    """A ``--question``: its text, the model's prompt for it, and its gold key (None: not graded)."""

    text: str
    prompt: str
    answer: str | None


SHIPPED_WALL_S = 25.0  # `gambit run`'s wall limit per problem on the shipped target (RunConfig.max_wall_s -1)


@dataclass
class RunConfig:
    FLAG_ERRORS: ClassVar[bool] = True  # gambit.config_cli: its errors name the flags, exit 2
    model: str = str(TARGET)  # target model: a Hugging Face folder, or a name such as smollm2
    problems: int = 2  # held-out (test split) problems to solve
    samples: int = 16  # C: traces in the pool (SC@C launches this many)
    method: str = "gambit"  # search method: gambit | sc | step | deepconf
    # process: per-thought labels + confidence (the default); confidence: training-free (any model)
    scorer: str = "process"  # scorer: process | mlp | sequence | confidence | a folder (gambit.scoring.spec)
    swap: int = 4  # K: traces pruned and branched per round (0: none; above --samples: taken as --samples)
    interval: int = 8  # Δ: decode steps between rounds
    warmup: int = 24  # w: tokens before scoring; a child branches only w tokens after its birth
    temperature: float = 0.8  # sampling temperature of root traces
    top_p: float = 1.0  # nucleus mass of every trace's sampling, (0, 1] (1 = no nucleus)
    top_k: int = 0  # top-k filter of every trace's sampling (0 = none)
    seed: int = 0  # problem selection and trace seeds
    min_ops: int = 6  # fewest operations in a problem
    max_ops: int = 8  # most operations in a problem
    kv_blocks: int = 120  # KV blocks of the engine, 16 tokens each (small enough that memory pressure shows)
    # -1 on another model: none (25 s cut a SmolLM2 question's 16 traces at 17 tokens each)
    max_wall_s: float = -1.0  # seconds a problem may take (0: no limit; -1: 25 on the shipped target, else 0)
    max_tokens: int = 400  # tokens per trace at most
    save: str = "results/run_store.json"  # the tree store as JSON, for `gambit inspect RUN --store FILE`
    png: str = "results/run_lineage.png"  # lineage picture of the last problem ("" to skip)
    lineage_nodes: int = 60  # most lineage lines printed per problem
    decoding: str = "plain"  # plain | eagle3.1 | pr: speculative decoding of every trace (tau per trace)
    drafters: str = ""  # drafters for a real checkpoint: pr=FOLDER,eagle3.1=FOLDER ("" = the shipped ones)
    # the main job's pool drafts at any size (the engine's serving default, SpecConfig.max_batch, is 8)
    spec_max_batch: int = 0  # speculative traces draft only in steps of <= this many traces (0: no cap)
    cpu_weights: str = "float32"  # the engine's CPU linear weights: float32 | bfloat16 (AMX/AVX512-BF16 CPUs)
    kv_dtype: str = "auto"  # the engine's KV cache elements: auto (the model's dtype) | float32 | bfloat16
    batch_invariant: bool | None = None  # a trace's floats its own in any batch (unset: on where it holds)
    benchmark: str = ""  # a graded public benchmark: gsm8k | aime25 | hmmt24 | hmmt25 | gpqa ("" = the task)
    data: str = ""  # the benchmark's JSONL file ("" = ../shared/datasets/, or $GAMBIT_DATASETS)
    # one problem of your own, put to the model as the served Target puts SolveRequest.problem
    question: str = ""  # solve this text, not held-out problems ("-": read stdin; "" = held-out ones)
    gold: str = ""  # the --question's correct answer, to grade the vote ("" = not graded)
    answer_rule: str = ""  # task / --question answers read as: "" = boxed | integer | gsm8k | choice | latex

    def __post_init__(self) -> None:
        at_least(1, problems=self.problems, samples=self.samples)
        check_deepconf_pool(self.method, self.samples, "samples")
        check_benchmark(self.benchmark, self.data)
        self.benchmark = graded_name(self.benchmark)
        check_question(self)
        at_least(1, kv_blocks=self.kv_blocks)
        if self.max_wall_s != -1 and not 0 <= self.max_wall_s:  # NaN too; the top bound is SearchConfig's
            raise ValueError(f"max_wall_s must be >= 0 seconds (0: no limit; -1: 25 s on the shipped target, "
                             f"none on another model), got {self.max_wall_s}")
        at_least(0, lineage_nodes=self.lineage_nodes)
        check_scorer_spec(self.scorer)  # a typo, whichever method: `bench search` refuses it too
        check_output(self.save, "save")  # before the runs, not after them
        check_output(self.png, "png", image=True)
        if self.spec_max_batch < 0:
            raise ValueError(f"spec_max_batch must be >= 0 (0: no cap), got {self.spec_max_batch}")
        mapped = parse_drafters(self.drafters)
        if mapped and self.decoding not in mapped:  # it was accepted, and every trace decoded without it
            raise ValueError(f"drafters: maps {', '.join(mapped)}, but decoding is {self.decoding!r}: no "
                             f"trace would draft with them (give --decoding {next(iter(mapped))})")
        check_cpu_weights(self.cpu_weights)
        check_kv_dtype(self.kv_dtype)
        check_unused(self)
        TaskConfig(self.min_ops, self.max_ops)  # its range check, as flags (problems_of said fields)
        check_greedy_pool(self.method, self.temperature, self.samples, "samples")
        check_batch(self.method, self.samples, EngineConfig.max_num_seqs, "samples")  # the engine's default
        if self.method == "gambit" and self.warmup != RunConfig.warmup and self.warmup >= self.max_tokens:
            raise ValueError(f"--warmup {self.warmup} must be below --max-tokens {self.max_tokens}: no trace "
                             f"is scored before it is w tokens deep, so no round could prune or branch")
        self.search()  # the search settings' own checks (top_p, top_k, ...), before anything loads

    def wall_limit(self) -> float:
        """``max_wall_s`` with -1 resolved: 25 s on the shipped target, no limit on another model."""
        if self.max_wall_s != -1:
            return self.max_wall_s
        return SHIPPED_WALL_S if self.model in ("", str(TARGET)) else 0.0

    def search(self) -> SearchConfig:
        return SearchConfig(method=self.method, capacity=self.samples, swap=min(self.swap, self.samples),
                            interval=self.interval, warmup=self.warmup, temperature=self.temperature,
                            seed=self.seed, max_wall_s=self.wall_limit(), decoding=self.decoding,
                            max_tokens=self.max_tokens, top_p=self.top_p, top_k=self.top_k,
                            answer_rule=self.answer_rule or "boxed")


def tau_line(nodes: dict, trace_tau: dict, capped: int = 0, cap: int = 0) -> str:
    """Tokens per target forward of each trace that drafted (node #id: tau), from the engine's stats;
    ``capped``: the run's steps that decoded plainly for ``--spec-max-batch`` ``cap`` (none drafted: why)."""
    got = [(int(i), trace_tau[n["engine_id"]]) for i, n in nodes.items()
           if n.get("engine_id") is not None and n["engine_id"] in trace_tau]
    if not got:
        why = (f"{capped} steps had more traces than --spec-max-batch {cap}" if capped
               else "each ended before its first draft cycle")
        return f"tau per trace: no trace drafted ({why})"
    got.sort()
    mean = sum(t for _, t in got) / len(got)
    each = ", ".join(f"#{i} {t:.2f}" for i, t in got)
    return f"tau per trace ({len(got)} drafted, mean {mean:.2f}): {each}"


def check_question(cfg: RunConfig) -> None:
    """``question`` / ``gold`` / ``answer_rule``: a question replaces the problem set, a gold belongs to
    it and must read as an answer under the rule, and a benchmark brings its own rule."""
    if cfg.question and cfg.benchmark:
        raise ValueError("question: a problem of your own replaces --benchmark's; give one of them")
    if cfg.gold and not cfg.question:
        raise ValueError("gold grades a --question; give the question too (the task and the benchmarks "
                         "bring their own)")
    if cfg.answer_rule and cfg.benchmark:
        raise ValueError("answer_rule: a benchmark reads answers by its own rule")
    check_answer_rule(cfg.answer_rule)
    if cfg.question and not cfg.question.strip():
        raise ValueError("question is empty")
    if cfg.gold and question_gold(cfg) is None:
        raise ValueError(f"gold: {cfg.gold!r} is no answer under the {cfg.answer_rule or 'boxed'!r} rule")


def check_unused(cfg: RunConfig) -> None:
    """A value the chosen mode never reads is refused, not run without a word: ``--problems`` / the ops
    range with one ``--question``, the ops range with ``--benchmark``, the scorer and tournament knobs
    with a method that has none, ``--spec-max-batch`` with plain decoding. Only values that differ from
    the defaults count (a YAML or a flag that restates a default passes)."""
    why: dict[str, str] = {}
    if cfg.question:
        why |= dict.fromkeys(("problems", "min_ops", "max_ops"), "a --question is the one problem solved")
    elif cfg.benchmark:
        why |= dict.fromkeys(("min_ops", "max_ops"), f"the task's; --benchmark {cfg.benchmark} asks its "
                             "own questions")
    if cfg.method not in ("gambit", "step"):
        why["scorer"] = f"--method {cfg.method} scores no thoughts"
    if cfg.method != "gambit":
        why["swap"] = why["warmup"] = f"Gambit's tournament knob; --method {cfg.method} has no tournament"
    if cfg.decoding == "plain":
        why["spec_max_batch"] = "with --decoding plain no trace drafts"
    bad: dict[str, list[str]] = {}  # reason -> the flags it covers, as given
    for f in fields(cfg):
        if f.name in why and getattr(cfg, f.name) != f.default:
            bad.setdefault(why[f.name], []).append(f"--{f.name.replace('_', '-')} {getattr(cfg, f.name)}")
    if bad:
        n = sum(map(len, bad.values()))
        raise ValueError("; ".join(f"{', '.join(flags)}: {reason}" for reason, flags in bad.items())
                         + f" (drop {'them' if n > 1 else 'it'})")


def question_gold(cfg: RunConfig) -> str | None:
    """The gold as the rule keys a trace that boxes it (so "18" and "\\$18" grade alike)."""
    return answer_key(cfg.answer_rule or "boxed", "\\boxed{" + cfg.gold.strip() + "}")


def problems_of(cfg: RunConfig) -> list:
    """The task's held-out problems, the benchmark's questions in the model's prompt format, or the
    user's question in it."""
    if cfg.question:
        from gambit.model.loader import load_tokenizer
        from gambit.serving.prompt_format import check_special_text, problem_formatter

        # as the Target refuses it: the question's text must not forge the model's control tokens
        check_special_text(cfg.question, load_tokenizer(cfg.model), "--question", "remove it")
        gold = question_gold(cfg) if cfg.gold else None
        return [Question(cfg.question.strip(), problem_formatter(cfg.model)(cfg.question), gold)]
    if not cfg.benchmark:
        task = TaskConfig(cfg.min_ops, cfg.max_ops)
        try:
            return task_problems(cfg.model, "test", cfg.problems, cfg.seed, task)
        except TooFewProblems as e:  # said with this command's flags
            raise ValueError(e.said("--problems")) from None
    problems = graded_problems(cfg.benchmark, cfg.data, cfg.model, cfg.problems, cfg.seed)
    if len(problems) < cfg.problems:  # clipped without a word before
        print(f"{cfg.benchmark}: all {len(problems)} questions of the set (fewer than --problems "
              f"{cfg.problems})", file=sys.stderr)
    return problems


def check_kv_blocks(cfg: RunConfig, problems: list) -> None:
    """``kv_blocks`` below what the longest prompt and one generated token fill, refused before the model
    loads (only its tokenizer is read): the engine refused it after the load, as "(1 of 16 tokens: 16)"."""
    from gambit.model.loader import load_tokenizer

    tok = load_tokenizer(cfg.model)
    longest = max(len(tok.encode(p.prompt)) for p in problems)
    bs = EngineConfig.block_size
    need = -(-(longest + 1) // bs)
    if cfg.kv_blocks < need:
        full = -(-(longest + cfg.max_tokens) // bs)
        raise ValueError(f"--kv-blocks {cfg.kv_blocks}: too few; a trace keeps its prompt and each token it "
                         f"generates in blocks of {bs} tokens, and the longest prompt here is {longest} "
                         f"tokens: give at least {need} (one trace to --max-tokens {cfg.max_tokens} needs "
                         f"{full})")


def no_answer_why(res, max_tokens: int, rule: str, benchmark: str) -> str:
    """Why a run gave no answer, for the line after it: the wall limit, traces cut at ``max_tokens``,
    or traces that ended by themselves with nothing the rule reads (SmolLM2 answers in prose at 54-110
    tokens, and the line said to raise --max-tokens)."""
    if res.reason == "limit" and res.limit.startswith("max_wall_s"):
        return f"the run stopped at its limit, {res.limit}: raise --max-wall-s (0 = no limit)"
    ended = [t for t in res.traces if t["state"] == "finished"]
    cut = sum(t["end_reason"] == "length" for t in ended)
    if not ended or cut == len(ended):
        return f"a trace stops at --max-tokens {max_tokens}"
    if cut:
        return f"{cut} of {len(ended)} finished traces stopped at --max-tokens {max_tokens}"
    hint = "; try --answer-rule gsm8k, which also reads an unboxed last number" \
        if rule == "boxed" and not benchmark else ""
    return f"the traces ended by themselves with no answer the {rule!r} rule reads{hint}"


def _save_interrupted(cfg: RunConfig, driver: SearchDriver, last: str | None, cut: str) -> None:
    """Ctrl-C mid-search: the tree store with the problems finished so far and ``cut`` as it stood, and
    the last finished problem's picture. ``cut`` is cancelled first, as ``gambit client cancel`` does:
    its traces stop where they are and its record is written whole, as at a run's end (a running trace
    is rewritten only when its state changes, so one saved as it was showed "running; 32 tokens" at
    step 56, its tokens and scores of rounds before)."""
    run = driver.runs.get(cut)
    step = run.step if run is not None else None
    try:
        if run is not None:
            driver.cancel(cut)
        how = f" (stopped at step {step}; the traces as they stood)" if run is not None else ""
    except Exception as e:  # an interrupt inside the engine's step: save what was written
        how = f" (its traces as last written: flushing them failed: {e})"
    if cfg.save:
        shown = cut if step or not last else last  # one that never stepped has no tree to look at
        print(f"\ninterrupted in {cut}{how}: tree store saved to {driver.store.save(cfg.save)} — "
              f"`gambit inspect {shown} --store {cfg.save}`")
    if cfg.png and last:
        print(f"lineage picture: {lineage_png(last, driver.store.load(last), cfg.png)}")


def _short(text: str, n: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n - 1] + "…"


def run(cfg: RunConfig, problems: list | None = None) -> dict:
    """Solve ``problems`` (None: ``problems_of(cfg)``, checked by ``check_kv_blocks``: the CLI checks
    the ones it passes) and print each answer and its lineage."""
    scfg = cfg.search()  # validates before loading anything
    if scfg.idle_warmup:  # the default w against a short --max-tokens: runs, but says it
        print(f"note: {scfg.idle_warmup.replace('max_tokens', '--max-tokens')}", file=sys.stderr)
    if problems is None:
        problems = problems_of(cfg)  # a missing benchmark file is said before the model loads
        check_kv_blocks(cfg, problems)
    ecfg = EngineConfig(model=cfg.model, preemption="evict", num_blocks=cfg.kv_blocks,
                        cpu_weights=cfg.cpu_weights, kv_dtype=cfg.kv_dtype,
                        batch_invariant=cfg.batch_invariant,
                        spec=SpecConfig(max_batch=cfg.spec_max_batch, drafters=parse_drafters(cfg.drafters)))
    engine = Engine.from_pretrained(cfg.model, ecfg)
    check_readable(problems, engine.tokenizer, engine.max_model_len)  # before any search starts
    if cfg.decoding != "plain":  # a drafter that does not fit the model is said now, not at problem 1
        engine.speculator().prepare(cfg.decoding)
    scorer = load_scorer_spec(cfg.scorer, engine.model.config.hidden_size) \
        if cfg.method in ("gambit", "step") else None
    store = MemoryStore()
    driver = SearchDriver(engine, scorer, store)
    kv = str(engine.runner.cache.k.dtype).removeprefix("torch.")
    print(f"engine: {cfg.kv_blocks} KV blocks of {engine.config.block_size} tokens in {kv}, "
          f"CPU linear weights {cfg.cpu_weights}"
          + (", batch-invariant arithmetic" if engine.batch_invariant else ""))
    view = LiveView()
    right, tokens, last = 0, 0, None
    for i, p in enumerate(problems):
        if isinstance(p, GradedProblem):
            print(f"\n=== problem {i + 1}/{len(problems)} ({p.item.id}): {_short(p.item.prompt)!r}")
            scfg = replace(scfg, answer_rule=answer_kind(p.item))
        elif isinstance(p, Question):
            print(f"\n=== your question: {_short(p.text)!r}")
        else:
            print(f"\n=== problem {i + 1}/{len(problems)} (test split, {p.n_ops} operations): "
                  f"{p.prompt.strip()!r}")
        run_id = f"p{i + 1}"
        view.capacity[run_id] = cfg.samples
        capped = engine.stats.spec_capped_steps
        driver.submit(p, scfg, run_id=run_id)
        try:
            res = driver.run_until_done([run_id], on_event=view.update)[run_id]
        except KeyboardInterrupt:
            _save_interrupted(cfg, driver, last, run_id)
            raise
        right += bool(res.correct)
        tokens += res.tokens
        graded = (f"correct {p.answer}: {'CORRECT' if res.correct else 'WRONG'}" if p.answer is not None
                  else "not graded (--gold)")
        print(f">>> answer {res.answer} ({res.vote_rule}; majority {res.majority}, weighted {res.weighted}); "
              f"{graded}  "
              f"[{res.tokens} tokens, {res.wall_s:.1f} s, {res.branched} branched, {res.pruned} pruned, "
              f"{res.evicted} evicted]")
        if res.answer is None:  # say what stopped it: the wall limit cut a SmolLM2 run at 17 tokens a trace
            why = no_answer_why(res, cfg.max_tokens, scfg.answer_rule, cfg.benchmark)
            print(f"no trace gave an answer under the {scfg.answer_rule!r} rule ({why})")
        if res.solution:
            print(f"solution (trace #{res.solution_trace}): " + " | ".join(
                line.strip() for line in res.solution.strip().splitlines() if line.strip()))
        record = store.load(run_id)
        print(lineage_text(run_id, record, max_nodes=cfg.lineage_nodes))
        if cfg.decoding != "plain":
            print(tau_line(record["nodes"], engine.stats.trace_tau, engine.stats.spec_capped_steps - capped,
                           cfg.spec_max_batch))
        last = run_id
    if getattr(engine.stats, "spec_drafts", 0):
        print(f"speculative ({cfg.decoding}): tau {engine.stats.tau:.2f} tokens per target forward over "
              f"{engine.stats.spec_drafts} verifications")
    if all(p.answer is None for p in problems):
        print(f"\n{cfg.method}: {tokens} tokens generated")
    else:
        print(f"\n{cfg.method} solved {right}/{len(problems)} problems ({tokens} tokens generated)")
    if cfg.save:
        print(f"tree store saved to {store.save(cfg.save)} — `gambit inspect {last} --store {cfg.save}`")
    if cfg.png and last:
        print(f"lineage picture: {lineage_png(last, store.load(last), cfg.png)}")
    return {"solved": right, "problems": len(problems), "tokens": tokens}
