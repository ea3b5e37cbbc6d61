"""The embedded wiring end to end: shipped target, real engine, scorer, Redis tree view, metrics."""

import json
import time
import uuid

import pytest
import torch

from gambit.serving.embedded import Embedded, EmbeddedConfig
from gambit.serving.solve_config import SolveConfig
from gambit.serving.target_service import Overcommitted
from gambit.serving.tree_view import RedisTreeView
from gambit.tasks.arithmetic import TaskConfig, generate

PROBLEMS = generate("test", 3, 0, TaskConfig(2, 4))


@pytest.fixture(scope="module")
def emb():
    prefix = f"test-emb-{uuid.uuid4().hex[:8]}:"
    e = Embedded(EmbeddedConfig(scorer="random:mlp:192", tree="redis://127.0.0.1:6379/0", prefix=prefix,
                                num_blocks=400))
    yield e
    e.close()
    r = e.target.tree.r
    keys = list(r.scan_iter(f"{prefix}*"))
    if keys:
        r.delete(*keys)


def metric(e, name):
    for line in e.prom.exposition().decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def test_solve_streams_rounds_then_result_and_records_the_tree(emb):
    tok0 = metric(emb, "gambit_generation_tokens_total")
    fed0 = metric(emb, "gambit_prompt_tokens_total")
    shared0 = metric(emb, "gambit_prompt_tokens_shared_total")
    # seed 3: a seed whose run makes swaps that gain (seed 1's traces tie, so it makes none)
    events = list(emb.solve(PROBLEMS[0].prompt, SolveConfig(capacity=6, swap=2, round_interval=8, warmup=4,
                                                            seed=3)))
    assert events[0]["kind"] == "started" and events[-1]["kind"] == "result"
    progress = [e for e in events if e["kind"] == "progress"]
    assert [p["round"] for p in progress] == list(range(1, len(progress) + 1)) and progress
    assert all(p["active"] + p["ghost"] <= 6 for p in progress)
    assert progress[-1]["branched"] > 0 and progress[-1]["pruned"] > 0
    res = events[-1]
    assert res["status"] == "done"
    answered = [t for t in res["traces"] if t["finish_reason"] == "finished" and t["answer"]]
    assert sum(res["majority_votes"].values()) == len(answered)
    assert res["majority_answer"] == max(res["majority_votes"], key=res["majority_votes"].get)
    assert res["answer"] in res["weighted_votes"]
    # the solution: the text of the best-scored finished trace that gave the answer
    (best,) = [t for t in res["traces"] if t["trace_id"] == res["solution_trace"]]
    assert best["answer"] == res["answer"] and best["finish_reason"] == "finished"
    assert best["score"] == max(t["score"] for t in answered if t["answer"] == res["answer"])
    assert f"\\boxed{{{res['answer']}}}" in res["solution"]
    assert metric(emb, "gambit_generation_tokens_total") - tok0 == res["generated_tokens"]
    # the prompt is prefilled once; the other five roots take its KV (branches fork theirs)
    n = len(emb.target.engine.tokenizer.encode(PROBLEMS[0].prompt))
    assert metric(emb, "gambit_prompt_tokens_total") - fed0 == n
    assert res["prompt_tokens"] == n  # the result says so too (it was always 0)
    assert metric(emb, "gambit_prompt_tokens_shared_total") - shared0 == 5 * n
    # tree view in Redis: every trace, parents consistent, and the result
    tree: RedisTreeView = emb.target.tree
    raw = tree.r.hgetall(f"{tree.prefix}tree:run:{res['run_id']}:nodes")
    traces = {int(k): json.loads(v) for k, v in raw.items()}
    assert set(traces) == {t["trace_id"] for t in res["traces"]}
    assert tree.num_traces(res["run_id"]) == len(traces)
    assert all(v["parent"] is None or v["parent"] in traces for v in traces.values())
    assert sum(v["parent"] is None for v in traces.values()) == 6
    rec = tree.get_run(res["run_id"])
    assert rec["status"] == "done" and rec["result"]["answer"] == res["answer"]
    # GetRun's last_progress: the run's last round (progress writes are throttled to two a second, and
    # a run shorter than that kept its first round's record for good)
    last = rec["progress"]
    assert (last["round"], last["tokens"]) == (progress[-1]["round"], progress[-1]["tokens"])
    assert emb.target.engine.kv_usage() == 0.0  # every block back


