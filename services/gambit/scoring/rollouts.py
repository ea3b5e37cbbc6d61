"""Rollouts of the shipped target for scorer training: every boundary state with its trace's label.

Problems are generated in chunks of ``chunk_problems``; each chunk runs on a fresh engine with
explicit per-trace seeds and fixed threads, so a chunk's rollouts are the same whether it is
generated alone or as part of a bigger run (the reproducibility test relies on this). Results are
cached under ``cache_dir`` (never committed), keyed by the config and the target's weights.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from gambit.checks import at_least
from gambit.engine import Engine, EngineConfig, SamplingParams
from gambit.engine.engine import derive_seed
from gambit.engine.events import BoundaryEvent, FinishedEvent, TokenEvent
from gambit.model.loader import load_model
from gambit.paths import TARGET
from gambit.paths import cache_dir as cache_root
from gambit.scoring.confidence import FEATURES, ConfidenceTracker
from gambit.scoring.repro import fixed_threads
from gambit.tasks.arithmetic import (
    SPLITS,
    THOUGHT_SEP,
    Problem,
    TaskConfig,
    check_answer,
    check_thought,
    format_step,
    generate,
)
from gambit.train.repro import check_isa, isa_pinned


@dataclass
class RolloutConfig:
    """Which traces to sample: ``n_problems`` of ``split`` x ``samples`` each at ``temperature``."""

    model: str = str(TARGET)  # target whose boundary states are read: a folder or a name (smollm2)
    split: str = "train"  # task split the problems come from
    n_problems: int = 384  # problems (distinct, reproducible from seed)
    samples: int = 12  # traces per problem
    temperature: float = 0.8  # sampling temperature
    max_tokens: int = 400  # generated tokens per trace at most
    seed: int = 0  # problem and sampling seed
    min_ops: int = 2  # fewest operations per problem
    max_ops: int = 8  # most operations per problem
    chunk_problems: int = 8  # problems per engine run (each chunk is reproducible on its own)
    threads: int = 2  # torch CPU threads while generating (fixed: results depend on it)
    isa: str = "machine"  # kernels the rollouts run under (gambit.train.repro.ISA_ENV): floats differ

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {self.split!r}")
        at_least(1, **{n: getattr(self, n) for n in ("n_problems", "samples", "max_tokens", "chunk_problems",
                                                      "threads")})
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        TaskConfig(self.min_ops, self.max_ops)
        check_isa(self.isa)

    def key(self) -> dict:
        """The fields a cache key holds (``isa`` only when pinned: keys as they were before it)."""
        d = asdict(self)
        if d["isa"] == "machine":
            d.pop("isa")
        return d


def _weights_digest(model: str) -> str:
    h = hashlib.sha256()
    for f in sorted(Path(model).glob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def cache_path(cfg: RolloutConfig, cache_dir: str | None = None) -> Path:
    key = json.dumps({**cfg.key(), "model": _weights_digest(cfg.model), "v": 3}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    name = f"rollouts-{cfg.split}-{cfg.n_problems}x{cfg.samples}-{digest}.pt"
    return Path(cache_dir or cache_root()) / name


def chunk_dir(cfg: RolloutConfig, cache_dir: str | None = None) -> Path:
    """Where each finished chunk is kept: problems are a prefix-stable sequence, so chunk c does not
    depend on ``n_problems`` and a longer run reuses a shorter one's chunks."""
    key = json.dumps({**cfg.key(), "model": _weights_digest(cfg.model), "n_problems": None, "v": 3},
                     sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return Path(cache_dir or cache_root()) / f"rollout-chunks-{cfg.split}-{digest}"


def collect_rollouts(cfg: RolloutConfig, cache_dir: str | None = None, quiet: bool = False) -> dict:
    """The rollouts of ``cfg``, from the cache when there (``cache_dir=""`` disables caching).

    Returns a dict: per boundary ``states [M, d]``, ``trace [M]`` (trace index), ``thought [M]``
    (1-based thought index); per trace ``problem [T]`` (index into ``exprs``), ``correct [T]``,
    ``n_ops [T]``, ``tokens [T]``; ``exprs`` (problem texts) and ``config``.
    """
    path = cache_path(cfg, cache_dir) if cache_dir != "" else None
    if path is not None and path.is_file():
        return torch.load(path, weights_only=True)
    if not isa_pinned(cfg.isa):  # written in a process pinned to it (train_scorer under the same isa)
        raise RuntimeError(f"rollouts under isa={cfg.isa} are written in a process pinned to it")
    problems = generate(cfg.split, cfg.n_problems, cfg.seed, TaskConfig(cfg.min_ops, cfg.max_ops))
    parts = []
    bar = None  # made once the first chunk's Engine is built: a kernel compile is no trace's time
    with fixed_threads(cfg.threads):
        model, tok = load_model(cfg.model)
        chunks = chunk_dir(cfg, cache_dir) if cache_dir != "" else None
        for c0 in range(0, len(problems), cfg.chunk_problems):
            f = chunks / f"chunk-{c0 // cfg.chunk_problems:05d}.pt" if chunks else None
            if f is not None and f.is_file() and min(len(problems) - c0, cfg.chunk_problems) == \
                    cfg.chunk_problems:
                parts.append(torch.load(f, weights_only=True))
                continue
            engine, owner = _start_chunk(cfg, model, tok, problems, c0)
            if bar is None:  # the cached chunks before it count as done, not as this bar's rate
                bar = tqdm(total=len(problems) * cfg.samples, initial=len(parts) * cfg.chunk_problems *
                           cfg.samples, desc=f"rollouts {cfg.split}", disable=quiet, mininterval=2,
                           unit="trace")
            parts.append(_run_chunk(cfg, model, tok, problems, engine, owner, bar))
            if f is not None and len(problems) - c0 >= cfg.chunk_problems:
                f.parent.mkdir(parents=True, exist_ok=True)
                torch.save(parts[-1], f.with_suffix(".tmp"))
                f.with_suffix(".tmp").replace(f)
        if bar is not None:
            bar.close()
    out = _concat(parts, cfg, problems, model.config.hidden_size)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(out, tmp)
        tmp.replace(path)
    return out


def _start_chunk(cfg, model, tok, problems, c0: int) -> tuple[Engine, dict[int, tuple[int, int]]]:
    """A fresh engine (the first one builds or waits for the CPU kernels) with the chunk's traces added;
    their owners: trace id -> (problem index, sample)."""
    chunk = problems[c0:c0 + cfg.chunk_problems]
    engine = Engine(model, tok, EngineConfig(max_num_seqs=len(chunk) * cfg.samples, seed=cfg.seed,
                                             device="cpu", dtype="float32"))
    owner: dict[int, tuple[int, int]] = {}
    for i, p in enumerate(chunk):
        for s in range(cfg.samples):
            sp = SamplingParams(temperature=cfg.temperature, max_tokens=cfg.max_tokens,
                                seed=derive_seed(cfg.seed, c0 + i, s), logprobs=1)
            owner[engine.add(p.prompt, sp)] = (c0 + i, s)
    return engine, owner


def _run_chunk(cfg, model, tok, problems, engine, owner: dict[int, tuple[int, int]], bar) -> list[dict]:
    states: dict[int, list[torch.Tensor]] = {tid: [] for tid in owner}
    conf = {tid: ConfidenceTracker() for tid in owner}
    feats: dict[int, list[list[float]]] = {tid: [] for tid in owner}
    done: dict[int, tuple[int, ...]] = {}
    while len(done) < len(owner):
        for ev in engine.step():
            if isinstance(ev, TokenEvent):
                conf[ev.trace_id].token(ev.position, ev.logprob)
            elif isinstance(ev, BoundaryEvent):
                states[ev.trace_id].append(ev.hidden)
                feats[ev.trace_id].append(conf[ev.trace_id].boundary(ev.position))
            elif isinstance(ev, FinishedEvent):
                done[ev.trace_id] = ev.output_ids
                bar.update(1)
    rows = []
    for tid in sorted(owner, key=owner.get):
        pi, _ = owner[tid]
        text = tok.decode(list(done[tid]))
        ok, ref = step_labels(text, problems[pi], len(states[tid]))
        rows.append({"problem": pi, "correct": check_answer(text, problems[pi].answer),
                     "step_ok": ok, "step_ref": ref,
                     "conf": torch.tensor(feats[tid], dtype=torch.float32).reshape(-1, FEATURES),
                     "n_ops": problems[pi].n_ops, "tokens": len(done[tid]),
                     "states": torch.stack(states[tid]) if states[tid] else
                     torch.zeros(0, model.config.hidden_size)})
    return rows


def step_labels(text: str, problem: Problem, n_boundaries: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per boundary j: is thought j (the one the boundary closes) arithmetically right, and is it the
    reference step j. A boundary with no thought text behind it (the detector also closes on "\n" +
    "\n" split across tokens) counts as neither."""
    thoughts = text.split(THOUGHT_SEP)
    ref = [format_step(*s, spell=problem.spell_products) for s in problem.steps]
    ok = [j < len(thoughts) and check_thought(thoughts[j].strip()) is True for j in range(n_boundaries)]
    same = [j < len(thoughts) and j < len(ref) and thoughts[j].strip() == ref[j] for j in range(n_boundaries)]
    return torch.tensor(ok, dtype=torch.bool), torch.tensor(same, dtype=torch.bool)


def _concat(parts: list[list[dict]], cfg: RolloutConfig, problems, d: int) -> dict:
    rows = [r for part in parts for r in part]
    lengths = torch.tensor([len(r["states"]) for r in rows], dtype=torch.long)
    return {
        "states": torch.cat([r["states"] for r in rows]) if rows else torch.zeros(0, d),
        "trace": torch.repeat_interleave(torch.arange(len(rows)), lengths),
        "thought": torch.cat([torch.arange(1, n + 1) for n in lengths.tolist()]) if rows else
        torch.zeros(0, dtype=torch.long),
        "conf": torch.cat([r["conf"] for r in rows]) if rows else torch.zeros(0, FEATURES),
        "step_ok": torch.cat([r["step_ok"] for r in rows]) if rows else torch.zeros(0, dtype=torch.bool),
        "step_ref": torch.cat([r["step_ref"] for r in rows]) if rows else torch.zeros(0, dtype=torch.bool),
        "problem": torch.tensor([r["problem"] for r in rows], dtype=torch.long),
        "correct": torch.tensor([r["correct"] for r in rows], dtype=torch.bool),
        "n_ops": torch.tensor([r["n_ops"] for r in rows], dtype=torch.long),
        "tokens": torch.tensor([r["tokens"] for r in rows], dtype=torch.long),
        "exprs": [p.expr for p in problems],
        "config": asdict(cfg),
    }
