"""Lineage (gambit inspect) from both stores, and the live view's two modes."""

from __future__ import annotations

import io
import uuid

import pytest

from gambit.cli import main
from gambit.search.config import SearchConfig
from gambit.search.driver import SearchDriver
from gambit.search.lineage import inspect_run, lineage_png, lineage_text
from gambit.search.live import LiveView
from gambit.search.results import Progress


def test_lineage_from_memory_file_and_redis(make_engine, scorer, hard_problems, redis_store, tmp_path):
    driver = SearchDriver(make_engine(num_blocks=40), scorer, redis_store)
    rid = driver.submit(hard_problems[0], SearchConfig(capacity=6, swap=2, interval=4, warmup=12),
                        run_id="lin1")
    res = driver.run_until_done()[rid]
    data = redis_store.load(rid)
    text = lineage_text(rid, data)
    lines = text.splitlines()
    # one line per node, children drawn under their parent with the branch step
    assert sum(("root" in ln) for ln in lines) == 6
    assert sum("branched @step" in ln for ln in lines) == res.branched
    assert text.count("pruned @step") == res.pruned
    assert f"answer {res.answer}" in text and "(winner)" in text
    for r in data["rounds"]:
        for p, c in r["branched"]:
            assert data["nodes"][c]["parent"] == p and data["nodes"][c]["birth_step"] == r["step"]
    # the same text from a JSON file of the memory store, and from Redis through the CLI
    from gambit.search.store import MemoryStore, RunUpdate

    mem = MemoryStore()
    mem.update(rid, RunUpdate(data["meta"], list(data["nodes"].values()), data["rounds"], data["result"]))
    path = mem.save(tmp_path / "s.json")
    assert inspect_run(rid, str(path)) == text
    url = f"{redis_store.url}"
    from gambit.search.redis_store import RedisStore

    assert lineage_text(rid, RedisStore(url, prefix=redis_store.prefix).load(rid)) == text
    png = lineage_png(rid, data, tmp_path / "t.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert main(["inspect", "nope", "--store", str(path)]) == 2
    # a served run: the services keep their trees under "gambit:tree"; `gambit inspect RUN --store URL`
    # looks there too (it looked under "gambit" only, so no served run was ever found)
    served = RedisStore(url, prefix="gambit:tree")
    sid = f"lin-served-{uuid.uuid4().hex[:8]}"
    served.update(sid, RunUpdate(data["meta"], list(data["nodes"].values()), data["rounds"], data["result"]))
    try:
        assert inspect_run(sid, url) == lineage_text(sid, data)
        assert inspect_run(sid, url, prefix="gambit:tree") == lineage_text(sid, data)
        # under the wrong prefix: the error names the one that holds it
        with pytest.raises(ValueError, match=f"run '{sid}' is not in .* under 'gambit'.*it is under "
                                             f"'gambit:tree': pass --prefix gambit:tree"):
            inspect_run(sid, url, prefix="gambit")
    finally:
        served.delete(sid)


def test_live_view_tty_redraws_and_plain_lines():
    p = Progress("r", "gambit", 3, 24, 8, 2, 6, 4, 4, 2, 1, 300, 0.5, {"42": 1})
    buf = io.StringIO()
    v = LiveView(buf, tty=True)
    v.update(p)
    v.update(p)
    out = buf.getvalue()
    assert out.count("\x1b[3F") == 1 and "●●●●●●○○" in out and "KV [" in out and "42 ×1" in out
    buf = io.StringIO()
    v = LiveView(buf, tty=False, min_interval_s=3600)
    v.update(p)
    v.update(p)  # rate-limited: one line
    assert buf.getvalue().count("\n") == 1 and "\x1b" not in buf.getvalue()


def test_a_long_prompt_is_shown_by_its_start_and_end():
    from gambit.search.lineage import _clip

    short = "Compute (4+5)*3.\nSolution:\n"
    assert _clip(short) == short
    long = "<|im_start|>system\n" + "x" * 300 + "\nWhat is 12 + 30?<|im_end|>\n<|im_start|>assistant\n"
    got = _clip(long)
    assert len(got) == 60 + 3 + 140 and got.startswith("<|im_start|>system") and " … " in got
    assert got.endswith("What is 12 + 30?<|im_end|>\n<|im_start|>assistant\n")


def test_a_trace_cut_at_the_token_limit_and_one_without_an_answer_say_so():
    """A trace the token limit ended is not one that finished by itself, and a finished trace that gave no
    answer casts no vote: the lineage says both."""
    from gambit.search.lineage import _label

    node = {"id": 3, "parent": None, "scores": [0.5], "birth_step": 0, "birth_depth": 0, "state": "finished",
            "end_step": 159, "end_reason": "length", "answer": None, "tokens": [1] * 160}
    assert _label(node, "7", "7") == ("#3 root; finished at the token limit @step 159; 160 tokens; "
                                      "score 0.50 (1) no answer")
    node |= {"end_reason": "eos", "answer": "7", "end_step": 40, "tokens": [1] * 41}
    assert _label(node, "7", "7") == ("#3 root; finished @step 40; 41 tokens; score 0.50 (1) "
                                      "answer 7 ✓ (winner)")


def test_the_picture_labels_a_finished_trace_without_an_answer():
    """In the PNG a finished trace with no answer had a wrong answer's colour and no text at all."""
    from gambit.search.lineage import bar_label

    node = {"state": "finished", "end_reason": "eos", "answer": None}
    assert bar_label(node, "12") == "no answer"
    assert bar_label(node | {"end_reason": "length"}, "12") == "no answer (token limit)"
    assert bar_label(node | {"answer": "12"}, "12") == "12 ✓"
    assert bar_label(node | {"answer": "80"}, "12") == bar_label(node | {"answer": "80"}, None) == "80"
    assert bar_label({"state": "pruned", "answer": None}, "12") == ""


def test_the_lineage_lists_votes_most_first():
    """The summary printed the votes as a Python dict in insertion order (``{'80': 8, '101': 1, '81': 1,
    '1200': 2, ...}``); now most votes first, as the live view shows them."""
    from gambit.search.vote import vote_counts

    assert vote_counts({"80": 8, "101": 1, "1200": 2, "15": 2}) == "80 ×8, 1200 ×2, 15 ×2, 101 ×1"
    assert vote_counts({}) == "none"


def test_the_header_shows_the_knobs_that_steer_its_method():
    """An SC run's lineage said "K=4 Δ=8 w=24 δ=0.0 r=0.9", knobs it never read."""
    from gambit.search.lineage import knobs

    c = SearchConfig(capacity=8).to_dict()
    assert knobs(c) == "C=8 K=4 Δ=8 w=24 δ=0.0 r=0.9"
    assert knobs({**c, "method": "sc"}) == "C=8"
    assert knobs({**c, "method": "step"}) == "C=8 r=0.9"  # STEP scores every boundary: w steers nothing
    assert knobs({**c, "method": "deepconf"}) == "C=8 warm-up 4 keep 90%"
    assert knobs({**c, "method": "deepconf", "capacity": 3, "deepconf_warmup": 0}) == "C=3 warm-up 2 keep 90%"


def test_the_lineage_says_which_traces_were_evicted(make_engine, scorer, hard_problems):
    """A ghost pruned by a later swap printed as a plain "pruned": 11 evictions, 4 of them shown."""
    driver = SearchDriver(make_engine(num_blocks=24), scorer)
    rid = driver.submit(hard_problems[0], SearchConfig(capacity=8, swap=2, interval=4, warmup=12,
                                                        kv_ratio=0.9))
    res = driver.run_until_done()[rid]
    data = driver.store.load(rid)
    evicted = [n for n in data["nodes"].values() if n["evicted_step"] is not None]
    assert res.evicted >= len(evicted) > 0
    text = lineage_text(rid, data)
    assert text.count("(evicted @step ") == len(evicted)
    # a ghost swapped out by a later round
    assert any(n["state"] == "pruned" and n["end_reason"] == "pruned" for n in evicted)


def _run(n: int, chain: bool = False, **config) -> dict:
    """A stored run of ``n`` traces: a chain (each branched from the one before) or six roots with the
    rest branched from them."""
    cfg = SearchConfig(capacity=6).to_dict() | config
    nodes = {}
    for i in range(n):
        parent = (i - 1 if i else None) if chain else (None if i < 6 else i % 6)
        nodes[i] = {"id": i, "parent": parent, "birth_step": i, "birth_depth": i, "state": "pruned",
                    "answer": None, "end_step": i + 10, "end_reason": "pruned", "evicted_step": None,
                    "tokens": [5] * 5, "scores": [0.5]}
    meta = {"config": cfg, "prompt": "Compute 2+3.\nSolution:\n", "gold": "5", "step": n + 10, "round": 3,
            "tokens": 5 * n, "branched": n - 1, "pruned": n, "evicted": 0}
    result = {"answer": "5", "vote_rule": "majority", "majority": "5", "weighted": "5", "votes": {"5": 1},
              "reason": "done", "correct": True}
    return {"meta": meta, "nodes": nodes, "rounds": [], "result": result}


def test_a_deep_or_wide_run_is_drawn_and_listed(tmp_path):
    """A 1500-deep branch chain (32k tokens at w=24) ended `inspect --png` in a RecursionError, and 5000
    traces drew a 1375x88165 px picture in 87 s (20000: not done in 300 s). The walks are loops now and
    the picture draws the first ``MAX_ROWS`` traces depth-first, saying how many it left out."""
    from PIL import Image

    deep = _run(1500, chain=True)
    text = lineage_text("deep", deep, max_nodes=2000)
    assert len(text.splitlines()) == 4 + 1500 and "#1499 branched" in text.splitlines()[-1]
    png = lineage_png("deep", deep, tmp_path / "deep.png")
    from gambit.search.lineage import MAX_ROWS

    tall = Image.open(png).size[1]
    assert tall <= (0.16 * MAX_ROWS + 1.5) * 110 + 1
    wide = _run(MAX_ROWS + 700)
    assert Image.open(lineage_png("wide", wide, tmp_path / "wide.png")).size[1] == tall
    assert lineage_text("wide", wide).endswith(f"... {MAX_ROWS + 700 - 400} more nodes")


def test_the_picture_says_how_many_traces_it_left_out():
    from gambit.search.lineage import drawn_rows

    order, note = drawn_rows(_run(10), max_rows=4)
    assert order == [0, 6, 1, 7] and "6 more traces not drawn" in note
    assert drawn_rows(_run(3), max_rows=4) == ([0, 1, 2], "")


@pytest.mark.parametrize("where, key", [("config", "decoding"), ("config", "kv_ratio"), ("meta", "evicted"),
                                        ("result", "vote_rule"), ("node", "birth_depth"), ("meta", "config")])
def test_a_record_that_lacks_a_field_is_one_line_naming_it(tmp_path, capsys, where, key):
    """A record without a field lineage reads (hand-edited, truncated, another tool's) gave a traceback
    ending in ``KeyError: 'decoding'``."""
    import json

    run = _run(8)
    part = {"config": run["meta"]["config"], "meta": run["meta"], "result": run["result"],
            "node": run["nodes"][6]}[where]
    part.pop(key)
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"old": run}))
    with pytest.raises(ValueError, match=f"run 'old': its record lacks '{key}'"):
        inspect_run("old", str(path))
    assert main(["inspect", "old", "--store", str(path), "--png", str(tmp_path / "o.png")]) == 2
    assert f"lacks '{key}'" in capsys.readouterr().err