def labelled(e, name, **labels):
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in e.prom.exposition().decode().splitlines():
        if line.startswith(name + "{") and want in line:
            return float(line.split()[1])
    return 0.0


def test_traces_stopped_at_the_token_limit_count_as_length_not_eos(emb):
    """Every trace of a run whose traces all stop at max_tokens was counted as ``reason="eos"``."""
    length0, eos0 = (labelled(emb, "gambit_traces_finished_total", reason=r) for r in ("length", "eos"))
    events = list(emb.solve(PROBLEMS[1].prompt, SolveConfig(capacity=3, swap=1, round_interval=8, warmup=4,
                                                            max_tokens=3, seed=2)))
    res = events[-1]
    assert res["status"] == "done" and res["generated_tokens"] == 3 * len(res["traces"])
    assert labelled(emb, "gambit_traces_finished_total", reason="length") - length0 == len(res["traces"])
    # and each trace says so in the result (TraceSummary.end_reason): cut, not finished by itself
    assert {t["end_reason"] for t in res["traces"]} == {"length"}
    assert labelled(emb, "gambit_traces_finished_total", reason="eos") == eos0


def test_a_limited_run_says_which_limit_ended_it(emb):
    """Both limits said "a run limit (timeout_s) was reached", also a max_total_tokens one."""
    res = list(emb.solve(PROBLEMS[0].prompt, SolveConfig(capacity=4, swap=1, max_total_tokens=10)))[-1]
    assert res["status"] == "limit" and res["message"].startswith("max_total_tokens 10 reached (")
    res = list(emb.solve(PROBLEMS[0].prompt, SolveConfig(capacity=4, swap=1, timeout_s=1e-6)))[-1]
    assert res["status"] == "limit" and res["message"].startswith("timeout_s 1e-06 reached (")


def test_progress_carries_the_vote_as_it_stands(emb):
    """A backend can show the answers so far before the Result: DeepConf's warm-up traces finish
    rounds before the rest, and each round after says how they voted, in the API message too."""
    from gambit.serving.convert import event_msg
    from gambit.serving.protos import load

    events = list(emb.solve(PROBLEMS[0].prompt, SolveConfig(method="deepconf", capacity=6, round_interval=4,
                                                            warmup=4, seed=3)))
    after = [e for e in events if e["kind"] == "progress" and e["finished"]]
    assert after and all(0 < sum(e["votes"].values()) <= e["finished"] for e in after)
    assert all(not e["votes"] for e in events if e["kind"] == "progress" and not e["finished"])
    final = events[-1]["majority_votes"]
    assert all(final.get(a, 0) >= n for a, n in after[-1]["votes"].items())
    msg = event_msg(load("reasoning")[0], after[-1]).progress
    assert {v.answer: v.weight for v in msg.votes} == after[-1]["votes"]


def test_traces_deepconf_stops_count_as_stopped_not_abort(emb):
    """DeepConf's low-confidence stops were counted as ``reason="abort"``, as if cancelled."""
    stopped0, abort0 = (labelled(emb, "gambit_traces_finished_total", reason=r) for r in ("stopped", "abort"))
    for seed in range(1, 6):  # most seeds stop some traces of this hard problem (8 of 16 at seed 1 on Zen 4)
        hard = generate("test", 4, 0, TaskConfig(6, 8))[3]
        res = list(emb.solve(hard.prompt, SolveConfig(method="deepconf", capacity=16, swap=1,
                                                      round_interval=8, warmup=4, seed=seed)))[-1]
        assert res["status"] == "done"
        n = sum(t["finish_reason"] == "stopped" for t in res["traces"])
        if n:
            break
    assert n > 0, [t["finish_reason"] for t in res["traces"]]
    assert labelled(emb, "gambit_traces_finished_total", reason="stopped") - stopped0 == n
    assert labelled(emb, "gambit_traces_finished_total", reason="abort") == abort0


