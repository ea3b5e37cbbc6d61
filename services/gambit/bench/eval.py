"""Accuracy of a model on the arithmetic task (``gambit eval --split test --samples 16``) or on a graded
public benchmark (``gambit eval --model smollm2 --benchmark gsm8k``).

Every problem gets ``samples`` independent traces (distinct seeds) through the native engine;
pass@1 is the mean single-sample accuracy, maj the majority-vote accuracy, pass@k any-correct.
A benchmark question goes to the model in its own prompt format (``gambit.serving.prompt_format``: a
chat model's template with the boxed-answer instruction), each completion is graded by the benchmark's
checker (``gambit.tasks.benchmarks.check_answer``) and votes are counted on answer keys
(``gambit.tasks.graded``).
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, fields
from typing import ClassVar

from tqdm import tqdm

from gambit.bench.record import write_json as write_json  # the benches' one writer, re-exported (cli)
from gambit.checks import at_least
from gambit.engine import Engine, EngineConfig, SamplingParams
from gambit.engine.engine import derive_seed
from gambit.search.vote import majority_vote
from gambit.tasks.answers import extract_boxed, parse_int
from gambit.tasks.arithmetic import SPLITS, TaskConfig, TooFewProblems
from gambit.tasks.benchmarks import check_answer
from gambit.tasks.graded import (
    answer_key,
    answer_kind,
    check_answer_rule,
    check_benchmark,
    check_readable,
    gold_key,
    graded_name,
    graded_problems,
    task_problems,
)

DEFAULT_PROBLEMS = 240
TASK_ONLY = ("split", "min_ops", "max_ops", "answer_rule")  # the arithmetic task's settings


@dataclass
class EvalConfig:
    FLAG_ERRORS: ClassVar[bool] = True  # gambit.config_cli: its errors name the flags, exit 2
    model: str = ""  # model folder (Hugging Face layout) or a registry name ("" = the shipped target)
    split: str = "test"  # task split the problems come from: train | dev | test
    samples: int = 16  # sampled solutions per problem (pass@1 is their mean; the vote is over them)
    n_problems: int = DEFAULT_PROBLEMS  # problems evaluated
    temperature: float = 0.8  # sampling temperature, >= 0 (0 = greedy)
    top_p: float = 1.0  # nucleus mass, (0, 1] (1 = no nucleus)
    max_tokens: int = 400  # tokens per solution at most
    seed: int = 0  # problem selection and sampling seeds
    min_ops: int = 2  # fewest operations in a problem
    max_ops: int = 8  # most operations in a problem
    max_num_seqs: int = 256  # the engine's batch: sequences decoded at once
    benchmark: str = ""  # a graded public benchmark: gsm8k | aime25 | hmmt24 | hmmt25 | gpqa ("" = the task)
    data: str = ""  # the benchmark's JSONL file ("" = ../shared/datasets/, or $GAMBIT_DATASETS)
    # the task's answers: the boxed integer by default; gsm8k also reads a model that does not box
    answer_rule: str = ""  # how the task's answers are read: "" = boxed | integer | gsm8k | choice | latex

    def __post_init__(self) -> None:
        if not self.model:  # a default here, not a fixed value from the CLI: that one beat a YAML's model
            from gambit.paths import TARGET

            self.model = str(TARGET)
        at_least(1, samples=self.samples, n_problems=self.n_problems, max_tokens=self.max_tokens,
                 max_num_seqs=self.max_num_seqs)
        at_least(0, seed=self.seed)
        if not 0 <= self.temperature < float("inf"):  # NaN fails too
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1 = no nucleus), got {self.top_p}")
        TaskConfig(self.min_ops, self.max_ops)  # its range check, before the model loads
        if self.split not in SPLITS:  # before the model loads
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {self.split!r}")
        check_benchmark(self.benchmark, self.data)
        self.benchmark = graded_name(self.benchmark)
        if self.answer_rule and self.benchmark:
            raise ValueError("answer_rule reads the task's answers; a benchmark brings its own rule")
        check_answer_rule(self.answer_rule)
        set_ = [f"--{f.name.replace('_', '-')} {getattr(self, f.name)}" for f in fields(self)
                if f.name in TASK_ONLY and getattr(self, f.name) != f.default]
        if self.benchmark and set_:  # validated, then unused; and the JSON recorded them as applied
            raise ValueError(f"{', '.join(set_)}: the arithmetic task's; --benchmark {self.benchmark} asks "
                             "its own questions (drop them)")
        if self.temperature == 0 and self.samples > 1:
            raise ValueError(f"samples: {self.samples} at temperature 0 (greedy) are {self.samples} copies "
                             "of one completion; give --samples 1 or a temperature > 0")


def normalise(text: str) -> str | None:
    value = parse_int(extract_boxed(text))
    return None if value is None else str(value)


def problems_of(cfg: EvalConfig) -> list:
    """The benchmark's questions or the task's problems, in the model's prompt format. Built before the
    model loads: a missing, empty or malformed file cost a full model load (a kernel build at times)."""
    if not cfg.benchmark:
        try:
            return task_problems(cfg.model, cfg.split, cfg.n_problems, cfg.seed,
                                 TaskConfig(cfg.min_ops, cfg.max_ops))
        except TooFewProblems as e:  # said with this command's flags ("lower the count" named none)
            raise ValueError(e.said("--n-problems")) from None
    problems = graded_problems(cfg.benchmark, cfg.data, cfg.model, cfg.n_problems, cfg.seed)
    if len(problems) < cfg.n_problems:
        print(f"{cfg.benchmark}: all {len(problems)} questions of the set (fewer than --n-problems "
              f"{cfg.n_problems})", file=sys.stderr)
    return problems


def run_eval(cfg: EvalConfig, engine: Engine | None = None, quiet: bool = False) -> dict:
    problems = problems_of(cfg)
    engine = engine or Engine.from_pretrained(cfg.model, EngineConfig(model=cfg.model,
                                                                      max_num_seqs=cfg.max_num_seqs))
    check_readable(problems, engine.tokenizer, engine.max_model_len)  # a bad question named, before sampling
    if cfg.benchmark:
        return _run_benchmark(cfg, engine, problems, quiet)
    outputs, seconds = _sample(cfg, engine, [p.prompt for p in problems], cfg.split, quiet)
    rows = []
    for i, p in enumerate(problems):
        outs = outputs[i * cfg.samples:(i + 1) * cfg.samples]
        texts = [engine.tokenizer.decode(o) for o in outs]
        answers = [answer_key(cfg.answer_rule, t) if cfg.answer_rule else normalise(t) for t in texts]
        correct = [a == str(p.answer) for a in answers]
        vote = majority_vote(answers)
        rows.append({"n_ops": p.n_ops, "answer": p.answer, "answers": answers,
                     "pass1": sum(correct) / len(correct), "maj": vote == str(p.answer),
                     "passk": any(correct), "tokens": sum(len(o) for o in outs),
                     "cut": _cut(cfg, engine, outs)})
    return summarise(cfg, rows, seconds)


def _cut(cfg: EvalConfig, engine: Engine, outs: list[list[int]]) -> int:
    """Samples stopped at ``max_tokens``, not by the model: their "answers" are mid-reasoning numbers."""
    return sum(len(o) >= cfg.max_tokens and o[-1] not in engine.eos_ids for o in outs)


def _sample(cfg: EvalConfig, engine: Engine, prompts: list[str], desc: str,
            quiet: bool) -> tuple[list[list[int]], float]:
    """``samples`` completions of each prompt, seeded by (seed, problem, sample); and the seconds taken."""
    all_prompts, params = [], []
    for i, prompt in enumerate(prompts):
        for s in range(cfg.samples):
            all_prompts.append(prompt)
            params.append(SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p,
                                         max_tokens=cfg.max_tokens, seed=derive_seed(cfg.seed, i, s)))
    start = time.time()
    with tqdm(total=len(all_prompts), desc=f"eval {desc}", disable=quiet, mininterval=2) as bar:
        outputs = engine.generate(all_prompts, params, progress=bar)
    return outputs, time.time() - start


def _run_benchmark(cfg: EvalConfig, engine: Engine, problems: list, quiet: bool) -> dict:
    outputs, seconds = _sample(cfg, engine, [p.prompt for p in problems], cfg.benchmark, quiet)
    rows = []
    for i, it in enumerate(p.item for p in problems):
        outs = outputs[i * cfg.samples:(i + 1) * cfg.samples]
        texts = [engine.tokenizer.decode(o) for o in outs]
        kind = answer_kind(it)
        answers = [answer_key(kind, t) for t in texts]
        correct = [check_answer(it, t) for t in texts]
        vote = majority_vote(answers)
        # the vote is right when a completion giving the voted answer is (the checker judges, not the key)
        maj = vote is not None and any(c for a, c in zip(answers, correct, strict=True) if a == vote)
        rows.append({"id": it.id, "answer": gold_key(it), "answers": answers,
                     "pass1": sum(correct) / len(correct), "maj": maj, "passk": any(correct),
                     "tokens": sum(len(o) for o in outs), "cut": _cut(cfg, engine, outs),
                     "completions": texts})
    return summarise(cfg, rows, seconds)


def summarise(cfg: EvalConfig, rows: list[dict], seconds: float) -> dict:
    def agg(rs: list[dict]) -> dict:
        n = max(len(rs), 1)  # no rows: zeros, not a ZeroDivisionError
        return {"n_problems": len(rs), "pass1": sum(r["pass1"] for r in rs) / n,
                "maj": sum(r["maj"] for r in rs) / n, "passk": sum(r["passk"] for r in rs) / n}

    by_ops = {}
    for k in sorted({r["n_ops"] for r in rows if "n_ops" in r}):
        by_ops[k] = agg([r for r in rows if r["n_ops"] == k])
    tokens = sum(r["tokens"] for r in rows)
    config = asdict(cfg)
    if cfg.benchmark:  # not recorded as if they applied
        config = {k: v for k, v in config.items() if k not in TASK_ONLY}
    out = {**agg(rows), "samples": cfg.samples, "by_ops": by_ops, "config": config,
           "generated_tokens": tokens, "seconds": round(seconds, 1),
           "tokens_per_s": round(tokens / max(seconds, 1e-9), 1),
           "cut_samples": sum(r.get("cut", 0) for r in rows)}
    if cfg.benchmark:  # each question's gold, answer keys and completions, to see what the model said
        keys = ("id", "answer", "answers", "pass1", "maj", "passk", "cut", "completions")
        out["items"] = [{k: r[k] for k in keys if k in r} for r in rows]
    return out


def format_table(result: dict) -> str:
    k = result["samples"]
    name = result["config"].get("benchmark") or "all"  # the last row: the task's total, or the benchmark
    w = max(5, len(name))
    lines = [f"{'set' if result['config'].get('benchmark') else 'ops':>{w}} {'problems':>9} {'pass@1':>8} "
             f"{f'maj@{k}':>8} {f'pass@{k}':>8}"]
    for ops, r in result["by_ops"].items():
        lines.append(f"{ops:>{w}} {r['n_problems']:>9} {r['pass1']:>8.1%} {r['maj']:>8.1%} "
                     f"{r['passk']:>8.1%}")
    lines.append(f"{name:>{w}} {result['n_problems']:>9} {result['pass1']:>8.1%} {result['maj']:>8.1%} "
                 f"{result['passk']:>8.1%}")
    lines.append(f"{result['generated_tokens']} tokens in {result['seconds']} s "
                 f"({result['tokens_per_s']} tok/s)")
    if result.get("cut_samples"):
        lines.append(f"{result['cut_samples']} of {result['n_problems'] * k} samples stopped at --max-tokens "
                     f"{result['config']['max_tokens']} (their answers are read from unfinished text)")
    return "\n".join(lines)

