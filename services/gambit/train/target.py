"""Train the shipped target on generated solutions (``gambit train target``).

Seeded and step-based with a pinned thread count, so a rerun with the same torch build reproduces
the loss history and weights (``gambit.train.repro``). Loss is on solution tokens only (the prompt's
numbers are random and unpredictable).
"""

from __future__ import annotations

import copy
import functools
import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F
from tqdm import tqdm

from gambit.checks import above, at_least, finite, within
from gambit.model import CausalLM, ModelConfig, Tokenizer, build_char_tokenizer, save_model
from gambit.paths import TARGET, check_output_dir
from gambit.tasks.arithmetic import PROMPT_TEMPLATE, TaskConfig, format_step, make_problem
from gambit.train import repro
from gambit.train.out_folder import check_out_kind


@dataclass
class TrainTargetConfig:
    FLAG_ERRORS: ClassVar[bool] = True  # gambit.config_cli: its errors name the flags, exit 2
    out: str = str(TARGET)  # folder the trained model is saved to (Hugging Face layout)
    seed: int = 0  # initialisation and data seed
    steps: int = 2500  # optimiser steps
    batch_size: int = 20  # sequences per step
    lr: float = 1.5e-3  # peak learning rate (AdamW), after the warmup
    min_lr_ratio: float = 0.05  # the cosine decay's floor, as a fraction of lr
    warmup: int = 100  # linear warmup, steps
    weight_decay: float = 0.01  # AdamW weight decay
    hidden_size: int = 192  # model width: features per token (hidden size)
    num_layers: int = 6  # decoder layers (>= 6: three distinct EAGLE-3 taps)
    num_heads: int = 4  # attention heads
    num_kv_heads: int = 4  # key/value heads (GQA when fewer than num_heads)
    intermediate_size: int = 512  # MLP width: features of each layer's feed-forward
    max_positions: int = 1024  # longest sequence, tokens (RoPE table)
    min_ops: int = 2  # fewest operations in a training problem
    max_ops: int = 8  # most operations in a training problem
    spell_products: bool = False  # solutions spell each product out by place value
    threads: int = 2  # torch intra-op threads (recorded in the card; floats depend on it)
    checkpoint_every: int = 0  # also save <out>-step<N> every N steps (0: never)
    # float64's rounding (~1e-16) stays below the history's 5 digits through step 200 at any thread
    # count, where float32's grows past the learning-rate peak (tools/target_repro_dtype.py)
    train_dtype: str = "float32"  # training arithmetic: float32 (the shipped card's) | float64 (~2x slower)
    # compatible: the same floats on every AMD CPU tried (Intel: other last bits, recorded:
    # gambit.train.vendor_history), ~2.1x slower; it runs in a child process, since the libraries read
    # their switches when torch loads (gambit.train.repro.ISA_ENV)
    isa: str = "machine"  # kernels' instruction set: machine (floats differ by CPU kind) | compatible
    eval_samples: int = 16  # then evaluate on the test split for the model card (0: skip; "not evaluated")

    def __post_init__(self) -> None:
        at_least(1, steps=self.steps, batch_size=self.batch_size)
        at_least(0, eval_samples=self.eval_samples)  # checked after the training before: 30 minutes lost
        above(0, lr=self.lr)
        # refused here, not as a nan loss or a wrong schedule after training has run
        at_least(0, weight_decay=self.weight_decay, warmup=self.warmup,
                 checkpoint_every=self.checkpoint_every)
        finite(lr=self.lr, weight_decay=self.weight_decay)  # an inf turns the weights nan
        within(0, 1, min_lr_ratio=self.min_lr_ratio)  # the cosine floor, a fraction of the peak lr
        at_least(1, hidden_size=self.hidden_size, num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
                 intermediate_size=self.intermediate_size, max_positions=self.max_positions)
        TaskConfig(self.min_ops, self.max_ops, self.spell_products)  # 1 <= min_ops <= max_ops
        need = longest_sequence(self.max_ops, self.spell_products)
        if self.max_positions < need:  # else an IndexError traceback when a long problem comes up
            raise ValueError(f"max_positions must be >= {need} (the longest prompt + solution with "
                             f"max_ops {self.max_ops}), got {self.max_positions}")
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1 (the card records it), got {self.threads}")
        if self.num_layers < 6:
            raise ValueError("num_layers must be >= 6 so the three EAGLE-3 taps (2, L//2, L-3) differ")
        if self.train_dtype not in TRAIN_DTYPES:
            raise ValueError(f"train_dtype must be one of {', '.join(TRAIN_DTYPES)}, "
                             f"got {self.train_dtype!r}")
        repro.check_isa(self.isa)
        check_out_kind(self.out, "model")  # e.g. --out a drafter's folder: its weights replaced


TRAIN_DTYPES = {"float32": torch.float32, "float64": torch.float64}


