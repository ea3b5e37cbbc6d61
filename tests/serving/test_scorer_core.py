"""ScorerCore's micro-batching answers each request as if served alone, in arrival order; drops-only
requests (N = 0); per-call metrics; a timeout that says so."""

from concurrent.futures import Future

import pytest
import torch

from gambit.scoring import random_scorer
from gambit.serving.metrics import BATCH_BUCKETS, Metrics, PrometheusBackend
from gambit.serving.payload import encode_states
from gambit.serving.protos import load
from gambit.serving.scorer_core import ScorerCore

H = 16
pb2, _ = load("scorer")
X = torch.randn(4, H, generator=torch.Generator().manual_seed(0))


def job(core, rows, ids, forks=(), drops=()):
    forks = [pb2.Fork(parent=p, child=c) for p, c in forks]
    return core.validate(*encode_states(X[rows]), ids, forks, list(drops))


def test_a_later_requests_new_trace_does_not_inherit_a_dropped_one():
    """Job A scores trace k twice and drops it; job B, after A, scores a new k. Batched together, all
    drops went after the one forward: B's k was scored on A's history (0.39 vs 0.46 on the shipped one)."""
    fresh = random_scorer("sequence", H, seed=3).score(["k"], X[2:3]).item()
    core = ScorerCore(random_scorer("sequence", H, seed=3), batch_wait_s=0.3)  # both land in one wait
    try:
        fa = core.submit(job(core, [0, 1], ["k", "k"], drops=["k"]))
        fb = core.submit(job(core, [2], ["k"]))
        assert fb.result(10).item() == pytest.approx(fresh, abs=1e-6)
        fa.result(10)
    finally:
        core.close()


def test_a_later_fork_sees_the_parents_rows_of_an_earlier_request():
    """B forks p -> c after A scored p: c inherits A's row too (the fork went before A's rows)."""
    ref = random_scorer("sequence", H, seed=3)
    ref.score(["p"], X[0:1])
    ref.score(["p"], X[1:2])
    ref.fork("p", "c")
    want = ref.score(["c"], X[2:3]).item()
    core = ScorerCore(random_scorer("sequence", H, seed=3), batch_wait_s=0.3)
    try:
        core.score(job(core, [0], ["p"]))
        fa = core.submit(job(core, [1], ["p"]))
        fb = core.submit(job(core, [2], ["c"], forks=[("p", "c")]))
        assert fb.result(10).item() == pytest.approx(want, abs=1e-6)
        fa.result(10)
    finally:
        core.close()


def test_requests_without_shared_keys_still_share_one_forward():
    core = ScorerCore(random_scorer("sequence", H, seed=3), batch_wait_s=0.3)
    try:
        futs = [core.submit(job(core, [i], [f"t{i}"], forks=[(f"t{i}", f"u{i}")], drops=[f"t{i}"]))
                for i in range(4)]
        assert [len(f.result(10)) for f in futs] == [1] * 4 and core.calls == 1
    finally:
        core.close()


def test_a_request_of_drops_alone_is_applied_and_answers_no_scores():
    core = ScorerCore(random_scorer("sequence", H, seed=3), batch_wait_s=0.0)
    try:
        core.score(job(core, [0, 1], ["a", "b"]))
        assert core.scorer.num_keys == 2
        empty = core.validate(b"", "float32", [0, H], [], [pb2.Fork(parent="a", child="c")], ["a", "b"])
        assert core.score(empty).tolist() == [] and core.scorer.num_keys == 1  # c kept a's history
    finally:
        core.close()


def test_metrics_are_per_score_call_with_buckets_up_to_max_rows():
    backend = PrometheusBackend()
    core = ScorerCore(random_scorer("mlp", H, seed=1), batch_wait_s=0.3,
                      metrics=Metrics(backend, names=("gambit_scorer_latency_seconds",
                                                      "gambit_scorer_batch_size")))
    try:
        futs = [core.submit(job(core, [0, 1], [f"a{i}", f"b{i}"])) for i in range(3)]
        [f.result(10) for f in futs]
        assert core.calls == 1  # one forward ...
        text = backend.exposition().decode()
        lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
        assert float(lines["gambit_scorer_batch_size_count"]) == 3  # ... three Score calls
        assert float(lines["gambit_scorer_batch_size_sum"]) == 6
        assert float(lines["gambit_scorer_latency_seconds_count"]) == 3
        assert float(lines["gambit_scorer_latency_seconds_sum"]) >= 0.2  # the batch wait counts
    finally:
        core.close()
    assert BATCH_BUCKETS[-1] >= core.max_rows


