"""The paged KV tensors: ``[layers, kv_heads, blocks, block_size, head_dim]`` for keys and values.

Heads lead the block axis so that gathering a batch's blocks along dim 2 yields, per head, each
sequence's keys as one contiguous ``[tokens, head_dim]`` matrix — what attention matmuls want.
"""

from __future__ import annotations

import torch

from gambit.model.config import ModelConfig

# A fork's partial-block copy in one C++ call (built with the other CPU kernels, ``cpu_attention``):
# ``[L, Hkv]`` contiguous runs of ``slots x head_dim`` elements per tensor, memcpy'd. Through numpy
# views it was ~25 us a fork (two 4-D strided assignments), most of a round's fork on the shipped
# target; this is ~2 us.
SOURCE = r"""
void kv_copy_slots(at::Tensor k, at::Tensor v, int64_t src, int64_t dst, int64_t slots) {
  TORCH_CHECK(k.device().is_cpu() && v.device().is_cpu() && k.is_contiguous() && v.is_contiguous() &&
              k.dim() == 5 && k.sizes() == v.sizes() && k.scalar_type() == v.scalar_type(),
              "kv_copy_slots: k and v must be same-shaped contiguous CPU tensors [L, Hkv, NB, bs, D]");
  const int64_t lh = k.size(0) * k.size(1), nb = k.size(2), bs = k.size(3), d = k.size(4);
  TORCH_CHECK(src >= 0 && src < nb && dst >= 0 && dst < nb && src != dst, "kv_copy_slots: bad blocks ",
              src, " -> ", dst, " of ", nb);
  TORCH_CHECK(slots >= 1 && slots <= bs, "kv_copy_slots: slots must be in [1, ", bs, "], got ", slots);
  const int64_t es = k.element_size(), block = bs * d * es, bytes = slots * d * es;
  for (char* base : {static_cast<char*>(k.data_ptr()), static_cast<char*>(v.data_ptr())}) {
    for (int64_t i = 0; i < lh; ++i) {
      char* head = base + i * nb * block;
      std::memcpy(head + dst * block, head + src * block, bytes);
    }
  }
}
"""


def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block takes across all layers, keys and values."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * block_size * config.num_key_value_heads * config.head_dim * elem


EAGLE_TAPS = 3  # target layers an EAGLE-3 drafter reads: the tap buffer holds this many hidden states


def spec_tap_bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block's slots take in speculative decoding's tap buffer (raw target taps by slot)."""
    elem = torch.empty((), dtype=dtype).element_size()
    return block_size * EAGLE_TAPS * config.hidden_size * elem


class KVCache:
    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        shape = (config.num_hidden_layers, config.num_key_value_heads, num_blocks, block_size,
                 config.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.block_size = block_size
        self._bits: tuple | None = None  # numpy views of the CPU tensors' bits (``copy_blocks``)
        self.kernel = None  # the compiled kernels (``cpu_attention.kernel()``), set by the model runner

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
        n = slots or self.block_size
        if self.kernel is not None:  # memcpy per (layer, head): any number of pairs
            for s, d in pairs:
                self.kernel.kv_copy_slots(self.k, self.v, s, d, n)
            return
        if len(pairs) <= 8:  # a round's few forks: plain views + copy, ~3x cheaper than a gather
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
