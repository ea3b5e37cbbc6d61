"""The search bench's target checks: what counts as met."""

from __future__ import annotations

from gambit.bench.search_report import FASTER_BY, check_targets


def _out(gambit: dict, step: dict, pr: dict) -> dict:
    base = {"accuracy": 0.75, "tokens": 1000.0, "wall_s": 1.0, "trace_throughput": 10.0,
            "overhead_fraction": 0.02}
    sc = dict(base, accuracy=0.5)
    m = {"sc": sc, "step": dict(base, **step), "gambit": dict(base, **gambit), "gambit_pr": dict(base, **pr)}
    return {"by_difficulty": {"hard": {"methods": m}}}


def _met(out: dict, name: str) -> bool:
    return next(t["met"] for t in check_targets(out) if name in t["target"])


def test_pr_faster_means_beyond_noise_not_parity():
    assert not _met(_out({}, {}, {"wall_s": 0.99}), "Gambit+PR faster")  # parity
    assert _met(_out({}, {}, {"wall_s": 1 - FASTER_BY - 0.01}), "Gambit+PR faster")
    assert not _met(_out({}, {}, {"wall_s": 0.5, "accuracy": 0.6}), "Gambit+PR faster")  # lost accuracy


def test_pr_faster_needs_speculation_to_have_run():
    """Every step capped (no tree drafted): Gambit+PR decoded plainly, so a lower wall is noise."""
    fast = {"wall_s": 0.8}
    assert not _met(_out({}, {}, dict(fast, spec_drafts=0, spec_capped_steps=98)), "Gambit+PR faster")
    assert _met(_out({}, {}, dict(fast, spec_drafts=40, spec_capped_steps=58)), "Gambit+PR faster")


def test_throughput_with_nothing_answered_is_not_met():
    assert not _met(_out({"trace_throughput": 0.0}, {"trace_throughput": 0.0}, {}), "trace throughput")
    assert _met(_out({"trace_throughput": 15.0}, {"trace_throughput": 10.0}, {}), "trace throughput")


def test_pr_faster_is_judged_on_the_median_chunk_pair():
    """One slow spell landing on Gambit's chunks moves the total walls, not the median pair."""
    g = {"wall_s": 1.0, "chunk_walls": [1.0, 1.0, 1.0, 3.0]}
    slower = {"wall_s": 0.9, "chunk_walls": [1.02, 1.01, 1.03, 1.0]}  # total 0.68x, typical chunk 1.02x
    assert not _met(_out(g, {}, slower), "Gambit+PR faster")
    faster = {"wall_s": 1.3, "chunk_walls": [0.9, 0.9, 0.9, 3.9]}  # total 1.1x, typical chunk 0.9x
    assert _met(_out(g, {}, faster), "Gambit+PR faster")
    t = next(t for t in check_targets(_out(g, {}, faster)) if "Gambit+PR" in t["target"])
    assert t["paired"] == {"median": 0.9, "min": 0.9, "max": 1.3, "pairs": 4}
    assert "per chunk 0.90x [0.90, 1.30] over 4" in t["detail"]


def test_throughput_pairs_traces_per_second_chunk_by_chunk():
    g = {"trace_throughput": 12.0, "chunk_walls": [1.0, 1.0, 2.0], "chunk_finished": [16, 16, 16]}
    st = {"trace_throughput": 10.0, "chunk_walls": [1.0, 1.0, 1.0], "chunk_finished": [10, 10, 12]}
    t = next(t for t in check_targets(_out(g, st, {})) if "trace throughput" in t["target"])
    assert t["paired"]["median"] == 1.6 and t["met"]  # 1.6, 1.6, 0.667 per chunk
    assert _met(_out({"trace_throughput": 15.0, "chunk_walls": [1.0]}, {"trace_throughput": 10.0}, {}),
                "trace throughput")  # unpaired (no STEP chunks): the totals decide


