"""Scores from an async scorer are settled per run: a round waits only for calls holding its boundaries."""

import threading
from concurrent.futures import Future
from types import SimpleNamespace

from gambit.search.config import SearchConfig
from gambit.search.driver import SearchDriver


class Run:
    def __init__(self, run_id):
        self.run_id, self.got = run_id, []

    def on_scores(self, node, scores):
        self.got.append((node, scores[0]))


def done(*xs):
    f = Future()
    f.set_result(SimpleNamespace(tolist=lambda: list(xs)))
    return f


def test_settle_applies_in_order_up_to_the_last_call_of_a_due_run_and_leaves_the_rest():
    a, b = Run("a"), Run("b")
    d = SearchDriver.__new__(SearchDriver)
    late = Future()  # still in flight: must not be waited for
    d.pending = [([(b, 1)], done(0.1)), ([(a, 2), (b, 3)], done(0.2, 0.3)), ([(b, 4)], late)]
    t = threading.Thread(target=lambda: d._settle({"a"}))
    t.start()
    t.join(2)
    assert not t.is_alive()
    assert a.got == [(2, 0.2)] and b.got == [(1, 0.1), (3, 0.3)]
    assert len(d.pending) == 1 and d.pending[0][1] is late
    assert d._settle({"a"}) < 0.01 and len(d.pending) == 1  # nothing of a's left: no wait
    late.set_result(SimpleNamespace(tolist=lambda: [0.4]))
    d._settle()
    assert b.got[-1] == (4, 0.4) and not d.pending


class AsyncStandIn:
    """The stand-in scorer answered from another thread, like ``RemoteScorer.score_async``."""

    def __init__(self, inner):
        self.inner, self.kind, self.hidden_size = inner, inner.kind, inner.hidden_size

    def score_async(self, keys, states):
        fut = Future()
        threading.Timer(0.002, lambda: fut.set_result(self.inner.score(keys, states))).start()
        return fut

    def fork(self, p, c):
        self.inner.fork(p, c)

    def drop(self, k):
        self.inner.drop(k)


def test_runs_with_rounds_on_different_steps_end_as_with_a_synchronous_scorer(make_engine, scorer,
                                                                             hard_problems):
    from gambit.search.standin import StandInScorer

    def go(sc):
        drv = SearchDriver(make_engine(), sc)
        ids = [drv.submit(hard_problems[0], SearchConfig(capacity=4, swap=1, interval=6, warmup=4,
                                                         max_tokens=60, seed=1), run_id="x")]
        for _ in range(3):  # the second run's rounds fall 3 steps after the first's
            drv.step()
        ids.append(drv.submit(hard_problems[1], SearchConfig(capacity=4, swap=1, interval=6, warmup=4,
                                                             max_tokens=60, seed=2), run_id="y"))
        res = drv.run_until_done(ids)
        return {r: (res[r].answer, res[r].tokens, [t.get("score") for t in res[r].traces]) for r in ids}

    sync = go(scorer)
    other = StandInScorer(scorer.hidden_size, seed=1)
    assert go(AsyncStandIn(other)) == sync