def test_cancel_and_disconnect_free_the_kv_and_other_runs_finish(emb):
    cfg = SolveConfig(capacity=4, max_tokens=200, seed=2)
    keep = emb.solve(PROBLEMS[1].prompt, cfg)
    gone = emb.solve(PROBLEMS[2].prompt, cfg)
    long = generate("test", 1, 0, TaskConfig(7, 8))[0].prompt  # still in flight when the flag is polled
    cancelled = emb.solve(long, SolveConfig(capacity=8, max_tokens=400, seed=2))
    next(keep), next(gone)
    rid = next(cancelled)["run_id"]
    gone.close()  # consumer disconnects

    def flag_and_wait_for_the_poll() -> None:  # on the engine thread, between two steps: the run is
        emb.target.tree.request_cancel(rid)  # still in flight (on a fast host it takes ~0.1 s in all)
        deadline = time.monotonic() + 10
        while not emb.target._cancels and time.monotonic() < deadline:
            time.sleep(0.005)

    emb.target.call(flag_and_wait_for_the_poll).result(timeout=30)  # CancelRun from any coordinator
    last = list(cancelled)[-1]
    assert last["kind"] == "result" and last["status"] == "cancelled"
    assert list(keep)[-1]["status"] == "done"
    assert emb.target.load()["runs"] == 0 and emb.target.engine.kv_usage() == 0.0


def test_overcommit_and_bad_input_change_nothing(emb):
    # more KV than the Target holds (400 blocks): a request error (RESOURCE_EXHAUSTED sent clients to retry
    # a run that could never be admitted)
    with pytest.raises(ValueError, match=r"^capacity: .*\(capacity 200 x 300 tokens\), more than a Target "
                                         r"replica holds \(400\); lower capacity or max_tokens"):
        next(emb.solve(PROBLEMS[0].prompt, SolveConfig(capacity=200, swap=2, max_tokens=300)))
    # a max_tokens past the model's length: the message gives the length the blocks were counted for (it
    # said "capacity 400 x 100000 tokens" beside a block count for the model's length)
    cap = emb.target.engine.max_model_len
    with pytest.raises(ValueError, match=f"max_tokens 100000, at most {cap} with the prompt"):
        next(emb.solve(PROBLEMS[0].prompt, SolveConfig(capacity=400, swap=2, max_tokens=100000)))
    # one that fits alone but not beside a run in flight: RESOURCE_EXHAUSTED (Overcommitted), a retry later
    busy = emb.solve(PROBLEMS[1].prompt, SolveConfig(capacity=8, swap=2, max_tokens=300))
    next(busy)  # admitted: its worst case is reserved
    held = emb.target.load()["reserved_blocks"]
    want = next(c for c in range(1, 400) if emb.target.blocks_needed(PROBLEMS[0].prompt, SolveConfig(
        capacity=c, swap=0, max_tokens=300)) > 400 - held)
    with pytest.raises(Overcommitted, match=r"are free on replica"):
        next(emb.solve(PROBLEMS[0].prompt, SolveConfig(capacity=want, swap=0, max_tokens=300)))
    busy.close()
    with pytest.raises(ValueError, match="^problem:"):
        next(emb.solve("", SolveConfig()))
    assert emb.target.load()["reserved_blocks"] == 0


