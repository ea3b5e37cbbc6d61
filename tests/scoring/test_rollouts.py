"""The rollout bar starts once the first Engine is built: while another process compiled the CPU kernels,
the bar showed the wait as its first trace (``1/96 [00:27<43:25, 27.43s/trace]``)."""

from __future__ import annotations

from gambit.scoring import rollouts
from gambit.scoring.rollouts import RolloutConfig, chunk_dir, collect_rollouts


def recorded(monkeypatch) -> tuple[list[str], list[dict]]:
    """The order in which Engines and bars are made, and each bar's arguments."""
    order: list[str] = []
    bars: list[dict] = []
    engine, tqdm = rollouts.Engine, rollouts.tqdm

    def make_engine(*a, **k):
        out = engine(*a, **k)
        order.append("engine")
        return out

    def make_bar(*a, **k):
        order.append("bar")
        bars.append(k)
        return tqdm(*a, **k)

    monkeypatch.setattr(rollouts, "Engine", make_engine)
    monkeypatch.setattr(rollouts, "tqdm", make_bar)
    return order, bars


def test_the_bar_starts_after_the_first_engine_and_counts_cached_chunks_as_done(monkeypatch, tmp_path):
    order, bars = recorded(monkeypatch)
    cfg = RolloutConfig(n_problems=2, samples=2, max_tokens=8, chunk_problems=1)
    first = collect_rollouts(cfg, cache_dir=str(tmp_path), quiet=True)
    assert order == ["engine", "bar", "engine"]  # before: the bar came first
    assert bars[0]["initial"] == 0 and bars[0]["total"] == 4
    # the first chunk cached, the second not: a new bar starting at the cached chunk's 2 traces
    for f in tmp_path.glob("rollouts-*.pt"):
        f.unlink()
    (chunk_dir(cfg, str(tmp_path)) / "chunk-00001.pt").unlink()
    order.clear()
    again = collect_rollouts(cfg, cache_dir=str(tmp_path), quiet=True)
    assert order == ["engine", "bar"] and bars[1]["initial"] == 2
    assert again["tokens"].tolist() == first["tokens"].tolist()
    # everything cached: no engine and no bar
    order.clear()
    for f in tmp_path.glob("rollouts-*.pt"):
        f.unlink()
    collect_rollouts(cfg, cache_dir=str(tmp_path), quiet=True)
    assert order == []