def test_a_timed_out_call_says_so():
    core = ScorerCore(random_scorer("mlp", H, seed=1))
    core.submit = lambda job: Future()  # never answered
    try:
        with pytest.raises(TimeoutError, match=r"timed out after 0.05 s"):
            core.score(job(core, [0], ["a"]), timeout=0.05)
    finally:
        core.close()


class Edit:  # a Fork-shaped pair (validate reads .parent and .child), cheaper than 100k protobufs
    def __init__(self, parent, child):
        self.parent, self.child = parent, child


def test_forks_drops_and_their_ids_are_bounded_naming_the_field():
    """1,000,000 forks in one call and ids of any length were accepted (and kept by a sequence scorer)."""
    from gambit.serving.scorer_client import MAX_PENDING
    from gambit.serving.scorer_core import max_edits

    core = ScorerCore(random_scorer("sequence", H, seed=3), max_rows=8, batch_wait_s=0.0)
    try:
        most = max_edits(core.max_rows)
        assert most == 2 * MAX_PENDING
        empty = (b"", "float32", [0, H], [])
        # a Target back from an outage sends its whole queue (MAX_PENDING) plus a round's: accepted
        ok = core.validate(*empty, [Edit(f"p{i}", f"c{i}") for i in range(MAX_PENDING)],
                           [f"d{i}" for i in range(4096)])
        assert len(ok.forks) == MAX_PENDING and len(ok.drops) == 4096
        with pytest.raises(ValueError, match=rf"^forks: {most} forks \+ 1 drops in one request, at most "):
            core.validate(*empty, [Edit("p", f"c{i}") for i in range(most)], ["d"])
        with pytest.raises(ValueError, match=r"^drops: 0 forks \+ "):
            core.validate(*empty, [], ["d"] * (most + 1))
        with pytest.raises(ValueError, match=r"^forks: trace id 'xxx.* is 129 bytes"):
            core.validate(*empty, [Edit("p", "x" * 129)], [])
        with pytest.raises(ValueError, match=r"^forks: empty trace id"):
            core.validate(*empty, [Edit("", "c")], [])
        with pytest.raises(ValueError, match=r"^forks: bad fork 'p' -> 'p'"):
            core.validate(*empty, [Edit("p", "p")], [])
        with pytest.raises(ValueError, match=r"^drops: trace id .* is 10000 bytes"):
            core.validate(*empty, [], ["d", "y" * 10_000])
        with pytest.raises(ValueError, match=r"^trace_ids: trace id .* is 200 bytes"):
            core.validate(*encode_states(X[:1]), ["z" * 200])
    finally:
        core.close()


def test_a_sequence_scorer_behind_the_core_keeps_at_most_max_keys_histories():
    """Fresh ids in call after call left one history each, forever (163,840 after 40 calls)."""
    core = ScorerCore(random_scorer("sequence", H, seed=3, max_keys=6), batch_wait_s=0.0)
    try:
        for c in range(5):
            core.score(job(core, [0, 1, 2, 3], [f"c{c}-{i}" for i in range(4)]))
        assert core.scorer.num_keys == 6 and core.scorer.evicted == 14
        assert list(core.scorer._state) == ["c3-2", "c3-3"] + [f"c4-{i}" for i in range(4)]
    finally:
        core.close()


def test_a_sequence_scorers_evictions_are_counted_per_batch():
    """Only a log line said it, once: a Scorer forgetting live traces' histories showed on no panel."""
    backend = PrometheusBackend()
    core = ScorerCore(random_scorer("sequence", H, seed=3, max_keys=6), batch_wait_s=0.0,
                      metrics=Metrics(backend))
    count = lambda: backend.registry.get_sample_value("gambit_scorer_evictions_total")  # noqa: E731
    try:
        core.score(job(core, [0, 1, 2, 3], ["a", "b", "c", "d"]))
        assert count() == 0
        core.score(job(core, [0, 1, 2, 3], ["e", "f", "g", "h"]))
        assert count() == 2
        core.score(job(core, [0, 1, 2], ["i", "j", "k"]))
        assert count() == 5 == core.scorer.evicted
    finally:
        core.close()
