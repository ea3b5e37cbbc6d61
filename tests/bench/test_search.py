"""``gambit bench search``'s configuration: what it refuses, and the variants ``--methods`` keeps."""

from __future__ import annotations

import pytest

from gambit.bench.search import METHODS, BenchSearchConfig, variants


def test_unknown_methods_are_named():
    with pytest.raises(ValueError, match=r"methods: unknown \['bogus'\]; known \['gambit'"):
        BenchSearchConfig(methods="gambit,bogus")


def test_methods_keep_exactly_the_named_variants():
    v = variants(BenchSearchConfig(methods="step,sc", pr=False))
    assert set(v) == {"step", "sc"} and v["step"][1].method == "step" and v["sc"][1].method == "sc"
    assert set(variants(BenchSearchConfig(pr=False))) == set(METHODS) - {"gambit_pr", "gambit_ties"}
    (ties,) = variants(BenchSearchConfig(methods="gambit_ties", pr=False)).values()  # an A/B: when named
    assert ties[1].swap_ties
    assert not variants(BenchSearchConfig(methods="gambit", pr=False))["gambit"][1].swap_ties


def test_gambit_pr_without_pr_is_refused_not_dropped():
    with pytest.raises(ValueError, match="gambit_pr needs --pr"):
        variants(BenchSearchConfig(methods="gambit,gambit_pr", pr=False))


@pytest.fixture
def keep_threads():
    """``run_bench`` sets the process's torch threads (``--threads``): put the count back afterwards."""
    import torch

    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_a_benchmark_file_searches_as_the_task(tmp_path, capsys, keep_threads):
    """``--benchmark gsm8k --data FILE`` with the task's hard problems in GSM8K's layout: every method
    gets the same accuracy and tokens as on the task (KV ample in both, so no sizing difference moves an
    eviction), and the report names the benchmark where it named the hard end."""
    import json

    from gambit.bench.search import run_bench
    from gambit.tasks.arithmetic import TaskConfig, generate

    rows = [{"question": p.prompt.split("\nSolution:")[0], "answer": f"...\n#### {p.answer}"}
            for p in generate("test", 4, 1, TaskConfig(6, 8))]  # the bench's pick: seed + 1
    data = tmp_path / "g.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # one thread: the shipped target's steps gain nothing from two, and on a busy 2-core host two threads'
    # OpenMP barriers made this test 10x as long (``gambit.engine.step_threads``)
    common = dict(quick=True, problems=4, capacity=4, concurrency=4, kv_share=4.0, methods="gambit,sc,step",
                  sensitivity=False, frontier=False, pr=False, plots=str(tmp_path / "plots"), threads=1)
    task = run_bench(BenchSearchConfig(**common, difficulties="hard"), None)
    bench = run_bench(BenchSearchConfig(**common, benchmark="gsm8k", data=str(data)),
                      str(tmp_path / "b.json"))
    out = capsys.readouterr().out
    assert set(bench["by_difficulty"]) == {"gsm8k"} and bench["by_difficulty"]["gsm8k"]["ops"] is None
    for m in ("gambit", "sc", "step"):
        a, b = task["methods"][m], bench["methods"][m]
        assert (a["accuracy"], a["tokens"]) == (b["accuracy"], b["tokens"]), m
    assert task["methods"]["sc"]["accuracy"] > 0  # the comparison has right answers in it
    assert "Table 1 — gsm8k (benchmark questions, 4 problems" in out
    assert "Table 3 — wall-time split (gsm8k)" in out
    assert json.loads((tmp_path / "b.json").read_text())["config"]["benchmark"] == "gsm8k"


