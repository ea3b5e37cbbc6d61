"""RemoteScorer keeps queued forks and drops until a call carries them through: a refused call, or one
skipped during back-off, costs its own scores, not the histories of the traces forked meanwhile."""

import threading

import pytest
import torch

from gambit.scoring import random_scorer
from gambit.serving import scorer_client, scorer_endpoints
from gambit.serving.scorer_client import RemoteScorer
from gambit.serving.scorer_server import ScorerServerConfig, start_scorer_server

H = 16
X = torch.randn(6, H, generator=torch.Generator().manual_seed(0))


@pytest.fixture
def server():
    cfg = ScorerServerConfig(port=0, metrics_port=-1, token_env="", batch_wait_ms=0)
    srv = start_scorer_server(cfg, scorer=random_scorer("sequence", H, seed=3))
    yield srv
    srv.stop()


# a trace id over the Scorer's 128 bytes: INVALID_ARGUMENT, the call falls back (a row of NaN or |value| >
# 65504 is no longer sent: ``scorer_core.bad_rows``)
REFUSED = "t:" + "x" * 200


@pytest.mark.parametrize("in_back_off", [False, True])
def test_a_fork_survives_a_refused_call_and_a_skipped_one(server, in_back_off):
    client = RemoteScorer(f"127.0.0.1:{server.port}", H, kind="sequence",
                          retry_after_s=60.0 if in_back_off else 0.0)
    ref = random_scorer("sequence", H, seed=3)
    try:
        parent = []
        for i in (0, 1):
            parent += client.score(["t:p"], X[i:i + 1]).tolist()
            ref.score(["t:p"], X[i:i + 1])
        client.fork("t:p", "t:c")
        ref.fork("t:p", "t:c")
        assert client.score([REFUSED], X[5:6]).tolist() == [0.5] and client.fallbacks == 1
        if in_back_off:  # no call at all: the fallback (the parent's running mean), the fork still queued
            assert client.score(["t:c"], X[2:3]).item() == pytest.approx(sum(parent) / 2)
            assert client.fallbacks == 2
            client._down_until = 0.0  # the back-off is over
        got = client.score(["t:c"], X[3:4]).item()
        assert got == pytest.approx(ref.score(["t:c"], X[3:4]).item(), abs=1e-6)  # 0.5166 vs 0.4045 before
        for k in ("t:p", "t:c"):
            client.drop(k)
        client.score([REFUSED], X[5:6])  # the drops ride on a refused call ...
        client._down_until = 0.0
        client.score(["t:y"], X[4:5])  # ... and on the next one, which lands
        client.drop("t:y")
        client.score(["t:z"], X[4:5])
        assert server.core.scorer.num_keys == 1  # only t:z's history is left
    finally:
        client.close()


def test_a_fork_the_scorer_would_refuse_is_refused_at_once():
    """Queued, a self-fork would be refused with every later call, and kept for the next one."""
    client = RemoteScorer("127.0.0.1:1", H)
    with pytest.raises(ValueError, match="fork: bad fork 'a' -> 'a'"):
        client.fork("a", "a")
    with pytest.raises(ValueError, match="drop: empty trace id"):
        client.drop("")
    client.close()


def test_forks_and_drops_kept_while_down_are_bounded(monkeypatch):
    monkeypatch.setattr(scorer_client, "MAX_PENDING", 4)
    client = RemoteScorer("127.0.0.1:1", H, timeout_s=0.2, retry_after_s=0.0)
    for i in range(3):
        client.fork(f"p{i}", f"c{i}")
        client.drop(f"d{i}")
    client.score(["a"], X[0:1])  # unreachable: all six put back, the two oldest drops go
    assert client._forks == [("p0", "c0"), ("p1", "c1"), ("p2", "c2")] and client._drops == ["d2"]
    client.close()


def test_a_score_that_lands_after_its_traces_drop_is_not_kept(server):
    """The driver drops a trace that ends in the step of its last boundary before that boundary's call: the
    client kept its running mean again when the score came back, one entry per ended trace, never dropped.
    And where the drop left in an earlier call than the row, the Scorer's re-created history stayed."""
    client = RemoteScorer(f"127.0.0.1:{server.port}", H, kind="sequence")
    try:
        for i in range(3):  # the drop and the row in one call: the Scorer scores, then drops
            client.drop(f"t:{i}")
            client.score_async([f"t:{i}"], X[i:i + 1]).result(5)
        assert client._sum == {} and server.core.scorer.num_keys == 0
        client.drop("t:late")  # the drop leaves first (a call in flight took it), the row in the next call
        client.score(["t:other"], X[3:4])
        client.score(["t:late"], X[4:5])
        assert set(client._sum) == {"t:other"} and client._drops == ["t:late"]
        client.score(["t:other"], X[5:6])  # the next call drops it again
        assert server.core.scorer.num_keys == 1 and set(server.core.scorer._state) == {"t:other"}
    finally:
        client.close()