def test_a_deepconf_record_without_its_warm_up_is_one_line(tmp_path):
    import json

    run = _run(8, method="deepconf")
    run["meta"]["config"].pop("deepconf_warmup")
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"dc": run}))
    with pytest.raises(ValueError, match="run 'dc': its record lacks 'deepconf_warmup'"):
        inspect_run("dc", str(path))


def test_last_with_no_run_under_the_prefixes_tried_names_the_ones_that_hold_runs():
    """`gambit inspect last --store redis://...` said "runs there: []" with the runs under another
    prefix; a named run id got the hint, 'last' did not."""
    from gambit.search.redis_store import RedisStore
    from gambit.search.store import RunUpdate

    url = "redis://127.0.0.1:6379/13"
    prefix = f"test-{uuid.uuid4().hex[:8]}:tree"
    store = RedisStore(url, prefix=prefix)
    try:
        store.update("r1", RunUpdate(meta={"step": 1}))
        with pytest.raises(ValueError, match=f"runs there: \\[\\]\\); runs are under .*'{prefix}'.*--prefix"):
            inspect_run("last", url, prefix=f"{prefix}-not")
    finally:
        store.clear()


def test_inspect_help_says_what_each_flag_takes(capsys):
    """--store hid its default, --prefix named `gambit run` (it writes JSON only) as a Redis writer, and
    --png said PNG while a .jpg path got a JPEG."""
    with pytest.raises(SystemExit):
        main(["inspect", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "default: results/run_store.json" in out and "bench rounds --store" in out
    assert "by its suffix" in out and "<prefix>tree" in out


def test_a_run_with_no_result_in_its_tree_says_where_to_look():
    """A served run whose replica was lost ends "failed" in its record, with no result in its tree:
    the lineage said only "(unfinished)", as for a run still going."""
    run = _run(3) | {"result": None}
    assert "(unfinished: no result in its tree; for a served run `gambit client get" in lineage_text("u", run)
