"""Every bench's output paths (``--json``, ``--plot``, ``--plots``) are checked before its run: a path
that cannot be written once failed after the whole measurement, and the result was lost."""

from __future__ import annotations

import json
import re

import pytest
from bench_util import refused_before

from gambit.bench import args as bench_args
from gambit.paths import TARGET

UNDER_A_FILE = "{tmp}/file.txt/x.json"  # /etc/passwd/x.json in the report: a file used as a folder


@pytest.mark.parametrize(("flag", "value", "kw", "message"), [
    ("--json", "{tmp}", {}, "--json {tmp}: a directory; give a file path"),
    ("--json", UNDER_A_FILE, {}, "--json {tmp}/file.txt/x.json: {tmp}/file.txt is a file, not a folder"),
    ("--json", "/proc/gambit-bench/x.json", {}, "--json /proc/gambit-bench/x.json: cannot write in /proc"),
    ("--plots", "{tmp}/file.txt", {"folder": True}, "--plots {tmp}/file.txt: a file; give a folder"),
    ("--plots", "/proc/gambit-plots", {"folder": True}, "--plots /proc/gambit-plots: cannot write in /proc"),
    ("--plot", "{tmp}/p.txt", {"image": True}, "--plot {tmp}/p.txt: a picture is written as .png"),
])
def test_an_output_that_cannot_be_written_is_refused(tmp_path, flag, value, kw, message):
    (tmp_path / "file.txt").write_text("")
    with pytest.raises(ValueError, match="^" + re.escape(message.format(tmp=tmp_path))):
        bench_args.out_path(flag, value.format(tmp=tmp_path), **kw)


def test_a_writable_output_passes_and_nothing_is_created(tmp_path):
    for value, kw in ((f"{tmp_path}/new/deeper/x.json", {}), (f"{tmp_path}/plots", {"folder": True}),
                      (str(tmp_path), {"folder": True}), (f"{tmp_path}/p.svg", {"image": True}),
                      ("", {}), (None, {})):
        bench_args.out_path("--json", value, **kw)
    assert list(tmp_path.iterdir()) == []


BAD_JSON = ["--json", "/proc/gambit-bench/x.json"]
CANNOT = "--json /proc/gambit-bench/x.json: cannot write in /proc"


def test_engine_refuses_its_outputs_before_any_backend(monkeypatch):
    from gambit.bench import engine

    refused_before(monkeypatch, engine, "run_engine_bench", engine.main, BAD_JSON, CANNOT)
    refused_before(monkeypatch, engine, "run_engine_bench", engine.main, ["--plot", "/proc/gb/p.png"],
                   "--plot /proc/gb/p.png: cannot write in /proc")


def test_pools_rounds_linears_and_profile_refuse_it_before_the_work(monkeypatch):
    import gambit.model.loader
    from gambit.bench import linears, pools, profile_step, search_rounds

    refused_before(monkeypatch, pools, "run_child", pools.main, BAD_JSON, CANNOT)
    refused_before(monkeypatch, gambit.model.loader, "load_model", search_rounds.main, BAD_JSON, CANNOT)
    model = ["--model", str(TARGET)]
    refused_before(monkeypatch, linears, "measure", linears.main, [*model, *BAD_JSON], CANNOT)
    refused_before(monkeypatch, profile_step, "profile", profile_step.main, [*model, *BAD_JSON], CANNOT)


def test_spec_refuses_its_outputs_before_the_engine_loads(monkeypatch):
    from gambit.bench import spec

    refused_before(monkeypatch, spec, "run_bench", spec.main, BAD_JSON, CANNOT)
    refused_before(monkeypatch, spec, "run_bench", spec.main, ["--plots", "/proc/gb"],
                   "--plots /proc/gb: cannot write in /proc")


def test_search_refuses_its_outputs_before_the_model_loads(monkeypatch):
    from gambit.bench import search

    cfg = search.BenchSearchConfig(quick=True)
    refused_before(monkeypatch, search, "load_model", lambda a: search.run_bench(cfg, a[0]),
                   ["/proc/gambit-bench/x.json"], CANNOT)
    cfg.plots = "/proc/gb"
    refused_before(monkeypatch, search, "load_model", lambda a: search.run_bench(cfg, a[0]), [""],
                   "--plots /proc/gb: cannot write in /proc")


def test_serve_refuses_its_outputs_before_the_wiring_starts(monkeypatch):
    from gambit.bench import serve

    refused_before(monkeypatch, serve, "bench", serve.main, ["--quick", *BAD_JSON], CANNOT)
    refused_before(monkeypatch, serve, "bench", serve.main, ["--quick", "--plot", "/proc/gb/p.png"],
                   "--plot /proc/gb/p.png: cannot write in /proc")


def test_pools_makes_the_json_folder_and_says_where_it_wrote(tmp_path, monkeypatch, capsys):
    """`--json results/bench_pools.json` on a fresh checkout (no results/) lost a minutes-long run to
    "No such file or directory", after printing the table."""
    from gambit.bench import pools

    monkeypatch.setattr(pools, "run_child", lambda *a: {"latency_s": 0.5, "switches_per_step": 1.0})
    out = tmp_path / "results" / "bench_pools.json"
    assert pools.main(["--reps", "1", "--runs", "1", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["two_over_one"] == 1.0
    assert f"wrote {out}" in capsys.readouterr().out
