"""Stop 69's bench figures: a p50 or a step time of an even count is the median (the mean of the middle
two), an IQR lies inside the range, a stopped engine run counts only the rounds it finished, a finished
``bench search`` leaves no ``.partial`` beside its JSON and a stopped one marks it, and ``bench rounds``
checks its store before the model loads and keeps its runs out of the services' prefix."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from gambit.paths import TARGET


@pytest.fixture
def keep_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_serve_p50_of_an_even_count_is_the_median():
    """``pct`` took the nearest rank rounded half to even: p50 of two runs was the faster, of four the
    slower middle one."""
    from gambit.bench.serve import pct

    assert pct([0.2, 0.1], 0.5) == pytest.approx(0.15)
    assert pct([4.0, 1.0, 3.0, 2.0], 0.5) == pytest.approx(2.5)
    assert pct([1.0, 2.0, 3.0], 0.5) == 2.0 and pct([7.0], 0.95) == 7.0
    assert pct([float(x) for x in range(11)], 0.95) == pytest.approx(9.5)  # between the two nearest ranks


def test_profile_step_time_of_an_even_count_is_the_median(monkeypatch, keep_threads):
    """``wall_ms_per_step`` was the upper middle step of an even ``--steps``."""
    from gambit.bench import profile_step

    ticks = iter([0.0, 1.0, 10.0, 13.0])  # two unprofiled steps: 1 s and 3 s
    monkeypatch.setattr(profile_step, "time", SimpleNamespace(perf_counter=lambda: next(ticks)))
    r = profile_step.profile(str(TARGET), 1, 2, 1, "transposed")
    assert r["wall_ms_per_step"] == pytest.approx(2000.0)


def test_spec_cycle_ratio_iqr_lies_inside_its_range():
    """``statistics.quantiles``' default (exclusive) gave two pairs 1.0 and 2.0 an IQR of 0.75-2.25."""
    from gambit.bench.spec_report import _cycle_ratio

    rows = {"pr": {"cycle_seconds": [1.0, 2.0], "chunk_cycle_seconds": [1.0, 2.0]},
            "eagle3.1": {"cycle_seconds": [1.0, 1.0], "chunk_cycle_seconds": [1.0, 1.0]}}
    c = _cycle_ratio(rows, "pr", "eagle3.1")
    assert c["spread"] == [1.0, 2.0] and c["median"] == 1.5
    assert c["spread"][0] <= c["iqr"][0] <= c["iqr"][1] <= c["spread"][1]


def test_engine_ctrl_c_counts_only_the_rounds_every_backend_finished(monkeypatch, tmp_path, capsys):
    """``rounds_done`` counted the round under way (its bandwidth is measured as it starts): a Ctrl-C
    during round 2's transformers child said 2 rounds done."""
    from gambit.bench import engine

    calls = []

    def child(cmd, timeout, env=None):
        role = cmd[cmd.index("--role") + 1]
        calls.append(role)
        if len(calls) == 4:  # round 2, transformers
            raise KeyboardInterrupt
        return [{"batch": 1, "tok_s": 10.0 * len(calls), "total_tok_s": 5.0, "peak_mb": 1.0}], ""

    monkeypatch.setattr(engine, "_child", child)
    monkeypatch.setattr(engine, "memory_bandwidth_gbs", lambda: 10.0)
    out = tmp_path / "e.json"
    with pytest.raises(KeyboardInterrupt):
        engine.run_engine_bench(TARGET, [1], new_tokens=2, vllm=False, repeats=3, json_path=out, argv=[])
    got = json.loads((tmp_path / "e.json.partial").read_text())
    assert calls == ["native", "hf", "native", "hf"]
    assert got["interrupted"] is True and got["rounds_done"] == 1
    assert "interrupted; wrote what it finished" in capsys.readouterr().err