@pytest.mark.parametrize(("field", "value", "message"), [
    ("threads", 0, "threads must be >= 1, got 0"),
    ("device", "foo", "device must be auto, cpu, cuda or cuda:N, got 'foo'"),
    ("capacity", 2, "capacity must be >= 4, got 2"),
    ("concurrency", 0, "concurrency must be >= 1, got 0"),
    ("kv_share", 0.0, r"kv_share must be in \(0, 4\], got 0.0"),
    ("kv_share", 5.0, r"kv_share must be in \(0, 4\], got 5.0"),
    ("kv_share", float("nan"), r"kv_share must be in \(0, 4\], got nan"),
    ("problems", -1, "problems must be >= 0, got -1"),
])
def test_a_bad_value_is_named_alone(field, value, message):
    """One message per bad field, naming it and its value (once: "need capacity >= 4, concurrency >= 1,
    kv_share in (0, 4]" for any of them; a bad --threads or --device a traceback after the checks)."""
    with pytest.raises(ValueError, match=f"^{message}"):
        BenchSearchConfig(**{field: value})


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:1"])
def test_devices_the_engine_takes_pass(device, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a host with two GPUs
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert BenchSearchConfig(device=device).device == device


@pytest.mark.parametrize(("args", "message"), [
    (["--problems", "-1"], "--problems must be >= 0, got -1"),
    (["--threads", "0"], "--threads must be >= 1, got 0"),
    (["--kv-share", "0"], "--kv-share must be in (0, 4], got 0.0"),
    # SearchConfig's own checks: once after the model and the scorers loaded, with exit 2 (the rest 1)
    (["--rank", "median"], "--rank must be one of ('mean', 'last', 'min'), got 'median'"),
    (["--temperature", "-1"], "--temperature must be in [0.0, 10.0], got -1.0"),
    (["--merge", "/nonexistent.json"], "--merge: /nonexistent.json: no such file"),  # an Errno line
    (["--dtype", "fp8"], "--dtype must be auto or one of float32, fp32, bfloat16, bf16, float16, fp16"),
])
def test_a_bad_flag_is_named_as_a_flag_and_exits_2(monkeypatch, capsys, args, message):
    """"error: problems must be >= 0" with exit 1, where the other benches say "--reps must be >= 1"
    and exit 2; each is refused before the model loads."""
    import gambit.bench.search
    from gambit.cli import main

    monkeypatch.setattr(gambit.bench.search, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    with pytest.raises(SystemExit) as e:
        main(["bench", "search", *args])
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith(f"gambit bench search: error: {message}")


def test_a_value_from_the_config_file_keeps_its_key(tmp_path, capsys):
    from gambit.cli import main

    cfg = tmp_path / "b.yaml"
    cfg.write_text("kv_share: 0\n")
    with pytest.raises(SystemExit) as e:
        main(["bench", "search", "--config", str(cfg)])
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith("gambit bench search: error: kv_share must be in (0, 4]")


def test_the_help_says_what_c_r_and_delta_are(capsys):
    from gambit.cli import main

    with pytest.raises(SystemExit):
        main(["bench", "search", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "C: traces per problem" in text and "Gambit δ: score floor" in text
    assert "r, Gambit and STEP: above this share of the KV cache in use" in text and "float16" in text


def test_the_bar_moves_as_each_run_ends():
    """The bar moved once per chunk: 0/4 to 2/4 after four minutes."""
    from types import SimpleNamespace

    from gambit.bench.search import run_variants
    from gambit.search.results import RunResult
    from gambit.search.run_state import TIMING_KEYS

    ticks = []

    class Driver:
        timings = dict.fromkeys(TIMING_KEYS, 0.0)
        engine = SimpleNamespace(stats=SimpleNamespace(spec_drafts=0, spec_capped_steps=0))
        store = SimpleNamespace(load=lambda rid: {"rounds": []})

        def submit(self, p, cfg, run_id):
            return run_id

        def run_until_done(self, ids, on_event=None):
            out = {}
            for rid in ids:
                ev = RunResult.__new__(RunResult)
                ticks.append(("ended", rid))
                on_event(ev)
                out[rid] = SimpleNamespace(finished_traces=1, correct=True, tokens=1, wall_s=0.1, branched=0,
                                           pruned=0, evicted=0, majority="1", weighted="1", traces=[])
            return out

    bar = SimpleNamespace(update=lambda n: ticks.append(("bar", n)))
    cfg = SimpleNamespace(concurrency=2)
    problems = [SimpleNamespace(answer=1)] * 3
    run_variants({"": Driver()}, ["sc"], {"sc": ("", None)}, problems, cfg, bar, {})
    assert [t[0] for t in ticks] == ["ended", "bar"] * 3 and {n for k, n in ticks if k == "bar"} == {1}
