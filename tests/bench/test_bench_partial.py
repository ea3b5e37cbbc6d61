"""Ctrl-C in ``gambit bench spec`` and ``gambit bench serve`` writes the finished cells / pairs to
``<json>.partial`` marked interrupted, as engine and pools do (both said "nothing written" whatever had
finished: an hour of spec tables was lost to one Ctrl-C)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

import gambit.bench.serve as serve
import gambit.bench.spec as spec


@pytest.fixture
def keep_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def fake_spec(monkeypatch, stop_at: int) -> list[str]:
    """No model: a fake engine, drafters and prompts; ``measure`` gives a cell per call and Ctrl-C at call
    ``stop_at``. Returns the cells measured, by name."""
    class FakeEngine:
        tokenizer, model = object(), object()

        @classmethod
        def from_pretrained(cls, *a, **k):
            return cls()

    done: list[str] = []

    def measure(eng, prompts, batch, systems, reps, max_tokens, ref, bar):
        if len(done) == stop_at:
            raise KeyboardInterrupt
        done.append(f"batch {batch}")
        cell = {"seconds_median": 1.0, "speedup": 1.5, "speedup_spread": [1.2, 1.8], "tau": 2.0}
        return {"plain": {"seconds_median": 1.5}, **{label: dict(cell) for label in systems}}

    monkeypatch.setattr(spec, "Engine", FakeEngine)
    monkeypatch.setattr(spec, "load_drafters", lambda eng, folder, keys=(): {"pr": "p", "eagle3.1": "e"})
    monkeypatch.setattr(spec, "prompts_for", lambda split, n, seed, tok, task_split="test": [[1, 2]] * n)
    monkeypatch.setattr(spec, "measure", measure)
    return done


def spec_main(tmp_path: Path, out: Path) -> None:
    spec.main(["--quick", "--threads", "1", "--drafters", str(tmp_path), "--allow-random-drafters",
               "--json", str(out)])


def test_spec_ctrl_c_writes_the_finished_tables(monkeypatch, tmp_path, capsys, keep_threads):
    done = fake_spec(monkeypatch, stop_at=3)
    out = tmp_path / "spec.json"
    with pytest.raises(KeyboardInterrupt):
        spec_main(tmp_path, out)
    part = json.loads(Path(str(out) + ".partial").read_text())
    assert part["interrupted"] and part["cells_done"] == len(done) == 3
    assert part["headline"]["B=48 batch 1"]["pr"]["speedup_spread"] == [1.2, 1.8]
    assert set(part["defaults"]) == {"engine defaults batch 1"} and len(part["table1"]) == 1
    assert "table2" not in part and part["reps"] == 2
    assert part["provenance"]["command"].startswith("gambit bench spec --quick --threads 1")
    assert not out.exists()
    assert "gambit bench spec: interrupted; wrote what it finished to" in capsys.readouterr().err


def test_spec_ctrl_c_before_a_cell_says_nothing_was_written(monkeypatch, tmp_path, capsys, keep_threads):
    fake_spec(monkeypatch, stop_at=0)
    out = tmp_path / "spec.json"
    with pytest.raises(KeyboardInterrupt):
        spec_main(tmp_path, out)
    assert not Path(str(out) + ".partial").exists() and not out.exists()
    assert "interrupted; nothing written (nothing finished yet)" in capsys.readouterr().err


def fake_serve(monkeypatch, stop_at: int) -> list[str]:
    """No wiring, store or Ray: each run call sleeps (distributed 3x as long) and Ctrl-C comes at call
    ``stop_at`` (calls 0 and 1 are the warm-up)."""
    from gambit.deployments import local
    from gambit.serving import embedded

    calls: list[str] = []

    def runner(name: str, seconds: float):
        def run(where, prompts, cfg, *rest):
            if len(calls) == stop_at:
                raise KeyboardInterrupt
            calls.append(name)
            time.sleep(seconds)
            return [{"latency": seconds, "tokens": 5, "sync": 0.0, "total": seconds, "answer": "1"}
                    for _ in prompts]
        return run

    class Fake:
        def __init__(self, *a, **k):
            self.target = None

        def close(self):
            pass

        def measure(self, n):
            pass

    monkeypatch.setattr(serve, "run_embedded", runner("embedded", 0.01))
    monkeypatch.setattr(serve, "run_distributed", runner("distributed", 0.03))
    monkeypatch.setattr(serve, "EngineBaseline", Fake)
    monkeypatch.setattr(embedded, "Embedded", Fake)
    monkeypatch.setattr(local, "check_startable", lambda scfg: None)
    monkeypatch.setattr(local, "start", lambda scfg, wait_s=0: None)
    monkeypatch.setattr(local, "stop", lambda: None)
    monkeypatch.setattr(serve.serve_store, "check_store", lambda url, prefix, explicit: None)
    monkeypatch.setattr(serve.serve_store, "delete_prefix", lambda url, prefix: 0)
    return calls


def test_serve_ctrl_c_writes_the_finished_pairs(monkeypatch, tmp_path, capsys):
    calls = fake_serve(monkeypatch, stop_at=5)  # warm-up, one pair (embedded, distributed), then stopped
    out = tmp_path / "serve.json"
    with pytest.raises(KeyboardInterrupt):
        serve.main(["--reps", "1", "--one-run-pairs", "2", "--concurrency", "1,2", "--json", str(out)])
    assert calls == ["embedded", "distributed", "embedded", "distributed", "distributed"]
    part = json.loads(Path(str(out) + ".partial").read_text())
    assert part["interrupted"] and part["wall_ratio_pairs"] == 1
    assert 1.5 < part["wall_ratio"] == part["wall_ratio_values"][0]
    assert part["wall_ratio_spread"] == [part["wall_ratio"]] * 2
    (emb,) = part["systems"]["embedded"]
    assert emb["runs"] == 1 and emb["reps_done"] == 1
    assert len(part["systems"]["distributed"][0]["wall_s"]) == 2  # the stopped pair's first half too
    assert part["config"]["one_run_pairs"] == 2
    assert part["provenance"]["command"] == (f"gambit bench serve --reps 1 --one-run-pairs 2 "
                                             f"--concurrency 1,2 --json {out}")
    assert not out.exists()
    assert "gambit bench serve: interrupted; wrote what it finished to" in capsys.readouterr().err


def test_serve_ctrl_c_in_the_warm_up_says_nothing_was_written(monkeypatch, tmp_path, capsys):
    fake_serve(monkeypatch, stop_at=1)
    out = tmp_path / "serve.json"
    with pytest.raises(KeyboardInterrupt):
        serve.main(["--reps", "1", "--concurrency", "1", "--json", str(out)])
    assert not list(tmp_path.iterdir())
    assert "interrupted; nothing written (nothing finished yet)" in capsys.readouterr().err
