"""Paged attention over ragged batches, with per-sequence query masks (tree verification).

Each sequence brings ``q`` new tokens that see its ``ctx`` cached tokens plus, among themselves,
a causal mask or a caller-given ``[q, q]`` mask. New keys/values are first written to their cache
slots; then each group of sequences (single-token decode rows, multi-token rows) gathers its
blocks and runs one SDPA call. Metadata is built with tensor ops; Python loops over sequences
only to flatten their lists, and over tokens only for the KV slots of a kernel forward of at most
``SLOTS_LIST_MAX_TOKENS`` rows, where a list is cheaper than the tensor ops' fixed cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gambit.engine.cpu_attention import paged_attention, paged_decode
from gambit.engine.host_lists import long_tensor, padded_rows, to_device
from gambit.engine.kv_cache import KVCache

# up to this many new tokens in a forward the CPU kernel serves every row (plain decoding's rule, so
# its prefill floats stay those its cards and figures were made with: SDPA above)
KERNEL_MAX_TOKENS = 12
# Speculative forwards (draft trees in a verification forward, the drafter's context pass) take the
# kernel at any size: their rows run in its tiled order (16 rows a vector; cpu_attention.py), which
# reads the blocks in place, loads each cached key once for a chunk's rows, and beats SDPA over
# gathered blocks everywhere measured. One layer of the shipped target, 200 cached keys
# (tools/attention_rows_cost.py, 2-core AMD EPYC): 1 x 49 nodes 0.17 vs 0.34 ms (SDPA), 4 x 49 0.43 vs
# 0.91, 16 x 49 1.28 vs 2.66, 48 x 4 1.02 vs 2.35, 96 x 4 (150 keys) 1.53 vs 5.04, 48 x 9 1.02 vs 2.99.
# False: speculative forwards follow plain decoding's rule (SDPA above KERNEL_MAX_TOKENS), for tests
# and A/B measurements.
SPECULATIVE_ROWS_IN_KERNEL = True
# Up to this many rows in a kernel forward (draft trees, short chunks) the KV slots are a Python list,
# cheaper than the tensor ops' fixed cost; above it (a drafter's context pass over a prompt) tensor ops
# (2-core AMD EPYC, stop 68, list vs tensor: 512 rows 70 vs 169 us, 2,000 rows 201 vs 152 us,
# 8 x 2,000 rows 2.29 vs 0.81 ms)
SLOTS_LIST_MAX_TOKENS = 1024


@dataclass
class SeqInput:
    """What one trace brings to a forward."""

    tokens: list[int]
    positions: list[int]  # RoPE positions (tree nodes share depths, so not always consecutive)
    ctx: int  # cached tokens every new token sees
    block_table: list[int]
    mask: torch.Tensor | None = None  # [q, q] bool among the new tokens; None means causal

    @property
    def q(self) -> int:
        return len(self.tokens)


@dataclass
class Group:
    rows: torch.Tensor  # [B, Qmax] flat row of each query (padding → 0)
    valid: torch.Tensor  # [B, Qmax] bool
    flat_valid_rows: torch.Tensor  # rows[valid]
    blocks: torch.Tensor  # [B, nb] block ids (padding → 0)
    mask: torch.Tensor  # [B, 1, Qmax, nb * bs] bool


def _padded_tables(items: list[SeqInput], block_size: int) -> torch.Tensor:
    nb = max(-(-(it.ctx + it.q) // block_size) for it in items)
    return padded_rows([it.block_table for it in items], nb)


def _token_slots(tables: torch.Tensor, ctx: torch.Tensor, q_len: torch.Tensor, offsets: torch.Tensor,
                 block_size: int, device: torch.device) -> torch.Tensor:
    """The KV slot of every new token, flat in item order, with no Python step a token:
    ``table[item, pos // bs] * bs + pos % bs`` at ``pos = ctx + i`` (``offsets``: each item's first row)."""
    item = torch.repeat_interleave(torch.arange(len(q_len)), q_len)
    pos = torch.arange(item.numel()) - offsets[item] + ctx[item]
    return to_device(tables[item, pos // block_size] * block_size + pos % block_size, device)


def _group(items: list[SeqInput], offsets: torch.Tensor, tables: torch.Tensor, block_size: int,
           device: torch.device) -> Group:
    qmax = max(it.q for it in items)
    nb = max(-(-(it.ctx + it.q) // block_size) for it in items)
    q_len = torch.tensor([it.q for it in items])
    ctx = torch.tensor([it.ctx for it in items])
    ar = torch.arange(qmax)
    valid = ar[None, :] < q_len[:, None]
    rows = torch.where(valid, offsets[:, None] + ar[None, :], 0)
    keys = torch.arange(nb * block_size)
    mask = keys[None, None, :] <= (ctx[:, None, None] + ar[None, :, None])  # causal default
    for b, it in enumerate(items):
        if it.mask is not None:
            mask[b, : it.q, it.ctx: it.ctx + it.q] = it.mask.to(device="cpu", dtype=torch.bool)
    mask &= valid[:, :, None]
    mask[:, :, 0] |= ~valid  # padding queries see one key so SDPA yields no NaN
    return Group(to_device(rows, device), to_device(valid, device), to_device(rows[valid], device),
                 to_device(tables[:, :nb], device), to_device(mask[:, None], device))


def kernel_serves(items: list[SeqInput], speculative: bool = False) -> bool:
    """Whether the CPU kernel serves every row of a forward (else SDPA over gathered blocks serves
    its multi-token rows): a few rows in all, or speculative rows at any size (tree rows carry a
    mask; ``speculative`` marks the drafter's context pass, whose rows are causal). A plain prefill
    chunk above KERNEL_MAX_TOKENS sends the forward to SDPA, as before the multi-row kernel."""
    if sum(it.q for it in items) <= KERNEL_MAX_TOKENS:
        return True
    if not SPECULATIVE_ROWS_IN_KERNEL:
        return False
    return speculative or not any(it.q > 1 and it.mask is None for it in items)


class PagedAttention:
    """The ``attention`` function handed to the model for one forward over a ragged batch."""

    def __init__(self, cache: KVCache, items: list[SeqInput], device: torch.device,
                 use_kernel: bool = False, speculative: bool = False, invariant: bool = False) -> None:
        """``invariant`` (``EngineConfig.batch_invariant``, with ``use_kernel``): every row in the kernels'
        one-row order, trees and long prefill chunks too, so a row's floats never depend on the rows
        beside it, on how its prompt was chunked, or on whether it was verified in a tree."""
        self.cache = cache
        self.use_kernel = use_kernel
        bs = cache.block_size
        self.groups: list[Group] = []  # rows gathered into a padded batch for SDPA
        self.multi = None  # all rows through the CPU kernel: (tables, ctx, qoff, qlen, moff, mask)
        if use_kernel and all(it.q == 1 for it in items):  # the decode fast path: no masks, no groups
            ctx = [it.ctx for it in items]
            tables = _padded_tables(items, bs)
            slots = [it.block_table[c // bs] * bs + c % bs for it, c in zip(items, ctx, strict=True)]
            self.slots = long_tensor(slots, device)
            lens = long_tensor([c + 1 for c in ctx])
            self.decode = (None, tables, lens)  # rows None: every row of the batch
            self.all_decode = True
            self.num_tokens = len(items)
            return
        if use_kernel and (invariant or kernel_serves(items, speculative)):
            self._kernel_rows(items, device, speculative, invariant)
            return
        q_len = torch.tensor([it.q for it in items])
        offsets = torch.cumsum(q_len, 0) - q_len
        self.num_tokens = int(q_len.sum())
        tables = _padded_tables(items, bs)
        self.slots = _token_slots(tables, torch.tensor([it.ctx for it in items]), q_len, offsets, bs, device)
        is_decode = q_len == 1
        dec = is_decode.nonzero().flatten()
        multi = (~is_decode).nonzero().flatten()
        self.decode = None  # decode rows for the in-place CPU kernel: (rows, tables, lens)
        if len(dec) and use_kernel:
            lens = torch.tensor([it.ctx + 1 for it in items])[dec]
            self.decode = (to_device(offsets[dec], device), tables[dec].contiguous(), lens)
        for idx in ([] if self.decode else [dec]) + [multi]:
            if len(idx):
                ids = idx.tolist()
                self.groups.append(_group([items[i] for i in ids], offsets[idx], tables[idx], bs, device))
        self.all_decode = len(multi) == 0  # rows 0..N-1 are the sequences in order

    def _kernel_rows(self, items: list[SeqInput], device: torch.device, speculative: bool = False,
                     invariant: bool = False) -> None:
        """Every row through the CPU kernel (draft trees, short chunks, a drafter's context pass over a
        prompt): read the blocks in place, one call, no gathered copy and no padded mask. A causal
        sequence's ``moff`` is -1 (the one-row order: plain decoding's floats) or, in a speculative
        forward, -2 (the tiled order trees take); a tree's is the offset m of its mask rows (tiled
        order) or, ``invariant``, -3 - m (the one-row order)."""
        bs = self.cache.block_size
        qoff, moff, masks = [], [], []
        n = m = 0
        causal = -2 if speculative and not invariant else -1
        for it in items:
            qoff.append(n)
            n += it.q
            moff.append(causal if it.mask is None else -3 - m if invariant else m)
            if it.mask is not None:
                masks.append(it.mask.reshape(-1))
                m += it.q * it.q
        self.num_tokens = n
        tables, ctx, q_len = _padded_tables(items, bs), long_tensor([it.ctx for it in items]), \
            long_tensor([it.q for it in items])
        offsets = long_tensor(qoff)
        if n > SLOTS_LIST_MAX_TOKENS:  # a drafter's context pass over a prompt
            self.slots = _token_slots(tables, ctx, q_len, offsets, bs, device)
        else:  # a few tree rows: the list is cheaper than the tensor ops' fixed cost
            self.slots = long_tensor([it.block_table[p // bs] * bs + p % bs for it in items
                                      for p in range(it.ctx, it.ctx + it.q)], device)
        mask = torch.cat(masks).to(torch.bool) if masks else torch.zeros(1, dtype=torch.bool)
        self.multi = (tables, ctx, offsets, q_len, long_tensor(moff), mask.contiguous())
        self.decode, self.all_decode = None, False

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        kc, vc = self.cache.k[layer], self.cache.v[layer]  # [Hkv, blocks, bs, D]
        H, D = q.shape[2], q.shape[3]
        Hkv = k.shape[2]
        # a cache in another dtype (EngineConfig.kv_dtype): keys and values rounded as they are written
        kc.view(Hkv, -1, D).index_copy_(1, self.slots, k[0].transpose(0, 1).to(kc.dtype))
        vc.view(Hkv, -1, D).index_copy_(1, self.slots, v[0].transpose(0, 1).to(vc.dtype))
        qf = q[0]
        if self.multi is not None:
            return paged_attention(qf, kc, vc, *self.multi, D ** -0.5).unsqueeze(0)
        out = None
        if self.decode is not None:
            rows, tables, lens = self.decode
            if rows is None:
                return paged_decode(qf, kc, vc, tables, lens, D ** -0.5).unsqueeze(0)
            out = torch.empty_like(qf)
            out[rows] = paged_decode(qf[rows], kc, vc, tables, lens, D ** -0.5)
        if out is None and not self.all_decode:
            out = torch.empty_like(qf)
        for g in self.groups:
            B = g.blocks.shape[0]
            flat = g.blocks.flatten()  # whole blocks per head: [Hkv, B*nb, bs, D] → [B, Hkv, L, D]
            kg = kc.index_select(1, flat).view(Hkv, B, -1, D).transpose(0, 1).to(qf.dtype)
            vg = vc.index_select(1, flat).view(Hkv, B, -1, D).transpose(0, 1).to(qf.dtype)
            qg = (qf.view(B, 1, H, D) if self.all_decode else qf[g.rows]).transpose(1, 2)
            o = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=g.mask, enable_gqa=H != Hkv)
            o = o.transpose(1, 2)  # [B, Qmax, H, D]
            if self.all_decode:
                return o.reshape(1, B, H, D)
            out[g.flat_valid_rows] = o[g.valid]
        return out.unsqueeze(0)