def test_channels_to_direct_endpoints_gone_since_are_closed(monkeypatch):
    """A Target kept one channel for every direct Scorer address it ever used: each replica restart (a new
    port) added one for the Target's life. Beyond MAX_DIRECT_CHANNELS the least recently used is closed;
    the proxy's channel stays."""
    monkeypatch.setattr(scorer_endpoints, "MAX_DIRECT_CHANNELS", 2)
    client = RemoteScorer("127.0.0.1:1", H)  # the "proxy": unreachable, so every call lands on the direct
    cfg = ScorerServerConfig(port=0, metrics_port=-1, token_env="", batch_wait_ms=0)
    used = []
    try:
        for i in range(5):  # a replica restarts on another port each time
            srv = start_scorer_server(cfg, scorer=random_scorer("sequence", H, seed=3))
            try:
                client.direct = f"127.0.0.1:{srv.port}"
                assert client.score([f"t{i}"], X[i:i + 1]).shape == (1,) and client.direct_calls == i + 1
            finally:
                srv.stop()
            used.append((client.direct, client._channels[client.direct][1]))
        assert list(client._channels) == ["127.0.0.1:1", used[3][0], used[4][0]]
        for _, stub in used[:3]:  # closed: no call can go out on them
            with pytest.raises(ValueError, match="closed channel"):
                stub.Info(client.pb2.InfoRequest(), timeout=1)
        client._stub(used[3][0])  # used again: the most recent, kept over the last replica's
        client._stub("127.0.0.1:2")
        assert list(client._channels) == ["127.0.0.1:1", used[3][0], "127.0.0.1:2"]
    finally:
        client.close()
    assert client._channels == {}


@pytest.fixture
def small_server():
    """A Scorer that takes 8 rows per call at most, its first Score call held until the test lets it go."""
    cfg = ScorerServerConfig(port=0, metrics_port=-1, token_env="", batch_wait_ms=0, max_rows=8)
    scorer = random_scorer("sequence", H, seed=3)
    entered, release, score = threading.Event(), threading.Event(), scorer.score

    def held(keys, states):
        if not entered.is_set():
            entered.set()
            release.wait(10)
        return score(keys, states)

    scorer.score = held
    srv = start_scorer_server(cfg, scorer=scorer)
    srv.entered, srv.release = entered, release
    yield srv
    release.set()
    srv.stop()


def test_queued_calls_merged_past_the_scorers_max_rows_are_split(small_server):
    """A slow Scorer makes calls queue; the client sent them as one request, and past the Scorer's max_rows
    (its Info says 8 here) it was refused: every row of those calls scored the fallback (0.5), unguided.
    Split at max_rows, each row gets its score, forks applied before the rows and drops after, as if one
    request; a single call over max_rows is split too."""
    srv, ref = small_server, random_scorer("sequence", H, seed=3)
    x = torch.randn(40, H, generator=torch.Generator().manual_seed(1))
    client = RemoteScorer(f"127.0.0.1:{srv.port}", H, kind="sequence", timeout_s=10.0)
    try:
        first = client.score_async(["k0"], x[0:1])  # in flight, held in the Scorer: the rest queue up
        assert srv.entered.wait(10)
        client.fork("k0", "c")
        client.drop("k1")
        calls = [[f"k{i}" for i in range(1, 5)], ["k5", "k6", "k7", "k1"], ["k8", "k9", "c", "k0"]]
        futs = [client.score_async(keys, x[1 + 4 * j:5 + 4 * j]) for j, keys in enumerate(calls)]
        srv.release.set()
        got = torch.cat([first.result(10)] + [f.result(10) for f in futs])
        want = [ref.score(["k0"], x[0:1])]
        ref.drop("c")
        ref.fork("k0", "c")
        want.append(ref.score([k for keys in calls for k in keys], x[1:13]))
        ref.drop("k1")
        assert client.fallbacks == 0, client.last_error
        assert got.tolist() == pytest.approx(torch.cat(want).tolist(), abs=1e-5)
        assert set(srv.core.scorer._state) == set(ref._state)  # k1 dropped after its rows, c forked
        keys = [f"s{i}" for i in range(20)]  # one call over max_rows by itself
        got = client.score(keys, x[20:40])
        assert client.fallbacks == 0 and got.tolist() == pytest.approx(ref.score(keys, x[20:40]).tolist(),
                                                                       abs=1e-5)
    finally:
        client.close()


def test_a_split_call_refused_part_way_keeps_what_landed(small_server):
    """The first part landed (with the forks), the second was refused: its rows fall back, the drops it
    carried stay queued for the next call, the forks do not go twice."""
    small_server.release.set()
    x = torch.randn(12, H, generator=torch.Generator().manual_seed(2))
    client = RemoteScorer(f"127.0.0.1:{small_server.port}", H, kind="sequence", retry_after_s=60.0)
    try:
        client.fork("a", "b")
        client.drop("z")
        keys = [f"k{i}" for i in range(12)]
        keys[10] = REFUSED  # the second part is refused (INVALID_ARGUMENT)
        got = client.score(keys, x)
        ref = random_scorer("sequence", H, seed=3).score([f"k{i}" for i in range(8)], x[:8])
        assert got[:8].tolist() == pytest.approx(ref.tolist(), abs=1e-5) and got[8:].tolist() == [0.5] * 4
        assert client.fallbacks == 1 and client._forks == [] and client._drops == ["z"]
    finally:
        client.close()


def test_a_fork_or_drop_of_an_id_over_the_scorers_limit_is_refused_at_once():
    """Queued, the Scorer refused it on every later call (``fork``/``drop`` missed the length rule)."""
    client = RemoteScorer("127.0.0.1:1", H)
    long_id = "r:" + "x" * 200
    with pytest.raises(ValueError, match="fork: trace id .* bytes, at most 128"):
        client.fork("r:1", long_id)
    with pytest.raises(ValueError, match="drop: trace id .* bytes, at most 128"):
        client.drop(long_id)
    assert not client._forks and not client._drops
    client.close()
