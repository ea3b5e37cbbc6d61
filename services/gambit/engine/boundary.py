"""Which generated tokens close a thought (the ``\\n\\n`` boundary), from token ids alone.

A boundary is a token at which the decoded text gains a ``"\\n\\n"``: the token's own text contains
it (STEP's rule; the only case with our character tokenizer, where ``\\n\\n`` is one token), or the
previous token's text ends with exactly one ``"\\n"`` and this one's starts with ``"\\n"`` (so
``"\\n\\n"`` then ``"\\n"`` is one boundary, not two). The second case is
common with byte-level BPE: GPT-2's pre-tokenizer splits ``"\\n\\nWord"`` into ``"\\n"``, ``"\\n"``,
so SmolLM2 writes most paragraph breaks as two tokens. Lookup tables over the vocabulary make the
check one gather per fed token.
"""

from __future__ import annotations

import torch

from gambit.model.tokenizer import Tokenizer


class BoundaryDetector:
    def __init__(self, tokenizer: Tokenizer, vocab_size: int, device: torch.device) -> None:
        self.inside = tokenizer.boundary_ids  # text contains "\n\n"
        self.ends = tokenizer.newline_end_ids  # text ends with one "\n" (not two)
        self.starts = tokenizer.newline_start_ids  # text starts with "\n"
        n = max(vocab_size, tokenizer.vocab_size) + 1  # the last entry stands for "no token" (-1)

        def table(ids: frozenset[int]) -> torch.Tensor:
            t = torch.zeros(n, dtype=torch.bool)
            t[sorted(ids)] = True
            return t.to(device)

        self._inside, self._ends, self._starts = table(self.inside), table(self.ends), table(self.starts)
        self.enabled = bool(self.inside or (self.ends and self.starts))
        self.closers = frozenset(self.inside) | frozenset(self.starts)  # a token that can close one

    def closes(self, prev: int | None, tok: int) -> bool:
        """Does ``tok`` (after ``prev``; None at position 0) close a thought?"""
        return tok in self.inside or (prev is not None and prev in self.ends and tok in self.starts)

    def mask(self, tokens: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """Bool per token; ``prev`` holds each token's predecessor, -1 where there is none."""
        return self._inside[tokens] | (self._ends[prev] & self._starts[tokens])
