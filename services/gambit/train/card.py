"""The model card written beside shipped weights: size, data, command, accuracy table."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from gambit.bench.eval import format_table
from gambit.paths import REPO, TARGET

ISA_NOTE = {"compatible": "instruction set pinned to `compatible` (ATen's scalar kernels, "
                          "`MKL_CBWR=COMPATIBLE`, oneDNN up to SSE4.1, the project's C++ kernels off): the "
                          "switches under which every model's history was the same on both AMD CPU kinds "
                          "tried (an Intel Xeon rounds some last bits otherwise: its histories are kept "
                          "beside the card, `repro-GenuineIntel.json`)"}


def command_line(cfg: dict) -> str:
    """``gambit train target`` with the flags whose values differ from today's defaults (not ``--out``)."""
    from gambit.train.target import TrainTargetConfig

    default = asdict(TrainTargetConfig())
    flags = [f" --{k.replace('_', '-')} {v}" for k, v in cfg.items()
             if k != "out" and k in default and v != default[k]]
    return "gambit train target" + "".join(flags)


def _shown(folder: Path) -> str:
    """The folder relative to the checkout where it lies inside it (cards are read from any clone)."""
    try:
        return str(folder.resolve().relative_to(REPO))
    except ValueError:
        return str(folder)


def write_card(folder: str | Path) -> Path:
    """Render ``README.md`` from ``training.json`` and ``eval_test.json`` in ``folder``."""
    folder = Path(folder)
    train = json.loads((folder / "training.json").read_text())
    result = json.loads((folder / "eval_test.json").read_text())
    cfg, ev = train["config"], result["config"]
    size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    k = result["samples"]
    model_flag = "" if folder.resolve() == TARGET.resolve() else f" --model {_shown(folder)}"
    text = f"""# Shipped target: {train['params'] / 1e6:.2f}M-parameter Llama-family model

Trained from scratch in this repository on generated solutions of the arithmetic task
(`gambit.tasks.arithmetic`, train split only; {cfg['min_ops']}–{cfg['max_ops']} operations per problem).

| | |
|---|---|
| architecture | `LlamaForCausalLM`: {cfg['num_layers']} layers, hidden {cfg['hidden_size']}, \
{cfg['num_heads']} heads ({cfg['num_kv_heads']} KV), SwiGLU {cfg['intermediate_size']}, RoPE, \
tied embeddings |
| context | {cfg['max_positions']} positions |
| tokenizer | characters of printable ASCII + one `\\n\\n` token (the thought boundary), \
`<bos>` `<eos>` `<pad>` |
| weights | `model.safetensors`, fp32, {size / 1e6:.1f} MB |
| training | {cfg['steps']} steps x {cfg['batch_size']} problems, AdamW lr {cfg['lr']} cosine, \
seed {cfg['seed']}; \
{train['train_tokens'] / 1e6:.1f}M tokens (padded) in {train['train_seconds'] / 60:.1f} min on \
{train['torch_threads']} CPU threads; final loss {train['final_loss']} nats/token (solution tokens) |
| environment | torch {train.get('torch_version', '?')}, {train['torch_threads']} CPU threads, \
CPU capability {train.get('cpu_capability', '?')} (floats, and so the loss history, depend on all three)\
{'; ' + ISA_NOTE[cfg['isa']] if cfg.get('isa') in ISA_NOTE else ''} |
| command | `{command_line(cfg)}` (it also evaluates and writes this card) |

## Accuracy (test split, {result['n_problems']} problems, T = {ev['temperature']}, {k} samples each)

Reproduce: `gambit eval{model_flag} --split test --samples {k} --json results/eval_test.json`

```
{format_table(result)}
```

pass@1 is the mean single-sample accuracy; maj@{k} the majority vote over the {k} samples; pass@{k}
whether any sample is right — the gap between maj@{k} and pass@{k} is the room a search has.
"""
    path = folder / "README.md"
    path.write_text(text)
    return path
