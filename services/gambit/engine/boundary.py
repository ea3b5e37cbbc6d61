"""Which generated tokens close a thought (the ``\\n\\n`` boundary), from token ids alone.

A boundary is a token at which the decoded text gains a ``"\\n\\n"``: the token's own text contains
it (STEP's rule; the only case with our character tokenizer, where ``\\n\\n`` is one token), or the
previous token's text ends with exactly one ``"\\n"`` and this one's starts with ``"\\n"`` (so
``"\\n\\n"`` then ``"\\n"`` is one boundary, not two). The second case is
common with byte-level BPE: GPT-2's pre-tokenizer splits ``"\\n\\nWord"`` into ``"\\n"``, ``"\\n"``,
so SmolLM2 writes most paragraph breaks as two tokens. Lookup tables over the vocabulary make the
check one gather per fed token; a plain decode step (one fed token per trace, its last) checks the
traces' last tokens against a set instead (``decode_events``, chosen by ``events``). The engine gets its
``BoundaryEvent`` lists here.
"""

from __future__ import annotations

import torch

from gambit.engine.events import BoundaryEvent, Event
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
        self.device = device
        self.closers = frozenset(self.inside) | frozenset(self.starts)  # a token that can close one

    def closes(self, prev: int | None, tok: int) -> bool:
        """Does ``tok`` (after ``prev``; None at position 0) close a thought?"""
        return tok in self.inside or (prev is not None and prev in self.ends and tok in self.starts)

    def mask(self, tokens: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """Bool per token; ``prev`` holds each token's predecessor, -1 where there is none."""
        return self._inside[tokens] | (self._ends[prev] & self._starts[tokens])

    # -- the engine's boundary events (``BoundaryEvent``: a closing token's hidden state) ------
    def any_closes(self, traces) -> bool:
        """Whether some trace's last token closes a boundary (only a trace's last token can be new, see
        ``events``): when none does, the tensor work is skipped."""
        return any(self.closes(t.token_ids[-2] if len(t.token_ids) > 1 else None, t.token_ids[-1])
                   for t in traces)

    def events(self, traces, num_new, tokens, positions, hidden, ends=None) -> list[Event]:
        """A ``BoundaryEvent`` per fed token that closes a thought: ``tokens``/``positions``/``hidden``
        are the forward's flat rows, ``num_new[i]`` of them for ``traces[i]``, ending at ``ends[i]``
        (default ``num_cached``, after it grew by them; a tree root is fed but not yet counted)."""
        if not self.enabled:
            return []
        if ends is None:
            ends = [t.num_cached for t in traces]
        if all(n == 1 and e == len(t.token_ids) for t, n, e in zip(traces, num_new, ends, strict=True)):
            return self.decode_events(traces, hidden)  # a plain decode step (or tree roots)
        return self.tensor_events(traces, num_new, tokens, positions, hidden, ends)

    def tensor_events(self, traces, num_new, tokens, positions, hidden, ends=None) -> list[Event]:
        """``events`` for any batch (prefill, chunks, re-prefill, tree roots), with index tensors."""
        if not self.any_closes(traces):
            return []
        if ends is None:
            ends = [t.num_cached for t in traces]
        # a fed token is new unless it was fed before (re-prefill after preemption or a waiting
        # fork): only the last token of a trace and generated tokens count, never history twice
        first_new = torch.repeat_interleave(
            torch.tensor([max(t.prompt_len, len(t.token_ids) - 1) for t in traces], device=self.device),
            torch.tensor(num_new, device=self.device))
        prev = torch.tensor([x for t, n, e in zip(traces, num_new, ends, strict=True) for x in
                             ([t.token_ids[e - n - 1]] if e > n else [-1]) + t.token_ids[e - n:e - 1]],
                            device=self.device)
        hit = self.mask(tokens, prev) & (positions >= first_new)
        rows = hit.nonzero().flatten().tolist()
        if not rows:
            return []
        owner = torch.repeat_interleave(torch.arange(len(traces)), torch.tensor(num_new)).tolist()
        states = hidden[rows].float().cpu()
        pos = positions[rows].tolist()
        return [BoundaryEvent(traces[owner[r]].id, pos[i], states[i]) for i, r in enumerate(rows)]

    def decode_events(self, traces, hidden) -> list[Event]:
        """``events`` when every trace was fed one token, its last (a decode step, or a tree's root,
        whose ``num_cached`` is not yet advanced: so the length, not ``num_cached``, says where): one
        pass over the traces, without the general path's index tensors (~200 us a step at 96 traces,
        where ~7 close a thought). The same rows: a fed token counts once generated."""
        closers, closes = self.closers, self.closes
        rows = []
        for i, t in enumerate(traces):
            ids = t.token_ids
            n = len(ids)
            if ids[n - 1] in closers and n - 1 >= t.prompt_len and closes(ids[n - 2] if n > 1 else None,
                                                                          ids[n - 1]):
                rows.append(i)
        if not rows:
            return []
        states = hidden[rows].float().cpu()
        return [BoundaryEvent(traces[r].id, len(traces[r].token_ids) - 1, states[i])
                for i, r in enumerate(rows)]

    def tree_events(self, batch, offsets, tree_rows, trees, out) -> list[Event]:
        """Boundary states of the plain rows and of each tree's root (tree nodes: once accepted)."""
        if not self.enabled:  # nothing to gather
            return []
        plain = [(t, n, off) for t, n, off in zip(batch.traces, batch.num_new, offsets, strict=True)
                 if t.id not in trees]
        keep = [r for _, n, off in plain for r in range(off, off + n)] + [rows[0] for rows in tree_rows]
        traces = [t for t, _, _ in plain] + [t for t in batch.traces if t.id in trees]
        if not self.any_closes(traces):  # the common case: no tensor work at all
            return []
        num_new = [n for _, n, _ in plain] + [1] * len(tree_rows)
        # a root is its trace's last token, fed, but num_cached counts it only at verification: its fed
        # end is the length, so it pairs with its real predecessor ("\n" then a "\n" root closes a thought)
        ends = [t.num_cached for t, _, _ in plain] + [len(t.token_ids) for t in traces[len(plain):]]
        keep_t = torch.tensor(keep, device=self.device)
        return self.events(traces, num_new, out.tokens[keep_t], out.positions[keep_t], out.hidden[keep_t],
                           ends)