@functools.cache
def longest_step(spell: bool) -> int:
    """Characters of the longest thought: ``999-99=900``, or a spelled product (intermediates <= 999)."""
    plain = len(format_step(999, "-", 99, 900))
    if not spell:
        return plain
    return max(plain, *(len(format_step(a, "*", b, a * b, spell=True))
                        for b in range(2, 10) for a in range(10, 999 // b + 1)))


def longest_sequence(max_ops: int, spell: bool = False) -> int:
    """Tokens of the longest training sequence, bounded from the task's rules (the tokenizer reads a
    character as at most one token): <bos>, the prompt, one thought and separator per operation, the
    boxed answer, <eos>. Each operation adds at most 4 characters to the expression: ``(...)*9``."""
    prompt = len(PROMPT_TEMPLATE.format(expr="")) + 2 + 4 * max_ops
    return 1 + prompt + max_ops * (longest_step(spell) + 1) + len("\\boxed{999}") + 1


def save_float32(model: CausalLM, tok: Tokenizer, out) -> None:
    """Save the weights as float32 (what the engine serves), whatever the training arithmetic."""
    save_model(model if all(p.dtype == torch.float32 for p in model.parameters())
               else copy.deepcopy(model).float(), tok, out)


def checkpoint_dir(out: str, step: int) -> Path:
    """``<out>-step<N>``, beside the output folder: ``--out runs/t/`` put it inside, as ``runs/t/-stepN``."""
    p = Path(out).absolute()
    return p.with_name(f"{p.name}-step{step}")


def model_config(cfg: TrainTargetConfig, tok: Tokenizer) -> ModelConfig:
    return ModelConfig(
        vocab_size=tok.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads, max_position_embeddings=cfg.max_positions,
        tie_word_embeddings=True, bos_token_id=tok.bos_id, eos_token_id=tok.eos_ids[0],
        pad_token_id=tok.pad_id)


def batches(cfg: TrainTargetConfig, tok: Tokenizer, rng: random.Random, group: int = 8):
    """Padded (ids, loss mask) batches; ``group`` batches are length-sorted together to cut padding."""
    task = TaskConfig(cfg.min_ops, cfg.max_ops, cfg.spell_products)
    while True:
        rows = []
        while len(rows) < cfg.batch_size * group:
            p = make_problem(rng, rng.randint(task.min_ops, task.max_ops), task.spell_products)
            if p.split != "train":
                continue
            prompt = tok.encode(p.prompt)
            target = tok.encode(p.solution, add_bos=False) + tok.eos_ids[:1]
            rows.append((prompt + target, len(prompt)))
        rows.sort(key=lambda r: len(r[0]))
        chunks = [rows[i:i + cfg.batch_size] for i in range(0, len(rows), cfg.batch_size)]
        rng.shuffle(chunks)
        for chunk in chunks:
            T = max(len(r[0]) for r in chunk)
            ids = torch.full((len(chunk), T), tok.pad_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), T), dtype=torch.bool)
            for i, (seq, n_prompt) in enumerate(chunk):
                ids[i, :len(seq)] = torch.tensor(seq)
                mask[i, n_prompt:len(seq)] = True
            yield ids, mask


def lr_at(cfg: TrainTargetConfig, step: int) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def train_target(cfg: TrainTargetConfig, stop: int | None = None) -> dict:
    """Train and save; ``stop`` runs only the first steps and saves nothing, checkpoints neither
    (reproducibility test)."""
    if stop is None:
        check_output_dir(cfg.out, beside=True)  # before the training, not when it is saved
    if not repro.isa_pinned(cfg.isa):
        return repro.run_pinned(cfg.isa, __name__, "train_target", asdict(cfg), stop=stop)
    rng = repro.setup(cfg.seed, cfg.threads)
    tok = build_char_tokenizer()
    model = CausalLM(model_config(cfg, tok)).to(TRAIN_DTYPES[cfg.train_dtype])
    for p in model.parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.02)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    n_params = sum(p.numel() for p in model.parameters())
    start, tokens, ema = time.time(), 0, None
    data = batches(cfg, tok, rng)
    bar = tqdm(range(cfg.steps), desc=f"train target ({n_params / 1e6:.2f}M params)", mininterval=5)
    history = []
    for step in bar:
        if stop is not None and step >= stop:
            break
        ids, mask = next(data)
        for g in opt.param_groups:
            g["lr"] = lr_at(cfg, step)
        hidden, _ = model(ids[:, :-1])
        logits = model.logits(hidden)
        loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="none")
        m = mask[:, 1:].flatten().float()
        loss = (loss * m).sum() / m.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        tokens += ids.numel()
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        elapsed = time.time() - start
        bar.set_postfix(loss=f"{ema:.4f}", tok_s=f"{tokens / elapsed:.0f}", refresh=False)
        if step % 100 == 0 or step == cfg.steps - 1:
            history.append({"step": step, "loss": round(ema, 5), "elapsed_s": round(elapsed, 1)})
        if stop is None and cfg.checkpoint_every and step and step % cfg.checkpoint_every == 0:
            save_float32(model, tok, checkpoint_dir(cfg.out, step))
    if stop is not None:
        return {"config": asdict(cfg), "loss_history": history, **repro.environment()}
    model.eval()
    out = Path(cfg.out)
    save_float32(model, tok, out)
    info = {"config": asdict(cfg), "params": n_params, "train_tokens": tokens,
            "train_seconds": round(time.time() - start, 1), "final_loss": round(ema, 5),
            "loss_history": history, **repro.environment()}
    (out / "training.json").write_text(json.dumps(info, indent=2))
    # save_model keeps the files beside the weights: an earlier model's evaluation and card would
    # describe these weights; the card says "not evaluated" until an evaluation writes its own
    from gambit.train.card import write_card

    (out / "eval_test.json").unlink(missing_ok=True)
    write_card(out)
    return info
