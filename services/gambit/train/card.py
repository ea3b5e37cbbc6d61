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


def command_line(cfg: dict, folder: Path | None = None) -> str:
    """``gambit train target`` with the flags whose values differ from today's defaults, and ``--out``
    when ``folder`` is not the shipped target: a command that retrains this model, not the shipped one."""
    from gambit.train.target import TrainTargetConfig

    default = asdict(TrainTargetConfig())
    flags = [_flag(k, v) for k, v in cfg.items() if k != "out" and k in default and v != default[k]]
    if folder is not None and not _is_shipped(folder):
        flags.append(f" --out {_shown(folder)}")
    return "gambit train target" + "".join(flags)


def _flag(name: str, value) -> str:
    """`` --name value``; a switch as its argparse form (``--spell-products``, ``--no-…``): the
    command said ``--spell-products True``, which the parser refuses."""
    flag = name.replace("_", "-")
    if isinstance(value, bool):
        return f" --{flag}" if value else f" --no-{flag}"
    return f" --{flag} {value}"


def _is_shipped(folder: Path) -> bool:
    return Path(folder).resolve() == TARGET.resolve()


def _shown(folder: Path) -> str:
    """The folder relative to the checkout where it lies inside it (cards are read from any clone)."""
    try:
        return str(folder.resolve().relative_to(REPO))
    except ValueError:
        return str(folder)


def _accuracy(folder: Path, result: dict | None) -> str:
    """The card's accuracy section: the table of ``eval_test.json``, or "not evaluated" without one."""
    model_flag = "" if _is_shipped(folder) else f" --model {_shown(folder)}"
    if result is None:
        return f"""## Accuracy

Not evaluated: the command ran with `--eval-samples 0` (or its evaluation did not finish). Measure it:
`gambit eval{model_flag} --split test --samples 16 --json results/eval_test.json`
"""
    ev, k = result["config"], result["samples"]
    return f"""## Accuracy (test split, {result['n_problems']} problems, T = {ev['temperature']}, \
{k} samples each)

Reproduce: `gambit eval{model_flag} --split test --samples {k} --json results/eval_test.json`

```
{format_table(result)}
```

pass@1 is the mean single-sample accuracy; maj@{k} the majority vote over the {k} samples; pass@{k}
whether any sample is right — the gap between maj@{k} and pass@{k} is the room a search has.
"""


NOTES = "card_notes.md"  # hand-written history kept at the card's end (a regenerated card keeps it)


def write_card(folder: str | Path) -> Path:
    """Write ``README.md`` in ``folder`` (``card_text``)."""
    path = Path(folder) / "README.md"
    path.write_text(card_text(folder))
    return path


def card_text(folder: str | Path) -> str:
    """The card rendered from ``training.json`` and, when there is one, ``eval_test.json`` in ``folder``
    (without it the card says the model was not evaluated), then ``card_notes.md`` where it exists."""
    folder = Path(folder)
    train = json.loads((folder / "training.json").read_text())
    evaluated = folder / "eval_test.json"
    result = json.loads(evaluated.read_text()) if evaluated.is_file() else None
    cfg = train["config"]
    size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    title = "Shipped target" if _is_shipped(folder) else "Target"
    also = "evaluates and writes" if cfg.get("eval_samples", 16) else "writes"
    text = f"""# {title}: {train['params'] / 1e6:.2f}M-parameter Llama-family model

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
{train['torch_threads']} CPU threads; final loss {train['final_loss']} nats/token (solution tokens; \
smoothed, an EMA 0.98 of the steps' losses) |
| environment | torch {train.get('torch_version', '?')}, {train['torch_threads']} CPU threads, \
CPU capability {train.get('cpu_capability', '?')} (floats, and so the loss history, depend on all three)\
{'; ' + ISA_NOTE[cfg['isa']] if cfg.get('isa') in ISA_NOTE else ''} |
| command | `{command_line(cfg, folder)}` (it also {also} this card) |

{_accuracy(folder, result)}"""
    notes = folder / NOTES
    return text + ("\n" + notes.read_text() if notes.is_file() else "")