def test_gauges_and_counters_are_exported_per_interval_not_per_step_and_exact_at_the_end(emb, monkeypatch):
    from gambit.serving import target_service

    monkeypatch.setattr(target_service, "METRICS_EVERY_S", 60.0)
    backend, kv = emb.metrics.backend, emb.metrics._m["gambit_kv_cache_usage_perc"]
    sets, real_set = [], backend.set

    def counted(m, v, labels):
        if m is kv:
            sets.append(v)
        real_set(m, v, labels)

    monkeypatch.setattr(backend, "set", counted)
    steps0, tok0 = len(emb.target.driver.driver.kv_trace), metric(emb, "gambit_generation_tokens_total")
    emb.target._metrics_due = 0.0
    res = list(emb.solve(PROBLEMS[1].prompt, SolveConfig(capacity=4, max_tokens=120, seed=3)))[-1]
    steps = len(emb.target.driver.driver.kv_trace) - steps0
    assert steps > 20 and 2 <= len(sets) <= 4  # admission, first step, the end (and nothing between)
    assert sets[-1] == 0.0  # the run's blocks are back when its result goes out
    assert metric(emb, "gambit_generation_tokens_total") - tok0 == res["generated_tokens"]


def test_call_runs_on_the_engine_thread_between_steps(emb):
    import threading

    got = emb.target.call(lambda: threading.get_native_id()).result(timeout=30)
    assert got == emb.target.engine_thread_id != threading.get_native_id()
    with pytest.raises(ZeroDivisionError):
        emb.target.call(lambda: 1 / 0).result(timeout=30)
    # while a run decodes: the call is answered between two of its steps, and the run still ends well
    events = emb.solve(PROBLEMS[1].prompt, SolveConfig(capacity=4, swap=1, round_interval=8, seed=2))
    assert next(events)["kind"] == "started"
    assert emb.target.call(lambda: len(emb.target.engine.traces)).result(timeout=30) >= 0
    assert list(events)[-1]["status"] == "done"


def test_call_after_close_fails_instead_of_waiting():
    e = Embedded(EmbeddedConfig(scorer="random:mlp:192", num_blocks=64))
    e.close()
    with pytest.raises(RuntimeError, match="engine thread has stopped"):
        e.target.call(lambda: 1).result(timeout=5)


def _pr_run_solves_and_frees_its_kv(cfg: EmbeddedConfig, check) -> None:
    """A PR-decoded Gambit run on ``cfg``'s Target (``check(engine)`` first) streams its rounds and result,
    with every KV block back after."""
    e = Embedded(cfg)
    try:
        check(e.target.engine)
        events = list(e.solve(PROBLEMS[1].prompt, SolveConfig(capacity=4, swap=1, round_interval=8, warmup=4,
                                                              seed=2, decoding="pr")))
        assert events[0]["kind"] == "started" and events[-1]["kind"] == "result"
        assert any(ev["kind"] == "progress" for ev in events) and events[-1]["status"] == "done"
        assert e.target.engine.kv_usage() == 0.0
    finally:
        e.close()


def test_a_target_with_a_bfloat16_kv_cache_solves_and_frees_its_kv():
    """``kv_dtype="bfloat16"`` (``gambit serve --kv-dtype bfloat16``) reaches the Target's engine."""
    def check(engine):
        assert engine.runner.cache.k.dtype == torch.bfloat16

    _pr_run_solves_and_frees_its_kv(EmbeddedConfig(scorer="random:mlp:192", num_blocks=200,
                                                   kv_dtype="bfloat16"), check)


def test_a_target_with_bfloat16_weights_solves_and_frees_its_kv():
    """``cpu_weights="bfloat16"`` (``gambit serve --cpu-weights bfloat16``) reaches the Target's engine."""
    from gambit.engine.linear import bf16_gemm_available

    if not bf16_gemm_available():
        pytest.skip("no oneDNN bfloat16 GEMM on this CPU")

    def check(engine):
        assert engine.cpu_linear == "transposed-bf16"

    _pr_run_solves_and_frees_its_kv(EmbeddedConfig(scorer="random:mlp:192", num_blocks=200,
                                                   cpu_weights="bfloat16", batch_invariant=False), check)


def test_a_target_is_batch_invariant_by_default_where_it_holds():
    """Unset, ``batch_invariant`` is on for an fp32 model on an AVX-512 CPU with the compiled kernels: a
    seeded run is the same run beside any others (``tests/search/test_seeded_runs.py``)."""
    from gambit.cpu_info import cpu_flags
    from gambit.engine import cpu_attention

    def check(engine):
        assert engine.batch_invariant == (cpu_attention.kernel() is not None and "avx512f" in cpu_flags())
        assert engine.cpu_linear == ("invariant" if engine.batch_invariant else "transposed")

    assert EmbeddedConfig().batch_invariant is None
    _pr_run_solves_and_frees_its_kv(EmbeddedConfig(scorer="random:mlp:192", num_blocks=200), check)


