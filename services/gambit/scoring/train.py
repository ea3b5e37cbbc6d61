"""``gambit train scorer --kind mlp|sequence``: fit a scorer on rollouts of the shipped target.

Recipe after STEP: each boundary is labelled with its trace's final correctness (``--label final``,
STEP's choice) or with whether every thought so far is right (``--label process`` / ``path``, see
``labels.py``: a per-thought label, so that traces of one problem differ); class-weighted BCE
(``pos_weight = neg / pos`` over the fit boundaries); Adam (lr 1e-4, wd 1e-5), batches of 128
boundaries, at most 20 epochs, early stop on validation loss with patience 5 (best epoch kept).
Unlike STEP (split by step, which leaks) the data is split by problem: train-split problems are
divided by a hash of the problem text into fit and validation (early stopping); the reported AUC is
on held-out problems of the dev split, never seen in training or model selection.
Seeded and single-process with fixed threads: the same command gives the same loss history.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import time
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F
from tqdm import tqdm

from gambit.checks import above, at_least
from gambit.engine import cpu_attention
from gambit.model.loader import readable
from gambit.paths import SCORER_MLP, SCORER_PROCESS, SCORER_SEQUENCE, TARGET, check_output_dir
from gambit.scoring.auc import auc
from gambit.scoring.confidence import with_confidence
from gambit.scoring.config import ScorerConfig
from gambit.scoring.evaluate import evaluate, pad_traces, predict
from gambit.scoring.labels import LABELS, boundary_labels
from gambit.scoring.nets import build_net
from gambit.scoring.repro import environment, fixed_threads
from gambit.scoring.rollouts import RolloutConfig, cache_path, collect_rollouts
from gambit.scoring.scorer import save_scorer
from gambit.tasks.arithmetic import TaskConfig, generate
from gambit.train.out_folder import check_out_kind
from gambit.train.repro import check_isa, isa_pinned, run_pinned

# (kind, label, confidence) -> the shipped folder a default --out writes to
SHIPPED = {("mlp", "final", False): SCORER_MLP, ("sequence", "final", False): SCORER_SEQUENCE,
           ("mlp", "process", True): SCORER_PROCESS}
# fields that only pin rounding or name where files go: any value still runs the shipped recipe
NOT_RECIPE = ("kind", "label", "confidence", "out", "cache_dir", "isa", "threads", "train_threads")


@dataclass
class TrainScorerConfig:
    """Scorer training (fields become ``gambit train scorer`` flags)."""
    FLAG_ERRORS: ClassVar[bool] = True  # gambit.config_cli: its errors name the flags, exit 2

    kind: str = "mlp"  # scorer network: "mlp" (STEP probe) or "sequence" (history-aware)
    label: str = "final"  # final: the trace's final correctness (STEP) | process: all thoughts right | path
    confidence: bool = False  # also read the target's sampled-token confidence (see scoring/confidence.py)
    out: str = ""  # output folder (default, for the shipped recipe only: the shipped scorer folder)
    arch: str = "gru"  # the sequence scorer's network: "gru" or "attn"
    model_dim: int = 128  # sequence: width of the recurrent / attention model
    model: str = str(TARGET)  # target whose boundary states are read
    n_problems: int = 176  # train-split problems rolled out (split into fit / validation)
    heldout_problems: int = 128  # dev-split problems rolled out for the reported AUC
    samples: int = 12  # rollout traces sampled per problem
    temperature: float = 0.8  # rollout sampling temperature
    val_percent: int = 15  # percent of train-split problems held for early stopping
    lr: float = 1e-4  # Adam learning rate
    weight_decay: float = 1e-5  # Adam weight decay (L2)
    batch_size: int = 128  # boundaries per step (sequence: whole traces packed to >= this)
    max_epochs: int = 20  # passes over the fit data at most
    patience: int = 5  # epochs without a lower validation loss before stopping
    seed: int = 0  # initialisation and shuffling seed
    rollout_seed: int = 0  # problem and sampling seed of the rollouts
    threads: int = 2  # torch CPU threads while rolling out (the engine's numerics depend on it)
    train_threads: int = 1  # torch CPU threads while training (loss history is exact at the same count)
    cache_dir: str = ""  # rollout cache (default $GAMBIT_CACHE or ~/.cache/gambit)
    repro_problems: int = 8  # problems (the first of --n-problems) the card's reproducibility probe trains on
    repro_epochs: int = 3  # epochs the card's reproducibility probe trains for (0: no probe)
    # compatible: rollouts and training under the switches that gave the target one loss history on
    # both x86 CPU kinds tried (gambit.train.repro.ISA_ENV), in a child process; slower
    isa: str = "machine"  # kernels' instruction set: machine (floats differ by CPU kind) | compatible

    def __post_init__(self) -> None:
        heads = ScorerConfig.num_heads  # fixed: no flag sets it, so the message names --model-dim
        if isinstance(self.model_dim, int) and self.model_dim > 0 and self.model_dim % heads:
            raise ValueError(f"--model-dim must be a multiple of {heads} (the scorer's fixed number of "
                             f"attention heads), got {self.model_dim}")
        ScorerConfig(kind=self.kind, arch=self.arch, model_dim=self.model_dim)
        if self.label not in LABELS:
            raise ValueError(f"label must be one of {LABELS}, got {self.label!r}")
        if not 0 < self.val_percent < 100:
            raise ValueError(f"val_percent must be in (0, 100), got {self.val_percent}")
        at_least(1, **{n: getattr(self, n) for n in ("n_problems", "samples", "batch_size", "max_epochs",
                                                      "patience", "threads", "train_threads")})
        above(0, lr=self.lr)
        at_least(0, weight_decay=self.weight_decay)
        # refused here, not after the train-split rollouts (heldout) or after training (the probe)
        at_least(1, heldout_problems=self.heldout_problems)
        at_least(0, repro_epochs=self.repro_epochs)
        if self.repro_epochs:
            at_least(1, repro_problems=self.repro_problems)
            if self.repro_problems > self.n_problems:  # the probe trained on all n_problems instead
                raise ValueError(f"repro_problems must be <= n_problems ({self.n_problems}), "
                                 f"got {self.repro_problems}")
        check_isa(self.isa)
        for split in ("train", "dev"):  # the rollouts' own checks (temperature, ...), up front too
            self.rollouts(split)
        self._check_split()
        if not self.out:
            shipped = SHIPPED.get((self.kind, self.label, self.confidence))
            if shipped is None:  # the kind's folder was overwritten by a scorer of other labels
                raise ValueError(f"give --out: no shipped scorer is --kind {self.kind} --label {self.label}"
                                 f"{' --confidence' if self.confidence else ''}")
            if off := self.off_recipe():  # a quick or other-model run replaced the shipped scorer
                raise ValueError(f"give --out DIR: {', '.join(off)} is not the shipped {shipped.name}'s "
                                 "recipe, and only that recipe writes over its folder by default")
            self.out = str(shipped)

    def off_recipe(self) -> list[str]:
        """The flags (with their values) whose settings differ from the shipped scorers' recipe: the
        defaults, on the shipped target."""
        off = []
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in NOT_RECIPE or f.default is MISSING:
                continue
            same = Path(v).resolve() == TARGET.resolve() if f.name == "model" else v == f.default
            if not same:
                off.append(f"--{f.name.replace('_', '-')} {v}")
        return off

    def _check_split(self) -> None:
        """Both sides of the fit / validation split hold problems, refused before the rollouts: with no
        validation problem there is no early stopping or model selection (the last epoch was saved,
        the card said "best epoch 1")."""
        rc = self.rollouts("train")
        problems = generate("train", self.n_problems, rc.seed, TaskConfig(rc.min_ops, rc.max_ops))
        n_val = sum(is_validation(p.expr, self.val_percent) for p in problems)
        if not 0 < n_val < self.n_problems:
            side = "validation" if not n_val else "fit"
            raise ValueError(f"val_percent {self.val_percent} leaves no {side} problems of n_problems "
                             f"{self.n_problems}; raise n_problems or change val_percent")

    def rollouts(self, split: str) -> RolloutConfig:
        n = self.n_problems if split == "train" else self.heldout_problems
        return RolloutConfig(model=self.model, split=split, n_problems=n, samples=self.samples,
                             temperature=self.temperature, seed=self.rollout_seed, threads=self.threads,
                             isa=self.isa)

    def scorer_config(self, hidden_size: int) -> ScorerConfig:
        return ScorerConfig(kind=self.kind, hidden_size=hidden_size, arch=self.arch,
                            model_dim=self.model_dim, target=Path(self.model).name, label=self.label,
                            confidence=self.confidence)


def is_validation(expr: str, val_percent: int) -> bool:
    """Fixed problem-level split of the train-split problems (independent of seeds)."""
    h = hashlib.sha256(f"scorer-val:{expr}".encode()).digest()
    return int.from_bytes(h[:4], "big") % 100 < val_percent


def select_traces(data: dict, traces: torch.Tensor) -> dict:
    """The sub-dataset of ``traces`` (boundary rows re-grouped, problem ids kept)."""
    keep = torch.isin(data["trace"], traces)
    remap = torch.full((len(data["correct"]),), -1, dtype=torch.long)
    remap[traces] = torch.arange(len(traces))
    out = {k: data[k][traces] for k in ("problem", "correct", "n_ops", "tokens")}
    out.update(states=data["states"][keep], thought=data["thought"][keep], trace=remap[data["trace"][keep]],
               exprs=data["exprs"])
    out.update({k: data[k][keep] for k in ("step_ok", "step_ref", "conf", "y") if k in data})
    return out


def split_fit_val(data: dict, val_percent: int) -> tuple[dict, dict]:
    val_problem = torch.tensor([is_validation(e, val_percent) for e in data["exprs"]])
    is_val = val_problem[data["problem"]]
    return (select_traces(data, torch.nonzero(~is_val).flatten()),
            select_traces(data, torch.nonzero(is_val).flatten()))


def batches(cfg: TrainScorerConfig, data: dict, gen: torch.Generator) -> list[torch.Tensor]:
    """Index batches: boundary rows (mlp) or whole traces packed to >= batch_size boundaries."""
    if cfg.kind == "mlp":
        return list(torch.randperm(len(data["states"]), generator=gen).split(cfg.batch_size))
    counts = torch.bincount(data["trace"], minlength=len(data["correct"]))
    order = torch.randperm(len(data["correct"]), generator=gen)
    order = order[counts[order] > 0]
    out, cur, n = [], [], 0
    for t, c in zip(order.tolist(), counts[order].tolist(), strict=True):
        cur.append(t)
        n += c
        if n >= cfg.batch_size:
            out.append(torch.tensor(cur))
            cur, n = [], 0
    if cur:
        out.append(torch.tensor(cur))
    return out


def batch_loss(cfg: TrainScorerConfig, net, data: dict, idx: torch.Tensor, pos_weight: torch.Tensor):
    """``data["y"]`` holds the boundary labels (``with_labels``)."""
    if cfg.kind == "mlp":
        logits = net(data["states"][idx])
        return F.binary_cross_entropy_with_logits(logits, data["y"][idx].float(), pos_weight=pos_weight)
    x, mask, rows, _ = pad_traces(data, idx)
    logits = net(x)[mask]
    return F.binary_cross_entropy_with_logits(logits, data["y"][rows].float(), pos_weight=pos_weight)


def with_labels(data: dict, label: str) -> dict:
    """``data`` with its boundary labels ``y`` under ``label`` (computed once, carried by splits)."""
    return {**data, "y": boundary_labels(data, label)}


def scorer_inputs(data: dict, confidence: bool) -> dict:
    """``data`` whose ``states`` are what the scorer reads (hidden states + confidence features)."""
    if not confidence:
        return data
    if "conf" not in data:
        raise ValueError("these rollouts carry no confidence features (cached before they existed); "
                         "delete the cache under ~/.cache/gambit and roll out again")
    return {**data, "states": with_confidence(data["states"], data["conf"])}


@torch.no_grad()
def full_loss(cfg, net, data: dict, pos_weight: torch.Tensor) -> float:
    """Mean weighted BCE over all boundaries of ``data``."""
    if not len(data["states"]):
        return float("nan")
    p = predict(net, cfg.kind, data).clamp(1e-7, 1 - 1e-7)
    y = data["y"].float()
    return float(-(pos_weight * y * p.log() + (1 - y) * (1 - p).log()).mean())


def fit(cfg: TrainScorerConfig, data: dict, quiet: bool = False, max_epochs: int | None = None,
        need_val: bool = True):
    """Train on ``data`` (split into fit / validation here); the best net and the per-epoch history.
    Without validation boundaries (allowed only when not ``need_val``: the reproducibility probe)
    every epoch is run and the last is kept."""
    hidden = data["states"].shape[1]  # the target's width, before any confidence features
    data = scorer_inputs(data, cfg.confidence)
    fit_data, val_data = split_fit_val(with_labels(data, cfg.label), cfg.val_percent)
    if need_val and not len(val_data["states"]):
        raise ValueError(f"no validation boundaries (val_percent {cfg.val_percent}): no early stopping or "
                         "best epoch to keep; raise n_problems or val_percent")
    y = fit_data["y"]
    pos, neg = int(y.sum()), int((~y).sum())
    if not pos or not neg:
        raise ValueError(f"the fit data needs both outcomes; got {pos} positive and {neg} negative "
                         "boundaries")
    pos_weight = torch.tensor(neg / pos)
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    net = build_net(cfg.scorer_config(hidden))
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    epochs = max_epochs or cfg.max_epochs
    history, best, best_loss, best_epoch, since = [], None, float("inf"), 0, 0
    bar = tqdm(range(epochs), desc=f"train scorer ({cfg.kind})", disable=quiet)
    for epoch in bar:
        net.train()
        losses = []
        for idx in batches(cfg, fit_data, gen):
            loss = batch_loss(cfg, net, fit_data, idx, pos_weight)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        val_loss = full_loss(cfg, net, val_data, pos_weight)
        val_auc = auc(predict(net, cfg.kind, val_data), val_data["y"])
        history.append({"epoch": epoch + 1, "train_loss": sum(losses) / len(losses), "val_loss": val_loss,
                        "val_auc": val_auc, "steps": len(losses)})
        bar.set_postfix(train=f"{history[-1]['train_loss']:.4f}", val=f"{val_loss:.4f}", auc=f"{val_auc:.3f}")
        if val_loss < best_loss:
            best, best_loss, best_epoch, since = copy.deepcopy(net.state_dict()), val_loss, epoch + 1, 0
        elif not math.isnan(val_loss):  # a NaN (no validation data) stops nothing: the last epoch is kept
            since += 1
            if since >= cfg.patience:
                break
    if best is not None:
        net.load_state_dict(best)
    net.eval()
    best_epoch = best_epoch or len(history)  # NaN losses: min() over them named epoch 1
    split = {"fit_problems": len(torch.unique(fit_data["problem"])), "fit_traces": len(fit_data["correct"]),
             "fit_boundaries": len(fit_data["states"]),
             "val_problems": len(torch.unique(val_data["problem"])), "val_traces": len(val_data["correct"]),
             "val_boundaries": len(val_data["states"]), "pos_weight": neg / pos, "best_epoch": best_epoch}
    return net, history, split


def repro_probe(cfg: TrainScorerConfig, data: dict, quiet: bool = True) -> list[dict]:
    """Loss history of ``repro_epochs`` epochs on the first ``repro_problems`` problems (a whole
    rollout chunk, so a test can regenerate exactly this data alone and compare)."""
    sub = select_traces(data, torch.nonzero(data["problem"] < cfg.repro_problems).flatten())
    return fit(cfg, sub, quiet=quiet, max_epochs=cfg.repro_epochs, need_val=False)[1]


def probe_history(cfg: TrainScorerConfig) -> list[dict]:
    """The card's reproducibility probe from scratch: the first rollout chunk regenerated (no cache),
    then ``repro_epochs`` epochs on it, under ``cfg.isa`` (in a child process when this one is not
    pinned to it)."""
    if not isa_pinned(cfg.isa):  # the child answers a JSON object (run_pinned refused the bare list)
        return run_pinned(cfg.isa, __name__, "pinned_probe_history", asdict(cfg))["loss_history"]
    rc = cfg.rollouts("train")
    rc.n_problems = cfg.repro_problems
    chunk = collect_rollouts(rc, cache_dir="", quiet=True)
    with fixed_threads(cfg.train_threads):
        return repro_probe(cfg, chunk)


def pinned_probe_history(cfg: TrainScorerConfig) -> dict:
    """``probe_history`` as ``run_pinned``'s child runs it: its result is a JSON object."""
    return {"loss_history": probe_history(cfg)}


