"""Runs the model over a ragged batch of traces through their block tables."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gambit.engine import cpu_attention, cpu_decoder
from gambit.engine.attention import PagedAttention, SeqInput
from gambit.engine.decode_graphs import DecodeGraphs
from gambit.engine.host_lists import long_tensor
from gambit.engine.kv_cache import KVCache
from gambit.model.llama import CausalLM


@dataclass
class RunnerOutput:
    logits: torch.Tensor  # [len(logit_rows), V]
    hidden: torch.Tensor  # [N, H] post-final-norm hidden state of every fed token
    taps: dict[int, torch.Tensor]  # layer → [N, H] hidden state entering that layer
    tokens: torch.Tensor  # [N] the fed tokens (flat)
    positions: torch.Tensor  # [N]
    slots: torch.Tensor  # [N] the KV slot each fed token was written to (long, on the device)


class ModelRunner:
    def __init__(self, model: CausalLM, num_blocks: int, block_size: int, device: torch.device,
                 dtype: torch.dtype, cpu_kernel: bool = True, cpp_layers: bool = True,
                 decode_graphs: str = "off", graph_max_batch: int = 256,
                 kv_dtype: torch.dtype | None = None, batch_invariant: bool = False) -> None:
        self.model = model
        self.batch_invariant = batch_invariant  # every forward's rows in the one-row order (PagedAttention)
        self.cpp_layers = cpp_layers  # kernel-served forwards run the layer loop in C++ (cpu_decoder)
        self._weights: tuple | None = None  # (fast-path signature, cpu_decoder.layer_weights)
        self.device = device
        kv_dtype = kv_dtype or dtype  # the cache's elements (EngineConfig.kv_dtype)
        # attention straight from the blocks: CPU, a float32 model and a float32 or bfloat16 cache, when the
        # kernel compiles
        self.use_kernel = (cpu_kernel and device.type == "cpu" and dtype == torch.float32
                           and kv_dtype in (torch.float32, torch.bfloat16)
                           and cpu_attention.kernel() is not None)
        # decode graphs: one block more than the block manager has, the sink padded rows write to
        self.cache = KVCache(model.config, num_blocks + (decode_graphs != "off"), block_size, kv_dtype,
                             device)
        self.graphs = (DecodeGraphs(model, self.cache, graph_max_batch, capture=decode_graphs == "cuda")
                       if decode_graphs != "off" else None)
        if device.type == "cpu" and cpu_kernel:  # any dtype: the slot copy moves bytes (None: not built)
            self.cache.kernel = cpu_attention.kernel()

    def _layer_weights(self) -> cpu_decoder.LayerWeights | None:
        """``cpu_decoder.layer_weights``, rebuilt only when the model's fast paths changed."""
        sig, cached = cpu_decoder.signature(self.model), self._weights
        if cached is None or cached[0] != sig or (cached[1] is not None and cached[1].stale()):
            self._weights = (sig, cpu_decoder.layer_weights(self.model))
        return self._weights[1]

    @torch.inference_mode()
    def forward(self, items: list[SeqInput], logit_rows: Sequence[int] | torch.Tensor,
                taps: Sequence[int] = ()) -> RunnerOutput:
        """Write every item's new tokens into the cache and return logits at ``logit_rows``.

        ``logit_rows`` index the flat concatenation of all items' new tokens.
        """
        if self.graphs is not None and self.graphs.serves(items, logit_rows, taps):
            logits, hidden, tokens, positions, slots = self.graphs.run(items)
            return RunnerOutput(logits, hidden, {}, tokens, positions, slots)
        tokens = long_tensor([t for it in items for t in it.tokens], self.device)
        positions = long_tensor([p for it in items for p in it.positions], self.device)
        attn = PagedAttention(self.cache, items, self.device, self.use_kernel,
                              invariant=self.batch_invariant and self.use_kernel)
        weights = self._layer_weights() if self.use_kernel and self.cpp_layers else None
        if weights is not None and cpu_decoder.serves(attn):  # the same floats, the loop in C++
            hidden, tapped = cpu_decoder.forward(self.model, weights, tokens[None], positions[None], attn,
                                                 taps)
        else:
            hidden, tapped = self.model(tokens[None], positions[None], attention=attn, taps=taps)
        hidden = hidden[0]
        n = hidden.shape[0]
        if isinstance(logit_rows, list) and len(logit_rows) == n and logit_rows == list(range(n)):
            picked = hidden  # every row (plain decoding): no index
        else:
            picked = hidden[torch.as_tensor(logit_rows, dtype=torch.long, device=self.device)]
        logits = self.model.logits(picked).float()
        return RunnerOutput(logits, hidden, {k: v[0] for k, v in tapped.items()}, tokens, positions,
                            attn.slots)
