"""A node's JSON text for the store, built from cached fragments: only what changed is encoded.

A node's ``tokens`` and ``scores`` only grow (a child starts with a copy of its parent's), so each
keeps the JSON text of its list and, on the next write, encodes just the new tail and splices it
in. Of the dozen scalars, the five fixed at creation (id, parent, birth step and depth, temperature)
are encoded once; the rest by ``scalar``, which writes what ``json.dumps`` writes without its
per-call set-up (that set-up, not the bytes, was most of a small value's cost). ``json.loads`` of
the text equals ``node.to_dict()``.

An in-process store needs no text at write time: ``NodeSnapshot`` pins a node as it is (its lists
only grow, so their lengths pin them; the other changing fields are copied) and encodes only when
the store is read.
"""

from __future__ import annotations

import json
import math
from dataclasses import fields
from json.encoder import encode_basestring_ascii

from gambit.search.tree import Node

STATIC = ("id", "parent", "birth_step", "birth_depth", "temperature")  # fixed once the node exists
DYNAMIC = ("state", "answer", "end_step", "end_reason", "engine_id", "conf_min", "conf_mean", "evicted_step")
LISTS = ("tokens", "scores")
if set(STATIC + DYNAMIC + LISTS) != {f.name for f in fields(Node)}:  # a new field must be encoded too
    raise ImportError("node_json: Node's fields changed; update STATIC / DYNAMIC / LISTS")


def scalar(v) -> str:
    """``json.dumps(v)`` for one value, fast for None, int, finite float and str (the same text)."""
    if v is None:
        return "null"
    t = type(v)
    if t is int:
        return int.__repr__(v)
    if t is float and math.isfinite(v):
        return float.__repr__(v)
    if t is str:
        return encode_basestring_ascii(v)
    return json.dumps(v)


def items(xs: list) -> str:
    """The JSON text of a non-empty list without its brackets (ints and finite floats fast, the same
    text as ``json.dumps``, which writes a float by ``float.__repr__``)."""
    types = set(map(type, xs))
    if types == {int}:  # token ids (bools, a subclass, take json.dumps)
        return ", ".join(map(int.__repr__, xs))
    if types == {float} and all(map(math.isfinite, xs)):  # scores: NaN / inf take json.dumps
        return ", ".join(map(float.__repr__, xs))
    return json.dumps(xs)[1:-1]


def dynamic_values(node: Node) -> tuple:
    """The node's DYNAMIC fields, in order."""
    return (node.state, node.answer, node.end_step, node.end_reason, node.engine_id, node.conf_min,
            node.conf_mean, node.evicted_step)


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
            tail = items(xs[self.n:])
            self.text = f"[{tail}]" if self.n == 0 else f"{self.text[:-1]}, {tail}]"
            self.n = n
        return self.text

    def copy(self) -> ListJSON:
        return ListJSON(self.n, self.text)


class NodeJSON:
    """Per node: its fixed fields' and its lists' cached JSON; ``encode`` gives the record's text."""

    __slots__ = ("tokens", "scores", "head", "values", "rest")

    def __init__(self, tokens: ListJSON | None = None, scores: ListJSON | None = None) -> None:
        self.tokens, self.scores = tokens or ListJSON(), scores or ListJSON()
        self.head: str | None = None  # '{"id": 3, ..., "temperature": 0.8' once encoded
        self.values: tuple | None = None  # the DYNAMIC values ``rest`` was encoded from
        self.rest = ""

    def fork(self) -> NodeJSON:
        """A child's cache: its lists start as copies of the parent's at the branch point."""
        return NodeJSON(self.tokens.copy(), self.scores.copy())

    def encode(self, node: Node) -> str:
        if self.head is None:
            self.head = "{" + ", ".join([f'"{k}": {scalar(getattr(node, k))}' for k in STATIC])
        values = dynamic_values(node)
        if values != self.values:  # most writes of a running node change only its lists
            self.values = values
            self.rest = "".join([f', "{k}": {scalar(v)}' for k, v in zip(DYNAMIC, values, strict=True)])
        return (f"{self.head}{self.rest}, \"tokens\": {self.tokens.of(node.tokens)}, "
                f"\"scores\": {self.scores.of(node.scores)}}}")


class NodeSnapshot:
    """A node's record as of its write, encoded when first read (``MemoryStore``, whose rounds were
    paying for JSON nobody read: ~15% of the tournament's CPU on the shipped target). ``text`` is
    exactly what ``NodeJSON.encode`` gave at the write."""

    __slots__ = ("id", "node", "ntok", "nsc", "values", "_text")

    def __init__(self, node: Node) -> None:
        self.id, self.node = node.id, node
        self.ntok, self.nsc = len(node.tokens), len(node.scores)
        self.values = dynamic_values(node)
        self._text: str | None = None

    @property
    def text(self) -> str:
        if self._text is None:
            n = self.node
            fixed = {k: getattr(n, k) for k in STATIC}
            pinned = Node(**fixed, **dict(zip(DYNAMIC, self.values, strict=True)),
                          tokens=n.tokens[:self.ntok], scores=n.scores[:self.nsc])
            self._text = NodeJSON().encode(pinned)
        return self._text
