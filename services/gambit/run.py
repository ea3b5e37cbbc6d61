"""The main job on the embedded default: the shipped target solves held-out problems, shows its
traces and the vote (``make run`` / ``gambit run``)."""

from __future__ import annotations

from dataclasses import dataclass

from gambit.bench.eval import normalise
from gambit.engine import Engine, EngineConfig, SamplingParams
from gambit.engine.engine import derive_seed
from gambit.paths import TARGET
from gambit.search.vote import majority_vote
from gambit.tasks.arithmetic import TaskConfig, generate


@dataclass
class RunConfig:
    model: str = str(TARGET)
    problems: int = 3
    samples: int = 8
    temperature: float = 0.8
    seed: int = 0
    min_ops: int = 3
    max_ops: int = 6
    decoding: str = "plain"  # plain | eagle3.1 | pr | a drafter folder: speculative decoding, tau per trace

    def __post_init__(self) -> None:
        if self.problems < 1 or self.samples < 1:
            raise ValueError("problems and samples must be >= 1")


def run(cfg: RunConfig) -> dict:
    engine = Engine.from_pretrained(cfg.model, EngineConfig(model=cfg.model))
    problems = generate("test", cfg.problems, cfg.seed, TaskConfig(cfg.min_ops, cfg.max_ops))
    right = 0
    for i, p in enumerate(problems):
        print(f"\n=== problem {i + 1}/{len(problems)} (test split, {p.n_ops} operations) ===")
        print(p.prompt.rstrip())
        params = [SamplingParams(temperature=cfg.temperature, max_tokens=400, decoding=cfg.decoding,
                                 seed=derive_seed(cfg.seed, i, s)) for s in range(cfg.samples)]
        first = engine._next_id
        outs = engine.generate([p.prompt] * cfg.samples, params)
        answers = []
        for s, out in enumerate(outs):
            text = engine.tokenizer.decode(out)
            answers.append(normalise(text))
            mark = "ok " if answers[-1] == str(p.answer) else "bad"
            tau = engine.stats.trace_tau.get(first + s)
            spec = f" tau={tau:.2f}" if tau else ""
            print(f"--- trace {s + 1} [{mark}] answer={answers[-1]}{spec}")
            print("    " + text.strip().replace("\n\n", " | "))
        vote = majority_vote(answers)
        right += vote == str(p.answer)
        n_ok = sum(a == str(p.answer) for a in answers)
        print(f">>> vote: {vote}  (correct: {p.answer}; {n_ok}/{cfg.samples} traces right) "
              f"{'CORRECT' if vote == str(p.answer) else 'WRONG'}")
    print(f"\nmajority vote solved {right}/{len(problems)} problems "
          f"({engine.stats.generated_tokens} tokens generated)")
    if engine.stats.spec_drafts:
        print(f"speculative ({cfg.decoding}): tau {engine.stats.tau:.2f} tokens per target forward over "
              f"{engine.stats.spec_drafts} verifications")
    return {"solved": right, "problems": len(problems)}