def test_a_batch_invariant_target_solves_and_frees_its_kv():
    """``batch_invariant`` (``gambit serve --batch-invariant``) reaches the Target's engine: every linear
    on the invariant tiles, bfloat16 weights and KV needing no oneDNN."""
    def check(engine):
        assert engine.cpu_linear == "invariant-bf16" and engine.runner.batch_invariant

    _pr_run_solves_and_frees_its_kv(EmbeddedConfig(scorer="random:mlp:192", num_blocks=200,
                                                   cpu_weights="bfloat16", kv_dtype="bfloat16",
                                                   batch_invariant=True), check)


def test_a_run_id_of_ones_own_is_refused_while_a_run_holds_it(emb):
    """A second Solve with a finished run's id started: its nodes joined the first run's tree in Redis
    (GetRun said 12 traces for a run of 2) and its record replaced the first's. Refused now; the record
    and the tree stay the first run's."""
    cfg = SolveConfig(capacity=2, swap=0, round_interval=8, max_tokens=24, seed=3)
    rid = f"own-{uuid.uuid4().hex[:6]}"
    first = list(emb.solve(PROBLEMS[1].prompt, cfg, run_id=rid))[-1]
    assert first["kind"] == "result" and first["run_id"] == rid
    tree: RedisTreeView = emb.target.tree
    before = tree.get_run(rid)
    with pytest.raises(ValueError, match=rf"run_id: '{rid}' belongs to a run that ended \(done\); GetRun"):
        list(emb.solve(PROBLEMS[2].prompt, cfg, run_id=rid))
    assert tree.get_run(rid) == before and tree.num_traces(rid) == len(first["traces"])
    # a run refused before it started (its KV) leaves its id free: a client retries with the same id
    retry = f"retry-{uuid.uuid4().hex[:6]}"
    with pytest.raises(ValueError, match="^capacity:"):
        next(emb.solve(PROBLEMS[1].prompt, SolveConfig(capacity=200, swap=2, max_tokens=300), run_id=retry))
    assert tree.get_run(retry) is None
    assert list(emb.solve(PROBLEMS[1].prompt, cfg, run_id=retry))[-1]["status"] == "done"


def test_a_finished_runs_record_and_tree_stay_for_one_retention():
    """Records were kept 7 days and trees 1: a day on, GetRun said 0 traces. One setting now."""
    prefix = f"test-ret-{uuid.uuid4().hex[:8]}:"
    e = Embedded(EmbeddedConfig(scorer="random:mlp:192", tree="redis://127.0.0.1:6379/0", prefix=prefix,
                                num_blocks=100, retention_s=120))
    try:
        res = list(e.solve(PROBLEMS[0].prompt, SolveConfig(capacity=2, swap=0, max_tokens=16)))[-1]
        r = e.target.tree.r
        deadline = time.monotonic() + 10  # the record writer thread writes the result
        while time.monotonic() < deadline and not r.exists(f"{prefix}tree:run:{res['run_id']}:result"):
            time.sleep(0.05)
        keys = [f"{prefix}run:{res['run_id']}"] + [f"{prefix}tree:run:{res['run_id']}:{p}"
                                                   for p in ("meta", "nodes", "result")]
        assert all(100 < r.ttl(k) <= 120 for k in keys), {k: r.ttl(k) for k in keys}
    finally:
        e.close()
        keys = list(e.target.tree.r.scan_iter(f"{prefix}*"))
        if keys:
            e.target.tree.r.delete(*keys)
    with pytest.raises(ValueError, match="retention_s must be >= 1, got 0"):
        EmbeddedConfig(retention_s=0)


