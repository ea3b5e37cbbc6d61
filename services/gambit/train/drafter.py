"""Train a drafter for the shipped target (``gambit train drafter --method eagle3.1|pr|hass|hass+pr``).

All methods share the data (target-regenerated traces, ``drafter_data``), the training-time test
(``ttt.unroll``: n unrolled steps with the serving masks), AdamW and the step budget. With
``p_t`` the target's distribution at position ``t``, ``q_{i,j}`` the drafter's at step ``i``, row
``j`` (predicting the token after ``t = j+1+i``), ``CE(p, q) = −Σ_v p(v) log q(v)`` and ``V_i`` the
valid rows of step ``i``, the losses are::

    eagle3.1:  L = Σ_i 0.8^i · mean_{V_i} CE(p_t, q_{i,j})
    hass:      L = Σ_i 0.8^i · mean_{V_i} [CE(p_t, q_{i,j}) + w · TopK(p_t, q_{i,j})],
               TopK(p, q) = −Σ_{v ∈ top-K(p)} p(v) log q(v)   (K = hass_topk, w = hass_weight)
    pr:        L = L_eagle3.1 + Σ_i 0.8^i · [mean_{R_i} CE(p_t, q'_{i,j}) + β · mean_{C_i} CE(p_t, q'_{i,j})]
    hass+pr:   L = L_hass     + the same PR term
    pr, --reconsider-loss fresh: the R_i term is FreshCE(p_t, q'_{i,j}; O) = −Σ_{v ∉ O} p_t(v) log q̃'(v),
               O = top-k of the first pass q_{i,j} (k = fresh_k), q̃' = softmax of q' over the tokens
               outside O: serving adds the best token the node did not offer, so that is what is trained

PR: ``R_i`` are the ``reconsider_frac`` of step ``i``'s valid rows with the lowest drafter top-1
probability (the positions it is least sure of); ``q'`` is the reconsideration pass on the row's own
output feature (self-query unless ``--no-self-query``). ``C_i``, the balance set, is as many rows drawn
uniformly (seeded) from the remaining, confident valid rows: β balances recovering hesitant guesses
against keeping confident ones, since at serving time the least-confident rows of a frontier are not
always wrong. HASS's harmonized context alignment (later passes query from the drafter's own
predicted features and attend to its own earlier drafted keys) is exactly the unrolled step's
attention pattern, so HASS differs from EAGLE-3.1 here by its top-K distillation term.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

import torch
from tqdm import tqdm

from gambit.checks import above, at_least, finite, within
from gambit.model.config import ModelConfig
from gambit.paths import ASSETS, TARGET, check_output_dir
from gambit.speculative.drafter import Drafter, DrafterConfig, save_drafter
from gambit.train import repro
from gambit.train.drafter_data import DrafterDataConfig, build_data
from gambit.train.drafter_eval import heldout_acceptance
from gambit.train.out_folder import check_out_kind
from gambit.train.ttt import fresh_ce, soft_ce, topk_ce, unroll

METHODS = ("eagle3.1", "pr", "hass", "hass+pr")
PR_FIELDS = ("beta", "reconsider_weight", "reconsider_frac", "self_query", "reconsider_loss", "fresh_k")
HASS_FIELDS = ("hass_topk", "hass_weight")
INIT_MATCH = ("num_layers", "target_taps", "draft_vocab_size", "fc_norm", "norm_output")  # --init's and ours
SHIPPED = {"eagle3.1": "drafter-eagle3.1", "pr": "drafter-pr", "hass": "drafter-hass",
           "hass+pr": "drafter-hass-pr"}


@dataclass
class TrainDrafterConfig:
    FLAG_ERRORS: ClassVar[bool] = True  # gambit.config_cli: its errors name the flags, exit 2
    method: str = "eagle3.1"  # drafter training method: eagle3.1 | pr | hass | hass+pr
    out: str = ""  # output folder ("" = the shipped folder of the method)
    target: str = str(TARGET)  # target model: a folder, or a name such as smollm2
    seed: int = 0  # init, batch order and balance-set seed
    steps: int = 800  # optimizer steps (the compute budget, equal for every method)
    batch_size: int = 8  # sequences per step
    lr: float = 3e-3  # peak AdamW learning rate (linear warmup, cosine decay)
    min_lr_ratio: float = 0.1  # final learning rate / peak
    warmup: int = 40  # warmup steps
    weight_decay: float = 0.0  # AdamW weight decay on matrices
    grad_clip: float = 0.5  # clip of the gradients' total L2 norm
    ttt_steps: int = 3  # unrolled training-time-test steps (loss weight 0.8^i)
    beta: float = 0.5  # PR balance term weight on the confident rows' reconsideration
    # the passes share one layer, so a lower λ leaves more of it to one-pass drafting
    reconsider_weight: float = 1.0  # PR: weight λ of the whole reconsideration term (1 = the paper's loss)
    reconsider_frac: float = 0.25  # PR: fraction of valid rows reconsidered per unrolled step
    self_query: bool = True  # PR: the reconsideration pass takes its query from the feature
    reconsider_loss: str = "full"  # PR: full (CE to the target) | fresh (only the tokens not offered)
    fresh_k: int = 6  # PR, reconsider_loss fresh: first-pass top-k left out (serving offer width k)
    hass_topk: int = 10  # HASS: top-K of the target's distribution distilled
    hass_weight: float = 1.0  # HASS: weight of the top-K term
    num_layers: int = 1  # decoder layers of the drafter (2: the "second layer" ablation)
    init: str = ""  # start from this drafter folder (EAGLE-3 layout, e.g. a published one; "" = fresh)
    threads: int = 1  # torch intra-op threads (recorded in the card; part of reproducibility)
    eval_every: int = 1000  # held-out acceptance every N steps (and at the end)
    n_train: int = 1536  # data: train-split problems (one target trace each)
    n_heldout: int = 64  # data: dev-split problems (greedy target traces)
    data_temperature: float = 0.8  # data: sampling temperature of the training traces
    data_max_tokens: int = 400  # data: generated tokens per trace at most
    prompts: str = ""  # data: "" = the arithmetic task; else a GSM8K-layout JSONL of questions (real models)
    draft_vocab: int = 0  # draft vocabulary: 0 = the target's; N = its N most used tokens (d2t/t2d)
    cache_dir: str = ""  # data cache ("" = $GAMBIT_CACHE or ~/.cache/gambit)
    # compatible: data and training under the switches that gave the target one loss history on both
    # x86 CPU kinds tried (gambit.train.repro.ISA_ENV), in a child process; ~1.6x slower
    isa: str = "machine"  # kernels' instruction set: machine (floats differ by CPU kind) | compatible

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        at_least(1, steps=self.steps, batch_size=self.batch_size, ttt_steps=self.ttt_steps)
        above(0, lr=self.lr)
        if not 0 < self.reconsider_frac <= 0.5:
            raise ValueError(f"reconsider_frac must be in (0, 0.5], got {self.reconsider_frac}")
        at_least(0, beta=self.beta, hass_weight=self.hass_weight)
        at_least(1, hass_topk=self.hass_topk)
        if not 0 < self.reconsider_weight <= 10:
            raise ValueError(f"reconsider_weight must be in (0, 10], got {self.reconsider_weight}")
        if self.reconsider_loss not in ("full", "fresh"):
            raise ValueError(f"reconsider_loss must be 'full' or 'fresh', got {self.reconsider_loss!r}")
        at_least(1, fresh_k=self.fresh_k)
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1 (it is recorded in the card), got {self.threads}")
        # refused here, not as a nan loss, a wrong schedule or a crash after minutes of data generation
        above(0, grad_clip=self.grad_clip)  # 0 would zero every gradient
        at_least(0, weight_decay=self.weight_decay, warmup=self.warmup)
        finite(lr=self.lr, weight_decay=self.weight_decay)  # an inf turns the weights nan
        within(0, 1, min_lr_ratio=self.min_lr_ratio)  # the cosine floor, a fraction of the peak lr
        at_least(1, eval_every=self.eval_every, num_layers=self.num_layers, n_train=self.n_train,
                 n_heldout=self.n_heldout, data_max_tokens=self.data_max_tokens)
        at_least(0, data_temperature=self.data_temperature, draft_vocab=self.draft_vocab)
        if self.batch_size > self.n_train:  # the batch was cut to n_train, the card said batch_size
            raise ValueError(f"batch_size must be <= n_train ({self.n_train} sequences), "
                             f"got {self.batch_size}")
        self._check_method_flags()
        repro.check_isa(self.isa)
        from gambit.model.registry import resolve_model

        self.target = str(resolve_model(self.target))
        if not self.out:
            if Path(self.target).resolve() != TARGET.resolve():
                raise ValueError("give --out for a drafter of a target other than the shipped one")
            self.out = str(ASSETS / SHIPPED[self.method])
        check_out_kind(self.out, "drafter")  # e.g. --out the target's folder: its weights replaced
        self.data()  # the data config's own checks (the prompts file), before any model loads
        target = target_config(self.target)
        if target is not None and self.draft_vocab >= target.vocab_size:
            raise ValueError(f"draft_vocab must be < the target's vocabulary ({target.vocab_size} tokens; "
                             f"0 = all of it), got {self.draft_vocab}")
        if target is not None:  # else a RuntimeError (topk) or a zero loss term after the data phase
            self._check_vocab_widths(self.draft_vocab or target.vocab_size)
        if self.init:  # what init_from compares, checked before the data is generated
            check_init(self, target)

    def _check_method_flags(self) -> None:
        """Flags of another method than ``method``, refused: they were ignored, and the card's command
        still listed them (an eagle3.1 drafter "trained with --beta 0")."""
        default = TrainDrafterConfig.__dataclass_fields__
        given = [n for n in (*PR_FIELDS, *HASS_FIELDS) if getattr(self, n) != default[n].default]
        for names, methods, used in ((PR_FIELDS, "pr | hass+pr", self.uses_pr),
                                     (HASS_FIELDS, "hass | hass+pr", self.uses_hass)):
            wrong = [_flag(n, getattr(self, n)) for n in given if n in names]
            if wrong and not used:
                raise ValueError(f"{', '.join(wrong)}: for --method {methods} only, not {self.method}")
        if "fresh_k" in given and self.reconsider_loss != "fresh":
            raise ValueError("--fresh-k: for --reconsider-loss fresh only")

    def _check_vocab_widths(self, vocab: int) -> None:
        """Top-k widths against the draft vocabulary the logits span (``vocab`` tokens)."""
        if self.uses_hass and self.hass_topk > vocab:
            raise ValueError(f"hass_topk must be <= the draft vocabulary ({vocab} tokens), "
                             f"got {self.hass_topk}")
        if self.uses_pr and self.reconsider_loss == "fresh" and self.fresh_k >= vocab:
            raise ValueError(f"fresh_k must be < the draft vocabulary ({vocab} tokens: the reconsideration "
                             f"learns the tokens outside the first pass's top fresh_k), got {self.fresh_k}")

    @property
    def uses_pr(self) -> bool:
        return self.method in ("pr", "hass+pr")

    @property
    def uses_hass(self) -> bool:
        return self.method in ("hass", "hass+pr")

    def data(self) -> DrafterDataConfig:
        return DrafterDataConfig(target=self.target, n_train=self.n_train, n_heldout=self.n_heldout,
                                 temperature=self.data_temperature, max_tokens=self.data_max_tokens,
                                 seed=0, prompts=self.prompts, draft_vocab=self.draft_vocab,
                                 cache_dir=self.cache_dir, isa=self.isa)


def _flag(name: str, value) -> str:
    """A field as its command-line flag (``--no-self-query`` for a switch turned off)."""
    flag = name.replace("_", "-")
    return f"--no-{flag}" if value is False else f"--{flag}"


def target_config(folder: str) -> ModelConfig | None:
    """The target's config.json (None when there is none: loading the target names that problem)."""
    path = Path(folder) / "config.json"
    return ModelConfig.from_file(path) if path.is_file() else None


