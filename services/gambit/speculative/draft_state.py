"""Per-trace drafting state and the index helpers over its unread span.

``DraftState`` marks the positions a trace's drafter has not read yet (``drafter_len .. num_cached - 1``):
the verified path's fused features, kept here, then raw target taps in the decoder's tap buffer. ``Plan``
is one cycle's trees for a group of traces sharing a drafter. The span helpers turn each trace's unread
span into positions and KV slots with tensor ops (``drafting`` feeds them to the context pass).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gambit.engine.attention import SeqInput
from gambit.engine.host_lists import long_tensor, padded_rows, to_device
from gambit.engine.sequence import Trace
from gambit.speculative.tree import DraftTree


@dataclass
class DraftState:
    key: str  # which drafter
    drafter_len: int = 0  # drafter rows in its KV cache (row j: feature j, token j + 1)
    feats: list[torch.Tensor] = field(default_factory=list)  # [n, H] chunks, positions drafter_len..
    cycles: int = 0
    emitted: int = 0
    nfeat: int = 0  # rows of ``feats``: positions drafter_len .. drafter_len + nfeat - 1

    def set_feats(self, feats: list[torch.Tensor]) -> None:
        self.feats, self.nfeat = feats, sum(f.shape[0] for f in feats)

    def raw(self, num_cached: int) -> int:
        """Unread positions past the verified features (the trace's last ones): raw taps in the
        decoder's tap buffer, written for every row the target was fed the plain way."""
        return num_cached - self.drafter_len - self.nfeat

    @property
    def tau(self) -> float:
        return self.emitted / self.cycles if self.cycles else 0.0

    def clone(self) -> DraftState:
        return DraftState(self.key, self.drafter_len, list(self.feats), 0, 0, self.nfeat)


@dataclass
class Plan:
    """One group of traces sharing a drafter: their trees and verification items."""

    key: str
    traces: list[Trace]
    tree: DraftTree
    items: list[SeqInput]
    first_row: list[int] = field(default_factory=list)  # flat row of each item's root (set by the engine)


# Spans of at least this many positions a trace (on average) get their positions from ``torch.arange``;
# shorter ones (a steady cycle's few accepted tokens) from Python ranges, which cost less than the ~2 µs
# of a tensor op (Stop 68's notes).
ARANGE_SPAN = 64


def span_positions(spans: list[tuple[int, int]], device: torch.device) -> torch.Tensor:
    """Positions a .. b - 1 of each (a, b), in order (long): tensor ops over long spans, ranges
    extended in C over short ones (no Python loop a position)."""
    if len(spans) == 1:
        return torch.arange(*spans[0], device=device)
    if sum(b - a for a, b in spans) < ARANGE_SPAN * len(spans):
        flat: list[int] = []
        for a, b in spans:
            flat += range(a, b)
        return long_tensor(flat, device)
    return torch.cat([torch.arange(a, b, device=device) for a, b in spans])


def span_slots(ts: list[Trace], block_size: int, device: torch.device) -> tuple[torch.Tensor, list[int]]:
    """The KV slots of each trace's positions drafter_len .. num_cached - 1, flat and in order, and each
    trace's end in them: per trace, its blocks' slot rows (an arange a block) cut to the span."""
    parts, ends = [], []
    offsets = torch.arange(block_size, device=device)
    for t in ts:
        a, b = t.draft.drafter_len, t.num_cached
        base = a // block_size * block_size  # the first block's first position
        blocks = long_tensor(t.block_table[base // block_size:-(-b // block_size)], device)
        parts.append((blocks[:, None] * block_size + offsets).flatten()[a - base:b - base])
        ends.append((ends[-1] if ends else 0) + b - a)
    return (parts[0] if len(parts) == 1 else torch.cat(parts)), ends


def context_tables(ts: list[Trace], block_size: int, device: torch.device) -> torch.Tensor:
    """[S, nb] block tables wide enough for the longest context (``num_cached``): each trace's cut or
    zero-padded to ``nb`` blocks. The tree steps gather the drafter's context dense from them; keys past a
    trace's ``num_cached`` (a shorter one's, or a tree's blocks) are masked there."""
    nb = max(-(-t.num_cached // block_size) for t in ts)
    return to_device(padded_rows([t.block_table for t in ts], nb), device)
