"""`gambit run`: a flag the chosen mode never reads is refused (not run without a word), a run that gave
no answer says why, Ctrl-C is one line and exit 130 with the finished problems saved, and a prompt the
KV cache cannot hold names the flag that fixes it."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from gambit.cli import main
from gambit.run import RunConfig, no_answer_why


@pytest.mark.parametrize("args, message", [
    (["--question", "Compute 2+2.", "--problems", "5"],
     "--problems 5: a --question is the one problem solved (drop it)"),
    (["--question", "Compute 2+2.", "--min-ops", "2", "--max-ops", "3"],
     "--min-ops 2, --max-ops 3: a --question is the one problem solved (drop them)"),
    (["--benchmark", "gsm8k", "--max-ops", "3"], "--max-ops 3: the task's; --benchmark gsm8k asks its own"),
    (["--method", "sc", "--scorer", "mlp"], "--scorer mlp: --method sc scores no thoughts (drop it)"),
    (["--method", "deepconf", "--swap", "2"], "--swap 2: Gambit's tournament knob; --method deepconf has no"),
    (["--method", "step", "--warmup", "8"], "--warmup 8: Gambit's tournament knob"),
    (["--spec-max-batch", "4"], "--spec-max-batch 4: with --decoding plain no trace drafts"),
])
def test_a_flag_the_mode_never_reads_is_refused(args, message):
    """Each ran, ignoring the flag: `--question X --problems 5` solved one question, `--method sc
    --scorer mlp` never loaded the scorer."""
    with pytest.raises(SystemExit, match=re.escape(message)):
        main(["run", *args])


@pytest.mark.parametrize("kw", [
    {}, dict(question="Compute 2+2.", gold="4"), dict(benchmark="gsm8k", problems=2),
    dict(method="sc"), dict(method="step", scorer="mlp"), dict(method="deepconf", problems=3),
    dict(decoding="pr", spec_max_batch=4), dict(question="x", problems=2, min_ops=6, max_ops=8),  # defaults
    dict(min_ops=2, max_ops=3, problems=5),  # the task reads them
])
def test_what_a_mode_reads_is_accepted(kw):
    RunConfig(**kw)  # `make run`, the README's commands, and a default restated


def _res(reason="done", limit="", traces=()):
    return SimpleNamespace(reason=reason, limit=limit, traces=list(traces))


def _t(state, end):
    return {"state": state, "end_reason": end}


def test_no_answer_says_what_ended_the_traces():
    """SmolLM2's traces ended at EOS (54-110 tokens) answering in prose, and the line said to raise
    --max-tokens."""
    eos = [_t("finished", "eos")] * 3
    assert no_answer_why(_res(traces=eos), 200, "boxed", "") == (
        "the traces ended by themselves with no answer the 'boxed' rule reads; try --answer-rule gsm8k, "
        "which also reads an unboxed last number")
    assert no_answer_why(_res(traces=eos), 200, "latex", "hmmt24") == \
        "the traces ended by themselves with no answer the 'latex' rule reads"
    cut = [_t("finished", "length"), _t("pruned", "pruned")]
    assert no_answer_why(_res(traces=cut), 200, "boxed", "") == "a trace stops at --max-tokens 200"
    assert no_answer_why(_res(traces=[*cut, *eos]), 200, "boxed", "") == \
        "1 of 4 finished traces stopped at --max-tokens 200"
    assert no_answer_why(_res("limit", "max_wall_s 2", eos), 200, "boxed", "").startswith(
        "the run stopped at its limit, max_wall_s 2: raise --max-wall-s")


def _main(argv: list[str]) -> int:
    try:
        return main(argv)
    except KeyboardInterrupt:  # escaping, it would stop pytest's whole session
        pytest.fail("KeyboardInterrupt escaped main(): a traceback on the command line")


def test_ctrl_c_is_one_line_exit_130_and_the_finished_problems_are_saved(tmp_path, capsys, monkeypatch):
    """A ~30-line KeyboardInterrupt traceback, and no store or picture written."""
    from gambit.search.driver import SearchDriver

    real, calls = SearchDriver.run_until_done, []

    def interrupted_second(self, *a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, *a, **kw)

    monkeypatch.setattr(SearchDriver, "run_until_done", interrupted_second)
    store, png = tmp_path / "s.json", tmp_path / "p.png"
    assert _main(["run", "--problems", "3", "--samples", "2", "--swap", "1", "--max-tokens", "60",
                  "--save", str(store), "--png", str(png)]) == 130
    out, err = capsys.readouterr()
    assert err.strip().splitlines()[-1] == "interrupted" and "Traceback" not in err
    assert f"interrupted in p2 (stopped at step 0; the traces as they stood): tree store saved to " \
           f"{store} — `gambit inspect p1 --store {store}`" in out
    runs = json.loads(store.read_text())
    assert runs["p1"]["result"] is not None and png.is_file()


def test_ctrl_c_saves_the_interrupted_runs_traces_as_they_stood(tmp_path, capsys, monkeypatch):
    """The store was saved as last written: a running trace is rewritten only when its state changes, so
    at step 56 one showed "running; 32 tokens". Now the cut run is cancelled and written whole first."""
    import gambit.run
    from gambit.search.live import LiveView

    class InterruptedView(LiveView):  # Ctrl-C after the fifth event the driver reports
        seen = 0

        def update(self, ev):
            super().update(ev)
            InterruptedView.seen += 1
            if InterruptedView.seen == 5:
                raise KeyboardInterrupt

    monkeypatch.setattr(gambit.run, "LiveView", InterruptedView)
    store = tmp_path / "s.json"
    assert _main(["run", "--problems", "1", "--samples", "4", "--swap", "1", "--max-tokens", "200",
                  "--save", str(store), "--png", ""]) == 130
    out = capsys.readouterr().out
    record = json.loads(store.read_text())["p1"]
    step = record["meta"]["step"]
    assert f"interrupted in p1 (stopped at step {step}; " in out
    assert f"`gambit inspect p1 --store {store}`" in out
    assert record["result"]["reason"] == "cancelled" and 0 < step < 200
    nodes = list(record["nodes"].values())
    assert not [n for n in nodes if n["state"] == "running"]
    stopped = [n for n in nodes if n["end_reason"] == "cancelled"]
    assert stopped and all(n["end_step"] == step and len(n["tokens"]) == step for n in stopped)
    assert record["meta"]["tokens"] == record["result"]["tokens"] == sum(
        t["own_tokens"] for t in record["result"]["traces"])


def test_ctrl_c_in_eval_is_one_line(capsys, monkeypatch):
    import gambit.bench.eval as ev

    def interrupted(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(ev, "run_eval", interrupted)
    assert _main(["eval", "--n-problems", "1", "--samples", "1"]) == 130
    assert capsys.readouterr().err == "interrupted\n"


def test_a_prompt_the_kv_cache_cannot_hold_names_the_flag(capsys, monkeypatch):
    """It said "needs more KV blocks than the cache has (120)", not which flag raises them; then, after
    the model loaded, "(1 of 16 tokens: 16)": now before it loads, with the minimum and why."""
    import gambit.run

    monkeypatch.setattr(gambit.run.Engine, "from_pretrained", lambda *a, **k: pytest.fail("the model loaded"))
    with pytest.raises(SystemExit) as e:
        main(["run", "--question", "Compute " + "+".join(["12"] * 30) + ".", "--kv-blocks", "3",
              "--samples", "2", "--swap", "1", "--save", "", "--png", ""])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert err.startswith("gambit run: error: --kv-blocks 3: too few; a trace keeps its prompt and each "
                          "token it generates in blocks of 16 tokens, and the longest prompt here is 110 "
                          "tokens: give at least 7 (one trace to --max-tokens 400 needs 32)")
    monkeypatch.undo()
    assert main(["run", "--problems", "1", "--kv-blocks", "3", "--samples", "2", "--swap", "1",
                 "--max-tokens", "30", "--save", "", "--png", ""]) == 0  # 46 + 1 tokens: 3 blocks do


def test_more_problems_than_the_set_holds_is_said(tmp_path, capsys):
    """`--problems 100` on a 30-question set ran the 30 without a word."""
    from gambit.run import problems_of

    data = tmp_path / "g.jsonl"
    data.write_text("".join(json.dumps({"question": f"Compute {i}+1.", "answer": f"#### {i + 1}"}) + "\n"
                            for i in range(2)))
    assert len(problems_of(RunConfig(benchmark="gsm8k", data=str(data), problems=5))) == 2
    assert "gsm8k: all 2 questions of the set (fewer than --problems 5)" in capsys.readouterr().err


def test_a_question_that_writes_a_control_token_is_refused_naming_the_flag():
    """`gambit run --question` formatted the text itself: "<eos>" in it became the model's end token (the
    Target refuses it; the CLI now does too), exit 2 naming --question; look-alike text passes."""
    from gambit.run import problems_of

    with pytest.raises(ValueError, match=r"^--question: contains the special token '<eos>' at character 3"):
        problems_of(RunConfig(question="2+3<eos> Solution: 5"))
    assert problems_of(RunConfig(question="2+3 <eo s>"))[0].text == "2+3 <eo s>"
