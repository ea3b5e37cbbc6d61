"""``BoundaryDetector``: a plain decode step's one-pass check (``decode_events``) gives the very events
of the general tensor path (``tensor_events``), on the shipped target's tokenizer, whose ``\\n\\n`` is one
token, and on a tokenizer-shaped stand-in where a boundary is ``"\\n"`` then ``"\\n"``."""

from __future__ import annotations

import random
from types import SimpleNamespace

import torch

from gambit.engine.boundary import BoundaryDetector
from gambit.model.loader import load_model
from gambit.paths import TARGET


def _traces(rng: random.Random, vocab: int, favoured: list[int], n: int) -> list[SimpleNamespace]:
    out = []
    for i in range(n):
        prompt = rng.randint(1, 6)
        length = rng.randint(1, 12)
        ids = [rng.choice(favoured) if rng.random() < 0.4 else rng.randrange(vocab) for _ in range(length)]
        out.append(SimpleNamespace(id=100 + i, token_ids=ids, num_cached=length,
                                   prompt_len=min(prompt, length)))
    return out


def _both(det: BoundaryDetector, traces, width: int = 8):
    hidden = torch.randn(len(traces), width)
    tokens = torch.tensor([t.token_ids[-1] for t in traces])
    positions = torch.tensor([t.num_cached - 1 for t in traces])
    general = det.tensor_events(traces, [1] * len(traces), tokens, positions, hidden)
    fast = det.decode_events(traces, hidden)
    return general, fast


def _same(a, b) -> bool:
    return len(a) == len(b) and all(x.trace_id == y.trace_id and x.position == y.position
                                    and torch.equal(x.hidden, y.hidden) for x, y in zip(a, b, strict=True))


def test_decode_events_equal_the_general_path_on_the_shipped_tokenizer():
    _, tok = load_model(str(TARGET), device="cpu", dtype="float32")
    det = BoundaryDetector(tok, tok.vocab_size, torch.device("cpu"))
    rng = random.Random(0)
    found = 0
    for _ in range(50):
        traces = _traces(rng, tok.vocab_size, sorted(det.closers | det.ends), 24)
        general, fast = _both(det, traces)
        assert _same(general, fast)
        found += len(fast)
    assert found > 20  # the check saw boundaries, not only empty lists


def test_decode_events_equal_the_general_path_for_two_token_boundaries():
    stub = SimpleNamespace(boundary_ids=frozenset({3}), newline_end_ids=frozenset({4, 5}),
                           newline_start_ids=frozenset({5, 6}), vocab_size=10)
    det = BoundaryDetector(stub, 10, torch.device("cpu"))
    rng = random.Random(1)
    found = 0
    for _ in range(50):
        traces = _traces(rng, 10, [3, 4, 5, 6], 24)
        general, fast = _both(det, traces)
        assert _same(general, fast)
        found += len(fast)
    assert found > 20


def _tree_step(det: BoundaryDetector, plain_new: int):
    """A step with two tree roots (fed, ``num_cached`` not yet counting them) and a plain trace fed
    ``plain_new`` tokens (1: the one-pass path; 2: the tensor path)."""
    a = SimpleNamespace(id=1, token_ids=[1, 2, 4, 6], num_cached=3, prompt_len=2)  # "\n" then root "\n"
    b = SimpleNamespace(id=2, token_ids=[1, 2, 4, 7, 6], num_cached=4, prompt_len=2)  # "\n", "x", root "\n"
    c = SimpleNamespace(id=3, token_ids=[1, 2, 4, 5], num_cached=4, prompt_len=2)  # plain, already counted
    rows = [c.token_ids[-plain_new:], [6, 9, 9], [6, 9]]
    tokens = torch.tensor(sum(rows, []))
    positions = torch.tensor(list(range(4 - plain_new, 4)) + [3, 4, 5] + [4, 5])
    out = SimpleNamespace(tokens=tokens, positions=positions, hidden=torch.randn(len(tokens), 8))
    batch = SimpleNamespace(traces=[a, c, b], num_new=[1, plain_new, 1])
    tree_rows = [[plain_new, plain_new + 1, plain_new + 2], [plain_new + 3, plain_new + 4]]
    ev = det.tree_events(batch, [-1, 0, -1], tree_rows, {1: None, 2: None}, out)
    return {(e.trace_id, e.position): e.hidden for e in ev}, out.hidden, plain_new


def test_tree_roots_pair_with_their_real_predecessor():
    """A root (token N) closes a thought after token N - 1 ending in one "\\n": it read token N - 2
    before, so ["\\n", "\\n"-root] gave no event and ["\\n", "x", "\\n"-root] a spurious one."""
    stub = SimpleNamespace(boundary_ids=frozenset({3}), newline_end_ids=frozenset({4, 5}),
                           newline_start_ids=frozenset({5, 6}), vocab_size=10)
    det = BoundaryDetector(stub, 10, torch.device("cpu"))
    for plain_new in (1, 2):
        got, hidden, k = _tree_step(det, plain_new)
        assert sorted(got) == [(1, 3), (3, 3)]
        assert torch.equal(got[(1, 3)], hidden[k]) and torch.equal(got[(3, 3)], hidden[k - 1])
