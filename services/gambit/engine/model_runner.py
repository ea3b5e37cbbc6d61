"""Runs the model over a ragged batch of traces through their block tables."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gambit.engine import cpu_attention
from gambit.engine.attention import PagedAttention, SeqInput
from gambit.engine.kv_cache import KVCache
from gambit.model.llama import CausalLM


@dataclass
class RunnerOutput:
    logits: torch.Tensor  # [len(logit_rows), V]
    hidden: torch.Tensor  # [N, H] post-final-norm hidden state of every fed token
    taps: dict[int, torch.Tensor]  # layer → [N, H] hidden state entering that layer
    tokens: torch.Tensor  # [N] the fed tokens (flat)
    positions: torch.Tensor  # [N]


class ModelRunner:
    def __init__(self, model: CausalLM, num_blocks: int, block_size: int, device: torch.device,
                 dtype: torch.dtype, cpu_kernel: bool = True) -> None:
        self.model = model
        self.device = device
        # decode attention straight from the blocks: CPU + float32 only, when the kernel compiles
        self.use_kernel = (cpu_kernel and device.type == "cpu" and dtype == torch.float32
                           and cpu_attention.kernel() is not None)
        self.cache = KVCache(model.config, num_blocks, block_size, dtype, device)

    @torch.inference_mode()
    def forward(self, items: list[SeqInput], logit_rows: Sequence[int] | torch.Tensor,
                taps: Sequence[int] = ()) -> RunnerOutput:
        """Write every item's new tokens into the cache and return logits at ``logit_rows``.

        ``logit_rows`` index the flat concatenation of all items' new tokens.
        """
        tokens = torch.tensor([t for it in items for t in it.tokens], dtype=torch.long, device=self.device)
        positions = torch.tensor([p for it in items for p in it.positions], dtype=torch.long,
                                 device=self.device)
        attn = PagedAttention(self.cache, items, self.device, self.use_kernel)
        hidden, tapped = self.model(tokens[None], positions[None], attention=attn, taps=taps)
        hidden = hidden[0]
        rows = torch.as_tensor(logit_rows, dtype=torch.long, device=self.device)
        logits = self.model.logits(hidden[rows]).float()
        return RunnerOutput(logits, hidden, {k: v[0] for k, v in tapped.items()}, tokens, positions)
