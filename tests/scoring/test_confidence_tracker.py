"""``ConfidenceTracker`` keeps one start position, not one per token, and answers as the per-token
positions did (the reference below is that tracker), for consecutive tokens, gaps, forks and boundaries
anywhere."""

from __future__ import annotations

import random
import tracemalloc
from bisect import bisect_right

from gambit.scoring.confidence import ConfidenceTracker, features


class PerTokenTracker:
    """The tracker as it was: a position per token, split by bisection."""

    def __init__(self, positions=None, logprobs=None, trace_min=0.0):
        self.positions = positions if positions is not None else []
        self.logprobs = logprobs if logprobs is not None else []
        self.trace_min = trace_min

    def token(self, position, logprob):
        if logprob is not None:
            self.positions.append(position)
            self.logprobs.append(logprob)

    def tokens(self, start, logprobs):
        self.positions.extend(range(start, start + len(logprobs)))
        self.logprobs.extend(logprobs)

    def boundary(self, position):
        n = bisect_right(self.positions, position)
        thought = min(self.logprobs[:n], default=0.0)
        del self.positions[:n], self.logprobs[:n]
        self.trace_min = min(self.trace_min, thought)
        return features(thought, self.trace_min)

    def fork(self):
        return PerTokenTracker(list(self.positions), list(self.logprobs), self.trace_min)


def _same(a: ConfidenceTracker, b: PerTokenTracker) -> None:
    assert a.positions == b.positions and a.logprobs == b.logprobs and a.trace_min == b.trace_min


def test_answers_as_the_per_token_tracker_on_random_traces():
    rng = random.Random(68)
    for _ in range(300):
        pairs = [(ConfidenceTracker(), PerTokenTracker())]
        pos = rng.randrange(0, 50)
        for _ in range(rng.randrange(1, 60)):
            a, b = rng.choice(pairs)
            op = rng.random()
            if op < 0.4:  # the search: a run of tokens read at a sync
                lps = [-rng.expovariate(1.0) * 5 for _ in range(rng.randrange(0, 6))]
                a.tokens(pos, lps), b.tokens(pos, lps)
                pos += len(lps)
            elif op < 0.65:  # rollouts: one token event (sometimes without a log-probability: a gap)
                lp = None if rng.random() < 0.1 else -rng.random() * 30
                a.token(pos, lp), b.token(pos, lp)
                pos += 1
            elif op < 0.9:  # a boundary before, inside or past the kept tokens
                at = pos + rng.randrange(-8, 3)
                assert a.boundary(at) == b.boundary(at)
            elif op < 0.95:
                pairs.append((a.fork(), b.fork()))
            else:  # ``gambit bench rounds``: forget the last tokens, as it does
                k = rng.randrange(0, 5)
                del a.positions[-k or len(a.logprobs):], a.logprobs[-k or len(a.logprobs):]
                del b.positions[-k or len(b.logprobs):], b.logprobs[-k or len(b.logprobs):]
            _same(a, b)
        for a, b in pairs:
            assert a.boundary(pos + 10) == b.boundary(pos + 10)
            _same(a, b)


def test_out_of_order_and_given_positions_answer_as_before():
    a, b = ConfidenceTracker([4, 5, 9], [-1.0, -2.0, -3.0]), PerTokenTracker([4, 5, 9], [-1.0, -2.0, -3.0])
    for t in (a, b):
        t.token(7, -0.5)  # before the last position: kept in arrival order, as before
    _same(a, b)
    assert a.boundary(8) == b.boundary(8) and a.boundary(9) == b.boundary(9)
    _same(a, b)


def test_consecutive_tokens_keep_no_position_per_token():
    """A trace of 200,000 tokens between boundaries held 200,000 int objects beside its log-probs."""
    lps = [-0.25] * 1000
    t = ConfidenceTracker()
    tracemalloc.start()
    try:
        for k in range(200):
            t.tokens(10 + 1000 * k, lps)
        size, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert size < 2_500_000  # the log-prob list's slots (8 B a token, ~1.7 MB), not ~7 MB with positions
    assert t.boundary(10 + 200_000 - 1) == [-0.25, -0.25] and not t.logprobs