def check_init(cfg: TrainDrafterConfig, target: ModelConfig | None) -> None:
    """``cfg.init`` is a drafter folder whose layers, taps and draft vocabulary are this run's (what
    ``init_from`` compares after the data, checked before it), else ValueError in one line."""
    init = Path(cfg.init)
    if not init.is_dir():
        raise ValueError(f"init must be a drafter folder, got {cfg.init!r} (no such folder)")
    if not (init / "config.json").is_file() or not any(init.glob("*.safetensors")):
        raise ValueError(f"init must be a drafter folder, got {cfg.init!r} "
                         "(no config.json or no *.safetensors in it)")
    try:
        raw = json.loads((init / "config.json").read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"init: {init / 'config.json'}: malformed JSON: {e.msg}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"init: {init / 'config.json'}: not a drafter config (a JSON object)")
    archs = raw.get("architectures") or []
    if archs and not any("eagle" in str(a).lower() for a in archs):
        raise ValueError(f"init: {cfg.init} is not an EAGLE-3 drafter (architectures {archs})")
    if target is None:
        return
    try:
        src = DrafterConfig.from_dict(raw, target)
    except ValueError as e:
        raise ValueError(f"init: {init / 'config.json'}: {e}") from None
    built = DrafterConfig.for_target(target, num_layers=cfg.num_layers,
                                     draft_vocab_size=cfg.draft_vocab or target.vocab_size)
    for name in ("hidden_size", "vocab_size", *INIT_MATCH):
        if getattr(src, name) != getattr(built, name):
            raise ValueError(f"init drafter {cfg.init}: {name} is {getattr(src, name)!r}, this run trains "
                             f"{getattr(built, name)!r}")


def lr_at(cfg: TrainDrafterConfig, step: int) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def build_drafter(cfg: TrainDrafterConfig, target, draft_ids: torch.Tensor | None = None) -> Drafter:
    """``draft_ids``: the target ids of a reduced draft vocabulary (ascending), else the whole one."""
    vd = target.config.vocab_size if draft_ids is None else draft_ids.numel()
    dc = DrafterConfig.for_target(target.config, num_layers=cfg.num_layers, method=cfg.method,
                                  draft_vocab_size=vd)
    drafter = Drafter(dc, target.model.embed_tokens)
    head = target.lm_head_weight()
    with torch.no_grad():  # the target's output head: a drafter starts by predicting like it
        if draft_ids is None:
            drafter.lm_head.weight.copy_(head)
        else:  # EAGLE-3's maps: target id = draft id + d2t[draft id]; t2d marks the draft tokens
            drafter.lm_head.weight.copy_(head[draft_ids])
            drafter.d2t.copy_(draft_ids - torch.arange(vd))
            drafter.t2d.zero_()
            drafter.t2d[draft_ids] = True
    return drafter


def init_from(drafter: Drafter, folder: str, target) -> None:
    """Copy the weights of the drafter in ``folder`` into ``drafter`` (a continued or a fine-tuned
    drafter: a published EAGLE-3 checkpoint can become a PR one). Its layers, taps and draft
    vocabulary must be the ones this run trains, else ValueError naming what differs."""
    from gambit.speculative.drafter import load_drafter

    src = load_drafter(folder, target)
    a, b = src.config, drafter.config
    for name in INIT_MATCH:
        if getattr(a, name) != getattr(b, name):
            raise ValueError(f"init drafter {folder}: {name} is {getattr(a, name)!r}, this run trains "
                             f"{getattr(b, name)!r}")
    if not torch.equal(src.d2t, drafter.d2t):
        raise ValueError(f"init drafter {folder}: its draft vocabulary (d2t) is not this data's")
    drafter.load_state_dict(src.state_dict(), strict=True)


def make_reconsider(cfg: TrainDrafterConfig, gen: torch.Generator):
    """PR row selection: lowest top-1 rows (R) then an equal random draw of the rest (C)."""
    def select(i, logits, valid):
        conf = logits.detach().softmax(-1).amax(-1).masked_fill(~valid, float("inf"))
        n_valid = int(valid.sum())
        n = max(1, int(n_valid * cfg.reconsider_frac))
        if n_valid < 2:
            return None
        low = conf.flatten().topk(n, largest=False).indices
        rest = torch.ones_like(conf, dtype=torch.bool).flatten()
        rest[low] = False
        rest &= valid.flatten()
        pool = rest.nonzero().flatten()
        bal = pool[torch.randperm(pool.numel(), generator=gen)[:n]] if cfg.beta > 0 else pool[:0]
        rows = torch.cat([low, bal])
        select.n_low = n
        return rows // conf.shape[1], rows % conf.shape[1], cfg.self_query
    select.n_low = 0
    return select


def step_loss(cfg: TrainDrafterConfig, drafter: Drafter, batch, pad_id: int, reconsider) -> torch.Tensor:
    total = torch.zeros(())
    for i, logits, tl, valid, recon in unroll(drafter, batch, cfg.ttt_steps, pad_id, reconsider):
        w = 0.8 ** i
        if valid.any():
            term = soft_ce(tl[valid], logits[valid])
            if cfg.uses_hass:
                term = term + cfg.hass_weight * topk_ce(tl[valid], logits[valid], cfg.hass_topk)
            total = total + w * term.mean()
        if recon is not None:
            b, r, rl = recon
            ce = soft_ce(tl[b, r], rl)
            n = reconsider.n_low
            # λ · 0.8^i; at λ = 1 exactly the shipped cards' floats (the same products, the same order)
            wr = w if cfg.reconsider_weight == 1.0 else w * cfg.reconsider_weight
            if cfg.reconsider_loss == "fresh":  # R's rows: rank what the node did not offer
                low = fresh_ce(tl[b[:n], r[:n]], rl[:n], logits[b[:n], r[:n]].detach(), cfg.fresh_k)
                total = total + wr * low.mean()
            else:
                total = total + wr * ce[:n].mean()
            if cfg.beta > 0 and ce.numel() > n:
                total = total + wr * cfg.beta * ce[n:].mean()
    return total


def train_drafter(cfg: TrainDrafterConfig, stop: int | None = None, data: dict | None = None) -> dict:
    """Train (``stop``: only the first steps, nothing saved — the reproducibility test) and save.

    ``data`` (tests) replaces the cached target traces. Under ``isa`` "compatible" in a process not
    already pinned, the whole run (data included) goes to a child process under the switches.
    """
    from gambit.model import load_model

    if stop is None:
        check_output_dir(cfg.out)  # before the data and the training, not when it is saved
    if not repro.isa_pinned(cfg.isa):
        if data is not None:
            raise ValueError(f"isa={cfg.isa}: data given in this process cannot cross into the pinned child")
        return repro.run_pinned(cfg.isa, __name__, "train_drafter", asdict(cfg), stop=stop)

    repro.setup(cfg.seed, cfg.threads)
    target, tok = load_model(cfg.target)
    target.requires_grad_(False)
    taps = DrafterConfig.for_target(target.config).target_taps
    data = data or build_data(cfg.data(), taps)
    torch.manual_seed(cfg.seed)  # data generation may have drawn from the global generator
    drafter = build_drafter(cfg, target, data["train"].draft_ids)
    if cfg.init:
        init_from(drafter, cfg.init, target)
    decay = [p for p in drafter.parameters() if p.dim() >= 2]
    other = [p for p in drafter.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": other, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(cfg.seed)
    reconsider = make_reconsider(cfg, gen) if cfg.uses_pr else None
    train = data["train"]
    order: list[int] = []
    history, evals = [], []
    n_steps = cfg.steps if stop is None else min(stop, cfg.steps)
    start = time.time()
    bar = tqdm(range(n_steps), desc=f"train drafter ({cfg.method})", mininterval=5)
    for step in bar:
        if len(order) < cfg.batch_size:
            order += torch.randperm(len(train), generator=gen).tolist()
        idx, order = order[:cfg.batch_size], order[cfg.batch_size:]
        batch = train.batch(idx, tok.pad_id)
        for g in opt.param_groups:
            g["lr"] = lr_at(cfg, step)
        loss = step_loss(cfg, drafter, batch, tok.pad_id, reconsider)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), cfg.grad_clip)
        opt.step()
        history.append({"step": step, "loss": round(loss.item(), 6)})
        bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)  # drawn with the count, every 5 s
        if stop is None and ((step + 1) % cfg.eval_every == 0 or step == n_steps - 1):
            ev = heldout_acceptance(drafter, data["heldout"], tok.pad_id, cfg.ttt_steps, cfg.reconsider_frac,
                                    cfg.self_query if cfg.uses_pr else None)
            evals.append({"step": step, **ev})
            bar.write(f"step {step}: held-out {ev}")
    seconds = time.time() - start
    info = {"config": asdict(cfg), "drafter_config": drafter.config.to_dict(),
            "params": sum(p.numel() for p in drafter.parameters()), "train_seconds": round(seconds, 1),
            "loss_history": history, "heldout": evals, "data": data["info"], **repro.environment()}
    if stop is None:
        save(cfg, drafter, info)
    return info


def save(cfg: TrainDrafterConfig, drafter: Drafter, info: dict) -> Path:
    from gambit.model.loader import readable
    from gambit.train.drafter_card import card_text

    out = Path(cfg.out)
    save_drafter(drafter, out, extra_card=card_text(info))
    readable(out / "model.safetensors")  # safetensors writes 0600: unreadable to a serving user
    conf = json.loads((out / "config.json").read_text())
    conf["pr_self_query"] = bool(cfg.uses_pr and cfg.self_query)  # how its reconsider rows must query
    (out / "config.json").write_text(json.dumps(conf, indent=2) + "\n")
    (out / "training.json").write_text(json.dumps(info, indent=1) + "\n")
    return out