def fake_search(monkeypatch, stop: bool) -> None:
    """``bench search`` without a model: one chunk of one method, checkpointed, then Ctrl-C if ``stop``."""
    from gambit.bench import search
    from gambit.search.run_state import TIMING_KEYS

    tok = SimpleNamespace(encode=lambda text: [1, 2])
    monkeypatch.setattr(search, "load_model", lambda *a, **k: (
        SimpleNamespace(config=SimpleNamespace(hidden_size=8)), tok))
    monkeypatch.setattr(search, "load_scorer_spec", lambda spec, width: SimpleNamespace(kind=spec))
    monkeypatch.setattr(search, "problem_sets", lambda cfg: {"hard": ((6, 8), [SimpleNamespace(prompt="p")])})
    monkeypatch.setattr(search, "check_readable", lambda ps, tok: None)
    monkeypatch.setattr(search, "chunk_engine", lambda model, tok, problems, cfg: (object(), 4))
    monkeypatch.setattr(search, "warm_up", lambda *a: None)
    monkeypatch.setattr(search, "SearchDriver", lambda *a: None)

    def run_variants(drivers, names, vs, problems, cfg, bar, records, checkpoint=None):
        run = {"correct": True, "tokens": 10, "wall_s": 0.1, "finished": 4, "branched": 0, "pruned": 0,
               "evicted": 0, "majority_ok": True, "weighted_ok": True, "pass_any": True}
        records["sc"] = {"runs": [run], "series": [], "spec_drafts": 0, "spec_capped_steps": 0,
                         "timings": dict.fromkeys(TIMING_KEYS, 0.01), "chunk_walls": [0.1],
                         "chunk_finished": [4]}
        checkpoint()
        if stop:
            raise KeyboardInterrupt

    monkeypatch.setattr(search, "run_variants", run_variants)


def search_cfg(tmp_path):
    from gambit.bench.search import BenchSearchConfig

    return BenchSearchConfig(methods="sc", difficulties="hard", sensitivity=False, frontier=False, pr=False,
                             threads=1, plots=str(tmp_path / "plots"))


def test_a_finished_search_leaves_no_partial_file(monkeypatch, tmp_path, keep_threads):
    """The per-chunk checkpoint stayed beside the finished JSON, read later as a stopped run."""
    from gambit.bench.search import run_bench

    fake_search(monkeypatch, stop=False)
    out = tmp_path / "s.json"
    res = run_bench(search_cfg(tmp_path), str(out), argv=[])
    assert res["methods"]["sc"]["accuracy"] == 1.0 and out.is_file()
    assert not (tmp_path / "s.json.partial").exists()


def test_a_stopped_search_marks_its_partial_file_and_says_so(monkeypatch, tmp_path, capsys, keep_threads):
    """Ctrl-C left the last checkpoint unmarked and said nothing (every other bench says where it wrote)."""
    from gambit.bench.search import run_bench

    fake_search(monkeypatch, stop=True)
    out = tmp_path / "s.json"
    with pytest.raises(KeyboardInterrupt):
        run_bench(search_cfg(tmp_path), str(out), argv=["--methods", "sc"])
    got = json.loads((tmp_path / "s.json.partial").read_text())
    assert got["interrupted"] is True and "sc" in got["by_difficulty"]["hard"]["methods"]
    assert got["provenance"]["command"] == "gambit bench search --methods sc"
    assert not out.exists()
    assert "gambit bench search: interrupted; wrote what it finished" in capsys.readouterr().err


def test_rounds_store_is_checked_before_the_model_loads(monkeypatch):
    """``--store foo`` was found by the first repeat, after the target and the scorer had loaded."""
    from bench_util import refused_before

    from gambit.bench import search_rounds
    from gambit.model import loader

    refused_before(monkeypatch, loader, "load_model", search_rounds.main, ["--store", "foo"],
                   "--store must be a redis://")


@pytest.fixture
def redis_url():
    from gambit.bench import serve_store

    url = "redis://127.0.0.1:6379/0"
    try:
        serve_store.check_store(url, "gambit-test-bench-rounds-probe:", explicit=False)
    except OSError:
        pytest.skip("no Redis at 127.0.0.1:6379")
    return url


def test_rounds_runs_in_redis_go_under_a_prefix_of_their_own_deleted_at_the_end(redis_url, monkeypatch,
                                                                                keep_threads):
    """``--store redis://`` wrote the bench's runs under the services' default prefix ("gambit"), kept a
    day beside the served runs."""
    import redis

    from gambit.bench import search_rounds

    seen = []

    def one(model, tok, scorer, problems, args, store, profiler=None):
        seen.append(store.prefix)
        store.r.set(f"{store.prefix}:run:x:meta", "1")
        return {"us_per_round": {"round": 1.0, "store": 1.0}, "cpu": {"finish": 0.0}, "rounds": 1, "steps": 2,
                "us_per_step": {"routing": 1.0, "guidance": 1.0, "kv_evict": 1.0}, "score_calls": 1,
                "overhead_cpu_fraction": 0.1, "tree_cpu_fraction": 0.1, "wall_overhead_fraction": 0.1}

    monkeypatch.setattr(search_rounds, "_one", one)
    assert search_rounds.main(["--problems", "1", "--capacity", "4", "--repeat", "1", "--threads", "1",
                               "--store", redis_url]) in (0, None)
    (prefix,) = seen
    assert prefix.startswith("bench-rounds:")
    assert not list(redis.Redis.from_url(redis_url).scan_iter(match=prefix + "*"))
