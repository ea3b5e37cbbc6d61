"""BoundaryScorer: shapes, range, input checks, per-key history with fork/drop, save/load."""

import pytest
import torch

from gambit.scoring import BoundaryScorer, ScorerConfig, load_scorer, random_scorer, save_scorer

KINDS = [("mlp", {}), ("sequence", {"arch": "gru"}), ("sequence", {"arch": "attn"})]
IDS = ["mlp", "gru", "attn"]


@pytest.fixture(params=KINDS, ids=IDS)
def scorer(request) -> BoundaryScorer:
    kind, kw = request.param
    return random_scorer(kind, hidden_size=32, seed=1, **kw)


def test_shapes_and_range(scorer):
    x = torch.randn(7, 32) * 5
    out = scorer.score(list(range(7)), x)
    assert out.shape == (7,) and out.dtype == torch.float32
    assert bool(((out >= 0) & (out <= 1)).all())
    assert scorer.score([], torch.zeros(0, 32)).shape == (0,)
    assert scorer.kind in ("mlp", "sequence") and scorer.hidden_size == 32


@pytest.mark.parametrize("bad, msg", [
    (torch.randn(3, 31), "width 31"),
    (torch.randn(3, 64), "width 64"),
    (torch.randint(0, 9, (3, 32)), "floating point"),
    (torch.zeros(3, 32, dtype=torch.bool), "floating point"),
    (torch.randn(32), "2-D"),
    (torch.randn(1, 3, 32), "2-D"),
    ([[0.0] * 32] * 3, "torch.Tensor"),
    (torch.full((3, 32), float("nan")), "NaN"),
])
def test_bad_states_refused(scorer, bad, msg):
    scorer.score(["a"], torch.randn(1, 32))
    before = {k: v.clone() for k, v in scorer._state.items()}
    with pytest.raises(ValueError, match=msg):
        scorer.score(["a", "b", "c"], bad)
    assert set(scorer._state) == set(before)  # nothing changed
    assert all(torch.equal(scorer._state[k], v) for k, v in before.items())


def test_bad_keys_refused(scorer):
    with pytest.raises(ValueError, match="one key per row"):
        scorer.score([1, 2], torch.randn(3, 32))
    with pytest.raises(ValueError, match="sequence"):
        scorer.score("abc", torch.randn(3, 32))
    with pytest.raises(ValueError, match="hashable"):
        scorer.score([[1], [2]], torch.randn(2, 32))


def test_low_precision_states_accepted(scorer):
    x = torch.randn(2, 32)
    a = scorer.score(["p", "q"], x.bfloat16())
    scorer.reset()
    b = scorer.score(["p", "q"], x.bfloat16().float())
    assert torch.equal(a, b)


def test_incremental_equals_history(scorer):
    x = torch.randn(6, 32)
    inc = torch.cat([scorer.score(["t"], x[i:i + 1]) for i in range(6)])
    torch.testing.assert_close(inc, scorer.score_history(x), atol=1e-5, rtol=0)
    # several rows of one key in one call are applied in order
    scorer.reset()
    rows = torch.cat([x[:1], x[:1], x[1:3], x[1:2], x[3:]])
    both = scorer.score(["u", "v", "u", "u", "v", "u", "u", "u"], rows)
    torch.testing.assert_close(both[[0, 2, 3, 5, 6, 7]], inc, atol=1e-5, rtol=0)
    torch.testing.assert_close(both[[1, 4]], inc[:2], atol=1e-5, rtol=0)


def test_fork_inherits_history():
    s = random_scorer("sequence", hidden_size=32, seed=3)
    x = torch.randn(5, 32)
    s.score(["parent"] * 3, x[:3])
    s.fork("parent", "child")
    child = s.score(["child"], x[3:4])
    parent = s.score(["parent"], x[3:4])
    assert torch.equal(child, parent)  # the child's score is the parent's continuation
    assert torch.allclose(child, s.score_history(x[:4])[-1:], atol=1e-5)
    s.drop("parent")
    fresh = s.score(["parent"], x[:1])
    assert torch.allclose(fresh, s.score_history(x[:1]), atol=1e-5)
    with pytest.raises(ValueError, match="already has a history"):
        s.fork("parent", "child")
    with pytest.raises(ValueError, match="onto itself"):
        s.fork("child", "child")
    s.fork("never-scored", "kid")  # a parent without boundaries: the child starts empty
    assert "kid" not in s._state
    s.drop("unknown")


def test_fork_histories_diverge():
    s = random_scorer("sequence", hidden_size=32, seed=4)
    x = torch.randn(4, 32)
    s.score([0, 0], x[:2])
    s.fork(0, 1)
    a = s.score([0], x[2:3])
    b = s.score([1], x[3:4])
    torch.testing.assert_close(a, s.score_history(x[:3])[-1:], atol=1e-5, rtol=0)
    torch.testing.assert_close(b, s.score_history(x[[0, 1, 3]])[-1:], atol=1e-5, rtol=0)


def test_save_load_round_trip(scorer, tmp_path):
    save_scorer(scorer, scorer.config, tmp_path / "s")
    loaded = load_scorer(tmp_path / "s")
    assert loaded.config == scorer.config
    x = torch.randn(5, 32)
    keys = [0, 1, 0, 2, 0]
    assert torch.equal(loaded.score(keys, x), scorer.score(keys, x))


