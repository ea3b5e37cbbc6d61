"""A node's JSON text for the store, built from cached fragments: only what changed is encoded.

A node's ``tokens`` and ``scores`` only grow (a child starts with a copy of its parent's), so each
keeps the JSON text of its list and, on the next write, encodes just the new tail and splices it
in. The rest of the record (a dozen scalars) is encoded whole. ``json.loads`` of the text equals
``node.to_dict()``; re-encoding ~100 token ids for every written node was most of a store write.
"""

from __future__ import annotations

import json

from gambit.search.tree import Node


class ListJSON:
    """The JSON text of an append-only list, extended by its new tail only."""

    __slots__ = ("n", "text")

    def __init__(self, n: int = 0, text: str = "[]") -> None:
        self.n, self.text = n, text

    def of(self, xs: list) -> str:
        n = len(xs)
        if n < self.n:  # not append-only after all (cannot happen in a run): start again
            self.n, self.text = 0, "[]"
        if n > self.n:
            tail = json.dumps(xs[self.n:])
            self.text = tail if self.n == 0 else f"{self.text[:-1]}, {tail[1:]}"
            self.n = n
        return self.text

    def copy(self) -> ListJSON:
        return ListJSON(self.n, self.text)


class NodeJSON:
    """Per node: its tokens' and scores' cached JSON; ``encode`` gives the whole record's text."""

    __slots__ = ("tokens", "scores")

    def __init__(self, tokens: ListJSON | None = None, scores: ListJSON | None = None) -> None:
        self.tokens, self.scores = tokens or ListJSON(), scores or ListJSON()

    def fork(self) -> NodeJSON:
        """A child's cache: its lists start as copies of the parent's at the branch point."""
        return NodeJSON(self.tokens.copy(), self.scores.copy())

    def encode(self, node: Node) -> str:
        head = dict(node.__dict__)
        del head["tokens"], head["scores"]
        return (f"{json.dumps(head)[:-1]}, \"tokens\": {self.tokens.of(node.tokens)}, "
                f"\"scores\": {self.scores.of(node.scores)}}}")
