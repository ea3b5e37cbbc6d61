"""The paged KV tensors: ``[layers, kv_heads, blocks, block_size, head_dim]`` for keys and values.

Heads lead the block axis so that gathering a batch's blocks along dim 2 yields, per head, each
sequence's keys as one contiguous ``[tokens, head_dim]`` matrix — what attention matmuls want.
"""

from __future__ import annotations

import torch

from gambit.model.config import ModelConfig


def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block takes across all layers, keys and values."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * block_size * config.num_key_value_heads * config.head_dim * elem


class KVCache:
    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        shape = (config.num_hidden_layers, config.num_key_value_heads, num_blocks, block_size,
                 config.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.block_size = block_size

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole blocks src → dst in every layer (the partial last block of a fork)."""
        if not pairs:
            return
        if len(pairs) <= 8:  # a round's few forks: plain views + copy_, ~3x cheaper than a gather
            for s, d in pairs:
                self.k[:, :, d].copy_(self.k[:, :, s])
                self.v[:, :, d].copy_(self.v[:, :, s])
            return
        src = torch.tensor([p[0] for p in pairs], device=self.k.device)
        dst = torch.tensor([p[1] for p in pairs], device=self.k.device)
        self.k[:, :, dst] = self.k[:, :, src]
        self.v[:, :, dst] = self.v[:, :, src]

    def move_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy single token slots (keeping the accepted path of a verified draft tree)."""
        L, Hkv, _, _, D = self.k.shape
        k = self.k.view(L, Hkv, -1, D)
        v = self.v.view(L, Hkv, -1, D)
        k[:, :, dst] = k[:, :, src]
        v[:, :, dst] = v[:, :, src]
