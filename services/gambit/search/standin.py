"""A stand-in boundary scorer with the ``BoundaryScorer`` interface (CONTRACTS.md §4).

Randomly initialised STEP-shaped MLP, used when no trained scorer is given (tests, or before the
shipped scorers exist). It carries no signal about correctness; it only exercises the plumbing.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

import torch

from gambit.serving.limits import MAX_KEYS


class StandInScorer:
    kind = "mlp"

    def __init__(self, hidden_size: int, seed: int = 0, max_keys: int = MAX_KEYS) -> None:
        """``max_keys``: keys remembered, the least recently used forgotten beyond it (``evicted`` counts
        them), as ``BoundaryScorer`` does: a set of every key ever scored grew for a server's life."""
        if isinstance(max_keys, bool) or not isinstance(max_keys, int) or max_keys < 1:
            raise ValueError(f"max_keys must be an int >= 1 (keys remembered), got {max_keys!r}")
        g = torch.Generator().manual_seed(seed)
        self.hidden_size = hidden_size
        self.w1 = torch.randn(hidden_size, 512, generator=g) / hidden_size ** 0.5
        self.b1 = torch.zeros(512)
        self.w2 = torch.randn(512, 1, generator=g) / 512 ** 0.5
        self.keys: OrderedDict[Hashable, None] = OrderedDict()  # least recently used first
        self.max_keys = max_keys
        self.evicted = 0

    def score(self, keys: Sequence[Hashable], states: torch.Tensor) -> torch.Tensor:
        if not isinstance(states, torch.Tensor) or states.dim() != 2 or states.shape[1] != self.hidden_size:
            raise ValueError(f"states must be a [N, {self.hidden_size}] tensor, got "
                             f"{getattr(states, 'shape', type(states))}")
        if not states.dtype.is_floating_point:
            raise ValueError(f"states must be floating point, got {states.dtype}")
        if len(keys) != states.shape[0]:
            raise ValueError(f"{len(keys)} keys for {states.shape[0]} states")
        self._touch(keys)
        # in float64, rounded to float32 at the end: a GEMM's rounding depends on the batch's size (and
        # deferred scoring batches differently), by ~1e-16 here, far below what float32 keeps, so a
        # row's score is the same alone or in any batch
        h = torch.relu(states.double() @ self.w1.double() + self.b1.double())
        return torch.sigmoid(h @ self.w2.double()).flatten().float()

    def _touch(self, keys) -> None:
        for k in keys:  # per key, not per token: a round's boundaries
            self.keys[k] = None
            self.keys.move_to_end(k)
        while len(self.keys) > self.max_keys:
            self.keys.popitem(last=False)
            self.evicted += 1

    def fork(self, parent_key: Hashable, child_key: Hashable) -> None:
        self._touch((child_key,))

    def drop(self, key: Hashable) -> None:
        self.keys.pop(key, None)