def test_speculative_counters_carry_the_decoding_so_pr_and_eagle_taus_read_apart(emb):
    """The spec counters were one series for every method: a Target serving PR and EAGLE-3.1 runs showed
    one blended tau. Each decoding is its own series now, and each sums to what the engine counted."""
    names = ("gambit_spec_decode_num_drafts_total", "gambit_spec_decode_num_draft_tokens_total",
             "gambit_spec_decode_num_accepted_tokens_total")
    before = {d: [labelled(emb, n, decoding=d) for n in names] for d in ("pr", "eagle3.1")}
    engine0 = {d: list(v) for d, v in emb.target.engine.stats.spec_by_decoding.items()}
    for d in ("pr", "eagle3.1"):
        res = list(emb.solve(PROBLEMS[2].prompt, SolveConfig(capacity=2, swap=1, decoding=d, seed=4,
                                                             max_tokens=40)))[-1]
        assert res["status"] == "done"
    emb.target._counters()  # the loop exports every METRICS_EVERY_S; read what it counted so far
    by = emb.target.engine.stats.spec_by_decoding
    for d in ("pr", "eagle3.1"):
        got = [labelled(emb, n, decoding=d) - b for n, b in zip(names, before[d], strict=True)]
        want = [v - w for v, w in zip(by[d], engine0.get(d, [0, 0, 0]), strict=True)]
        assert got == want and got[0] > 0, (d, got, want)
        assert got[2] <= got[1]  # accepted within drafted
    assert "other" not in by  # shipped names only; a drafter by path would be "other"


def test_getrun_says_running_on_its_replica_from_admission(emb):
    """GetRun said "queued" with no replica until the run's first round's progress write: a run with a
    long round interval read as queued from start to end."""
    events = emb.solve(PROBLEMS[0].prompt, SolveConfig(capacity=2, swap=1, round_interval=500, max_tokens=30,
                                                       seed=5))
    started = next(events)
    assert started["kind"] == "started"
    if hasattr(emb.target.records, "flush"):  # the Ray Target's writer is asynchronous
        emb.target.records.flush()
    rec = emb.target.tree.get_run(started["run_id"])
    assert rec["status"] == "running" and rec["replica"] == emb.target.replica
    assert list(events)[-1]["status"] == "done"


def test_a_target_calling_a_scorer_of_another_width_says_its_runs_are_unguided(caplog):
    """A Target (the shipped target, width 192) calling a ScorerService of width 576 (a SmolLM2 scorer)
    ended every run "done" on 0.5 scores with one WARNING per back-off: now the Target asks the Scorer's
    Info, logs one ERROR naming both widths and the address, and its scorer says why the runs fell back
    (the fallbacks counted as before)."""
    from gambit.scoring import random_scorer
    from gambit.serving.scorer_server import ScorerServerConfig, start_scorer_server

    srv = start_scorer_server(ScorerServerConfig(port=0, metrics_port=-1, token_env=""),
                              scorer=random_scorer("mlp", 576, seed=1))
    e = None
    try:
        with caplog.at_level("ERROR", logger="gambit.serving.scorer_client"):
            e = Embedded(EmbeddedConfig(scorer="random:mlp:192", scorer_address=f"127.0.0.1:{srv.port}",
                                        num_blocks=200))
            res = list(e.solve(PROBLEMS[0].prompt, SolveConfig(capacity=4, swap=1, round_interval=8,
                                                               warmup=8, max_tokens=40)))[-1]
        assert res["status"] == "done" and res["scorer_fallbacks"] >= 1
        assert {t["score"] for t in res["traces"]} == {0.5} and srv.core.calls == 0
        why = e.target.scorer.unguided
        assert why.startswith("runs unguided: ") and f"127.0.0.1:{srv.port}" in why
        assert "width 576 with 0" in why and "width 192 (its model's hidden size) with 0" in why
        assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [why]
        assert res["message"] == why  # the Result says it: a backend sees no log
    finally:
        if e is not None:
            e.close()
        srv.stop()


def test_an_embedded_tree_url_with_a_password_is_refused_without_saying_it():
    with pytest.raises(ValueError, match=r"^tree: .*GAMBIT_REDIS_PASSWORD") as e:
        EmbeddedConfig(tree="redis://:s3cret@127.0.0.1:6379/0")
    assert "s3cret" not in str(e.value)


