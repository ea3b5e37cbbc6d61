"""Plain decode steps over static buffers, replayed as CUDA graphs: one launch per step, not ~200.

On an H200 (stop 38) the shipped target's bf16 decode step was host-bound: ~200 kernel launches and
16 stream synchronisations a step, the GPU busy ~4% of the wall (``docs/notes/speculative.md``,
"Stop 38"). A decode step's shapes depend only on the batch size and the longest block table, so it
is captured once per (batch bucket, block bucket) over static buffers and replayed; the step's
metadata reaches the device in one copy. Padded rows write their K/V into a sink block that the
block manager never hands out, and attend to it alone.

``EngineConfig.decode_graphs``: "cuda" captures (CUDA only); "static" runs the same static-shape
step eagerly on any device, which is how the CPU tests check the padding, the sink and the buckets
against the engine's own path. "cuda" has not yet run on a GPU (the lease that found the problem
ended first): ``tools/gpu_run.sh`` checks it against eager decoding and times both.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gambit.engine.attention import SeqInput
from gambit.engine.kv_cache import KVCache


def bucket(n: int, cap: int) -> int:
    """The smallest power of two >= n, at most ``cap`` (n <= cap)."""
    b = 1
    while b < n:
        b *= 2
    return min(b, cap)


class StaticDecodeAttention:
    """Decode attention over static tensors: slots [B], tables [B, NB], lens [B] (keys each row sees).

    The same arithmetic as ``PagedAttention``'s all-decode group (gather whole blocks, one SDPA call
    with a key mask), over NB blocks per row instead of the batch's longest table."""

    def __init__(self, cache: KVCache, slots: torch.Tensor, tables: torch.Tensor, lens: torch.Tensor) -> None:
        self.cache, self.slots, self.tables, self.lens = cache, slots, tables, lens
        self.key_pos = torch.arange(tables.shape[1] * cache.block_size, device=tables.device)
        self.mask: torch.Tensor | None = None

    def prepare(self) -> None:
        """The key mask from ``lens``: inside the captured step, so each replay reads the new lens."""
        self.mask = (self.key_pos[None, :] < self.lens[:, None])[:, None, None, :]

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        kc, vc = self.cache.k[layer], self.cache.v[layer]  # [Hkv, blocks, bs, D]
        B, H, D, Hkv = q.shape[1], q.shape[2], q.shape[3], k.shape[2]
        kc.view(Hkv, -1, D).index_copy_(1, self.slots, k[0].transpose(0, 1).to(kc.dtype))
        vc.view(Hkv, -1, D).index_copy_(1, self.slots, v[0].transpose(0, 1).to(vc.dtype))
        flat = self.tables.flatten()  # [B, Hkv, NB * bs, D] in q's dtype (kv_dtype may differ)
        kg = kc.index_select(1, flat).view(Hkv, B, -1, D).transpose(0, 1).to(q.dtype)
        vg = vc.index_select(1, flat).view(Hkv, B, -1, D).transpose(0, 1).to(q.dtype)
        o = F.scaled_dot_product_attention(q[0].view(B, 1, H, D).transpose(1, 2), kg, vg,
                                           attn_mask=self.mask, enable_gqa=H != Hkv)
        return o.transpose(1, 2).reshape(1, B, H, D)


@dataclass
class _Step:
    """One (batch, blocks) shape: its static inputs (views of ``meta``), outputs, and graph."""

    meta: torch.Tensor  # [B * (4 + NB)] long on the device: tokens, positions, slots, lens, tables
    host: torch.Tensor  # the same layout on the host (pinned on CUDA): one asynchronous copy a step
    tokens: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    lens: torch.Tensor
    tables: torch.Tensor
    attn: StaticDecodeAttention
    logits: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    graph: object = None  # torch.cuda.CUDAGraph once captured


class DecodeGraphs:
    """Serves all-decode forwards of at most ``max_batch`` rows for a ``ModelRunner`` whose cache has
    one block more than its block manager (``sink``, the last)."""

    def __init__(self, model, cache: KVCache, max_batch: int, capture: bool) -> None:
        if capture and cache.k.device.type != "cuda":
            raise ValueError("decode_graphs='cuda' needs a CUDA device; 'static' runs anywhere")
        self.model, self.cache, self.capture = model, cache, capture
        self.max_batch = max_batch
        self.sink = cache.k.shape[2] - 1
        self.max_blocks = -(-model.config.max_position_embeddings // cache.block_size)
        self.device = cache.k.device
        self.steps: dict[tuple[int, int], _Step] = {}
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.replays = 0  # steps served (tests and stats)

    def serves(self, items: list[SeqInput], logit_rows, taps) -> bool:
        """Plain decoding: every item one causal token, logits at every row, no taps."""
        n = len(items)
        return (not taps and 0 < n <= self.max_batch and isinstance(logit_rows, list) and len(logit_rows) == n
                and all(it.q == 1 and it.mask is None for it in items) and logit_rows == list(range(n)))

    def run(self, items: list[SeqInput]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                  torch.Tensor]:
        """(logits [n, V] float, hidden [n, H], tokens, positions, slots): views valid until the next step."""
        n, bs = len(items), self.cache.block_size
        need = max(-(-(it.ctx + 1) // bs) for it in items)
        B, NB = bucket(n, self.max_batch), bucket(need, max(self.max_blocks, need))
        st = self.steps.get((B, NB)) or self._make(B, NB)
        pad, sink_slot = B - n, self.sink * bs
        host: list[int] = [it.tokens[0] for it in items] + [0] * pad
        host += [it.positions[0] for it in items] + [0] * pad
        host += [it.block_table[it.ctx // bs] * bs + it.ctx % bs for it in items] + [sink_slot] * pad
        host += [it.ctx + 1 for it in items] + [1] * pad
        for it in items:
            table = it.block_table[:NB]
            host += table + [self.sink] * (NB - len(table))
        host += [self.sink] * (NB * pad)
        st.host.copy_(torch.frombuffer(array("q", host), dtype=torch.long))  # packed in C (host_lists)
        st.meta.copy_(st.host, non_blocking=self.capture)  # the last step's copy ended: it sampled since
        if st.graph is not None:
            st.graph.replay()
        else:
            st.logits, st.hidden = self._forward(st)
        self.replays += 1
        return st.logits[:n], st.hidden[:n], st.tokens[:n], st.positions[:n], st.slots[:n]

    def _forward(self, st: _Step) -> tuple[torch.Tensor, torch.Tensor]:
        st.attn.prepare()
        hidden, _ = self.model(st.tokens[None], st.positions[None], attention=st.attn)
        hidden = hidden[0]
        return self.model.logits(hidden).float(), hidden

    def _make(self, B: int, NB: int) -> _Step:
        meta = torch.zeros(B * (4 + NB), dtype=torch.long, device=self.device)
        host = torch.zeros(meta.shape, dtype=torch.long, pin_memory=self.capture)
        tokens, positions, slots, lens, tables = meta.split([B, B, B, B, B * NB])
        slots.fill_(self.sink * self.cache.block_size)  # warm-up and capture write the sink only
        lens.fill_(1)
        tables.fill_(self.sink)
        tables = tables.view(B, NB)
        st = _Step(meta, host, tokens, positions, slots, lens, tables,
                   StaticDecodeAttention(self.cache, slots, tables, lens))
        if self.capture:
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for _ in range(2):  # kernel selection and allocations outside the graph
                    self._forward(st)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            st.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(st.graph, pool=self.pool):
                st.logits, st.hidden = self._forward(st)
        self.steps[(B, NB)] = st
        return st