def train_scorer(cfg: TrainScorerConfig, quiet: bool = False) -> dict:
    """Roll out (or load cached), train, evaluate on held-out problems, save the scorer folder."""
    check_output_dir(cfg.out)  # before the rollouts and the training, not when it is saved
    check_out_kind(cfg.out, "scorer")  # e.g. --out the target's folder: its config.json replaced
    if not isa_pinned(cfg.isa):  # the switches are read when torch loads: a child process runs it
        return run_pinned(cfg.isa, __name__, "train_scorer", asdict(cfg), quiet=quiet)
    cache = cfg.cache_dir or None
    if any(not cache_path(cfg.rollouts(s), cache).is_file() for s in ("train", "dev")):
        cpu_attention.kernel()  # compiled (or waited for) now: not timed as the first trace by the bar
    train = collect_rollouts(cfg.rollouts("train"), cache, quiet)
    held = collect_rollouts(cfg.rollouts("dev"), cache, quiet)
    with fixed_threads(cfg.train_threads):
        start = time.time()
        net, history, split = fit(cfg, train, quiet)
        seconds = time.time() - start
        ev = evaluate(predict(net, cfg.kind, scorer_inputs(held, cfg.confidence)), held)
        env = environment()
        repro = repro_probe(cfg, train) if cfg.repro_epochs else []
    scfg = cfg.scorer_config(train["states"].shape[1])
    out = Path(cfg.out)
    save_scorer(net, scfg, out)
    readable(out / "model.safetensors")  # safetensors writes 0600: unreadable to a serving user
    info = {"config": asdict(cfg), "scorer": asdict(scfg), "params": sum(p.numel() for p in net.parameters()),
            "data": {**split, "train_rollouts": train["config"], "heldout_rollouts": held["config"],
                     "train_correct": float(train["correct"].float().mean()),
                     "heldout_correct": float(held["correct"].float().mean())},
            "loss_history": history, "train_seconds": round(seconds, 1), "heldout": ev,
            "repro": {"problems": cfg.repro_problems, "epochs": cfg.repro_epochs, "loss_history": repro},
            "torch_version": env["torch"], "torch_threads": env["threads"], "environment": env}
    (out / "training.json").write_text(json.dumps(info, indent=2) + "\n")
    return info