def test_a_run_cancelled_before_admission_ends_cancelled_with_a_result(emb, monkeypatch):
    """CancelRun on a client's own id before the engine thread admitted the run: ``Embedded.solve`` raised
    ``CancelFlagged`` at its caller and deleted the run's record (GetRun: not found). It ends now as the
    served path ends it: one cancelled result, recorded, and no engine step spent on it."""
    tree: RedisTreeView = emb.target.tree
    claim = tree.claim_run

    def claim_then_cancel(run_id, **fields):  # the flag lands between the claim and the admission
        got = claim(run_id, **fields)
        tree.request_cancel(run_id)
        return got

    monkeypatch.setattr(tree, "claim_run", claim_then_cancel)
    rid = f"early-{uuid.uuid4().hex[:6]}"
    tokens = emb.target.engine.stats.generated_tokens
    events = list(emb.solve(PROBLEMS[1].prompt, SolveConfig(capacity=2, swap=0, max_tokens=24), run_id=rid))
    assert [(d["kind"], d["status"], d["run_id"]) for d in events] == [("result", "cancelled", rid)]
    assert events[0]["message"] == "cancelled by CancelRun (before a Target admitted it)"
    assert events[0]["traces"] == [] and events[0]["generated_tokens"] == 0
    assert emb.target.engine.stats.generated_tokens == tokens
    rec = tree.get_run(rid)
    assert rec["status"] == "cancelled" and rec["result"]["message"] == events[0]["message"]
    assert emb.target.load()["runs"] == 0 and emb.target.load()["reserved_blocks"] == 0


def test_a_gambit_run_whose_traces_never_reach_the_warmup_says_so_in_its_result(emb):
    """warmup >= max_tokens: no trace is ever scored, so no round prunes or branches; the run was plain
    self-consistency and its result said nothing. Its message says it now (a request cannot set w)."""
    cfg = SolveConfig(capacity=4, swap=2, round_interval=4, warmup=40, max_tokens=40, seed=3)
    res = list(emb.solve(PROBLEMS[0].prompt, cfg))[-1]
    assert res["status"] == "done" and res["rounds"] > 0
    assert all(t["parent_id"] == -1 for t in res["traces"])  # nothing branched
    assert "warmup w=40 is not below max_tokens 40: no trace is scored" in res["message"]
    assert emb.target.tree.get_run(res["run_id"])["result"]["message"] == res["message"]
    ok = list(emb.solve(PROBLEMS[0].prompt, SolveConfig(capacity=4, swap=2, round_interval=4, warmup=4,
                                                        max_tokens=40, seed=3)))[-1]
    assert "warmup" not in ok["message"]


def test_a_gambit_pool_larger_than_the_engine_batch_is_refused_naming_capacity():
    """C 4 on a Target whose batch holds 2 traces: the waiting traces were never scored and each trace that
    ended was refilled with a child, so the run branched on (C 8 on 2 slots, K 0: 165 traces for 8).
    Refused at admission now (never admissible there: INVALID_ARGUMENT); SC's traces wait their turn."""
    e = Embedded(EmbeddedConfig(scorer="random:mlp:192", num_blocks=200, max_num_seqs=2))
    try:
        cfg = SolveConfig(capacity=4, swap=0, round_interval=4, warmup=4, max_tokens=24, seed=1)
        with pytest.raises(ValueError, match=r"^capacity: C 4: Gambit keeps as many traces alive at once, "
                                             r"more than one engine batch holds \(max_num_seqs 2\)"):
            list(e.solve(PROBLEMS[0].prompt, cfg))
        sc = SolveConfig(method="sc", capacity=4, swap=0, max_tokens=24)
        res = list(e.solve(PROBLEMS[0].prompt, sc))[-1]
        assert res["status"] == "done" and len(res["traces"]) == 4
        assert e.target.load()["reserved_blocks"] == 0
    finally:
        e.close()