def test_chunks_of_different_merged_runs_are_not_paired(tmp_path):
    """``--merge`` of two runs: their chunks did not run back to back, so the totals decide."""
    import json

    from gambit.bench.search_report import merge_results

    g = {"wall_s": 1.0, "chunk_walls": [1.0, 1.0, 1.0]}
    pr = {"wall_s": 0.9, "chunk_walls": [1.0, 1.0, 0.7]}  # paired median 1.0x, totals 0.9x
    base = _out({}, {}, {})["by_difficulty"]["hard"]["methods"]
    parts = []
    for name, m in (("a", {"gambit": dict(base["gambit"], **g)}),
                    ("b", {"gambit_pr": dict(base["gambit_pr"], **pr)})):
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps({"config": {}, "by_difficulty": {"hard": {"methods": m}}}))
        parts.append(str(f))
    t = next(t for t in check_targets(merge_results(parts)) if "Gambit+PR" in t["target"])
    assert t["paired"] is None and t["met"]  # 0.9x of the totals
    one = _out(g, {}, pr)  # the same numbers from one run: paired, parity
    assert not _met(one, "Gambit+PR faster")


def test_the_headline_set_is_the_hard_end_or_a_benchmark_never_the_whole_range():
    from gambit.bench.search_report import _headline_label, headline, headline_set

    assert headline("hard") and headline("gpqa") and not headline("all")
    m = {"methods": {"sc": {}}}
    task = {"by_difficulty": {"all": dict(m, ops=[2, 8]), "hard": dict(m, ops=[6, 8])}}
    assert headline_set(task) is task["by_difficulty"]["hard"] and _headline_label(task) == "hard: 6-8 ops"
    bench = {"by_difficulty": {"gsm8k": dict(m, ops=None)}}
    assert headline_set(bench) is bench["by_difficulty"]["gsm8k"] and _headline_label(bench) == "gsm8k"
    assert headline_set({"by_difficulty": {"all": dict(m, ops=[2, 8])}}) == {}  # the hard-end tables skip it


def test_sc_targets_need_no_step_run():
    """`--methods gambit,sc` with the frontier: the SC targets are judged (they needed STEP in the run)."""
    base = {"accuracy": 0.6, "tokens": 1288.0, "wall_s": 1.0, "trace_throughput": 10.0,
            "overhead_fraction": 0.04}
    m = {"gambit": base, "sc": dict(base, accuracy=0.599, tokens=1289.0),
         "gambit@8": dict(base, accuracy=0.646, tokens=646.0), "gambit@4": dict(base, accuracy=0.7)}
    got = {t["target"]: t["met"] for t in check_targets({"by_difficulty": {"hard": {"methods": m}}})}
    assert got == {"[hard] Gambit accuracy >= SC@C with <= 50% of SC's tokens": False,
                   "[hard] frontier: gambit@8 accuracy >= SC@C": True}


def test_table_1_shows_whichever_main_methods_ran():
    """README's `--methods gambit,sc` command (the half-token target) printed no Table 1: it needed sc,
    step and gambit all three; Table 2 is printed only when a scorer-comparison row ran."""
    from gambit.bench.search_report import format_tables

    split = {k: 0.2 for k in ("forward", "guidance", "tree", "scheduling", "other")}
    row = {"accuracy": 0.6, "majority_accuracy": 0.55, "weighted_accuracy": 0.6, "tokens": 1200.0,
           "wall_s": 2.0, "trace_throughput": 8.0, "finished_traces": 12.0, "evicted": 0.0,
           "overhead_fraction": 0.03, "problems": 192, "time_split": split}
    out = {"config": {"capacity": 16}, "targets": [],
           "by_difficulty": {"hard": {"ops": [6, 8], "kv_blocks_per_run": 120,
                                      "methods": {"gambit": row, "sc": dict(row, accuracy=0.5)}}}}
    text = format_tables(out)
    assert "Table 1 — hard (6-8 operations, 192 problems, C=16, 120 KV blocks per run)" in text
    assert "| sc | 50.0% |" in text and "| gambit | 60.0% |" in text and "Table 2" not in text
    out["by_difficulty"]["hard"]["methods"]["gambit_mlp"] = row
    assert "Table 2 — scorers" in format_tables(out)
