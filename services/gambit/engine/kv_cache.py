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
        self._bits: tuple | None = None  # numpy views of the CPU tensors' bits (``copy_blocks``)

    def copy_blocks(self, pairs: list[tuple[int, int]], slots: int | None = None) -> None:
        """Copy blocks src → dst in every layer (the partial last block of a fork).

        ``slots``: copy only the first ``slots`` token slots of each block (a fork's partial block
        holds that many cached tokens; the rest is unwritten, like any freshly taken block, and
        attention never reads it), on average half the bytes of a whole block.
        """
        if not pairs:
            return
        if slots is not None and not 0 < slots <= self.block_size:
            raise ValueError(f"slots must be in [1, {self.block_size}], got {slots}")
        if len(pairs) <= 8:  # a round's few forks: plain views + copy, ~3x cheaper than a gather
            n = slots or self.block_size
            bits = self.host_bits()
            for s, d in pairs:
                if bits is not None:  # numpy slicing: a quarter of torch's per-view cost, same bytes
                    for x in bits:
                        x[:, :, d, :n] = x[:, :, s, :n]
                else:
                    self.k[:, :, d, :n].copy_(self.k[:, :, s, :n])
                    self.v[:, :, d, :n].copy_(self.v[:, :, s, :n])
            return
        src = torch.tensor([p[0] for p in pairs], device=self.k.device)
        dst = torch.tensor([p[1] for p in pairs], device=self.k.device)
        self.k[:, :, dst] = self.k[:, :, src]
        self.v[:, :, dst] = self.v[:, :, src]

    def host_bits(self) -> tuple | None:
        """``(k, v)`` as numpy arrays over the same memory, as same-width integers (a bit copy, any
        dtype); None off the CPU. A fork copies a few token slots of one block: building the four
        strided torch views cost ~5x the copy itself."""
        if self._bits is None:
            ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
            it = ints.get(self.k.element_size())
            self._bits = () if self.k.device.type != "cpu" or it is None else \
                (self.k.view(it).numpy(), self.v.view(it).numpy())
        return self._bits or None

    def move_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy single token slots (keeping the accepted path of a verified draft tree)."""
        L, Hkv, _, _, D = self.k.shape
        k = self.k.view(L, Hkv, -1, D)
        v = self.v.view(L, Hkv, -1, D)
        k[:, :, dst] = k[:, :, src]
        v[:, :, dst] = v[:, :, src]