def test_load_errors(tmp_path):
    s = random_scorer("mlp", hidden_size=16)
    save_scorer(s, s.config, tmp_path / "s")
    cfg = ScorerConfig(kind="mlp", hidden_size=24)
    (tmp_path / "s" / "config.json").write_text(__import__("json").dumps(cfg.to_json()))
    with pytest.raises(ValueError, match="0.weight"):
        load_scorer(tmp_path / "s")
    with pytest.raises(FileNotFoundError):
        load_scorer(tmp_path / "nope")
    with pytest.raises(ValueError, match="kind"):
        ScorerConfig(kind="transformer")


def test_mlp_is_step_probe():
    s = random_scorer("mlp", hidden_size=192)
    shapes = {k: tuple(v.shape) for k, v in s.net.state_dict().items()}
    assert shapes == {"0.weight": (512, 192), "0.bias": (512,), "2.weight": (1, 512), "2.bias": (1,)}
    x = torch.randn(3, 192)
    w = s.net.state_dict()
    ref = torch.sigmoid(torch.relu(x @ w["0.weight"].T + w["0.bias"]) @ w["2.weight"].T + w["2.bias"])[:, 0]
    torch.testing.assert_close(s.score([1, 2, 3], x), ref)


@pytest.mark.parametrize("invariant", [True, False], ids=["invariant", "aten"])
def test_sequence_scorer_keeps_at_most_max_keys_least_recently_used_first(invariant):
    """Every new key kept a history until dropped: a Target that died, or a caller inventing ids, grew a
    Scorer's memory without end (~130 MB/s)."""
    x = torch.randn(8, 32)
    big = random_scorer("sequence", hidden_size=32, seed=5, invariant=invariant)
    s = random_scorer("sequence", hidden_size=32, seed=5, invariant=invariant, max_keys=3)
    for t in (big, s):
        t.score(["a", "b", "c"], x[:3])
        t.score(["a"], x[3:4])  # a used last: b is now the least recently used
        t.fork("c", "c2")  # the parent counts as used: b goes, then a
    assert list(s._state) == ["a", "c", "c2"] and s.evicted == 1
    for t in (big, s):
        t.score([f"new{i}" for i in range(2)], x[4:6])
    assert list(s._state) == ["c2", "new0", "new1"] and s.num_keys == 3 and s.evicted == 3
    assert big.evicted == 0 and big.num_keys == 6
    # a kept key scores on, as without the bound; an evicted one starts afresh, as after a drop
    torch.testing.assert_close(s.score(["c2"], x[6:7]), big.score(["c2"], x[6:7]), atol=0, rtol=0)
    big.drop("a")
    torch.testing.assert_close(s.score(["a"], x[7:8]), big.score(["a"], x[7:8]), atol=0, rtol=0)
    torch.testing.assert_close(s.score(["z"], x[7:8]), s.score_history(x[7:8]), atol=1e-5, rtol=0)
    # each kept state owns its storage: a row of the batch's tensor kept all 64 rows alive
    s.score([f"w{i}" for i in range(64)], torch.randn(64, 32))
    assert all(v.untyped_storage().nbytes() == v.nbytes for v in s._state.values())
    with pytest.raises(ValueError, match="max_keys must be an int >= 1"):
        random_scorer("sequence", hidden_size=32, max_keys=0)


@pytest.mark.parametrize("arch", ["gru", "attn"])
def test_every_sequence_arch_keeps_at_most_max_keys(arch):
    """The attn scorer keeps its histories in the same LRU as the GRU: max_keys + 1 traces, the first goes."""
    s = random_scorer("sequence", hidden_size=32, seed=5, arch=arch, max_keys=4)
    for i in range(5):
        s.score([f"t{i}"], torch.randn(1, 32))
    assert list(s._state) == ["t1", "t2", "t3", "t4"] and s.evicted == 1


def test_attn_histories_are_bounded_in_bytes_least_recently_used_first():
    """An attn key keeps every boundary row it was given: under the key cap alone 65,536 long traces held
    many GB. Beyond ``max_state_mb`` the least recently used histories go, counted in ``evicted``."""
    H = 4096  # a row is 16 KiB: 64 rows fill 1 MiB
    s = random_scorer("sequence", hidden_size=H, seed=5, arch="attn", model_dim=16, num_heads=2,
                      max_state_mb=1)
    for i in range(5):  # 5 traces x 16 boundaries: 80 rows, 1.25 MiB; 4 of them fill 1 MiB
        s.score([f"t{i}"] * 16, torch.randn(16, H))
    assert list(s._state) == ["t1", "t2", "t3", "t4"] and s.evicted == 1
    assert s.state_bytes == sum(v.nbytes for v in s._state.values()) == 1 << 20
    s.fork("t2", "c")  # the parent counts as used: t1 goes
    assert list(s._state) == ["t3", "t4", "t2", "c"] and s.evicted == 2
    s.drop("t3")
    assert list(s._state) == ["t4", "t2", "c"] and s.state_bytes == 3 * 16 * H * 4
    s.score(["t4"] * 16, torch.randn(16, H))  # a kept history grows on: 64 rows, full
    assert list(s._state) == ["t2", "c", "t4"] and s.evicted == 2
    s.score(["c"], torch.randn(1, H))  # one row over: the least recently used (t2) goes
    assert list(s._state) == ["t4", "c"] and s.evicted == 3
    s.reset()
    assert s.state_bytes == 0 and s.num_keys == 0
    with pytest.raises(ValueError, match="max_state_mb must be an int >= 1"):
        random_scorer("sequence", hidden_size=32, max_state_mb=0)
