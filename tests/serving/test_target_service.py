"""TargetService's admission of runs (a real engine, the shipped target; records in memory; no Ray)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from gambit.serving.embedded import EmbeddedConfig, build_target
from gambit.serving.solve_config import SolveConfig
from gambit.serving.tree_view import StoreUnavailable
from gambit.tasks.arithmetic import TaskConfig, generate

PROBLEM = generate("test", 1, 0, TaskConfig(3, 4))[0].prompt
CFG = {"capacity": 2, "max_tokens": 64, "seed": 1}


@pytest.fixture(scope="module")
def svc():
    s = build_target(EmbeddedConfig(scorer="random:mlp:192", num_blocks=200), None)
    yield s
    s.close()


def _reads(svc, monkeypatch) -> list[list[str]]:
    """The cancel-flag reads of ``svc``'s tree view, as the ids each asked about."""
    reads, read = [], svc.tree.cancel_requested

    def counted(ids):
        reads.append(list(ids))
        return read(ids)

    monkeypatch.setattr(svc.tree, "cancel_requested", counted)
    return reads


def test_a_run_flagged_after_the_targets_check_but_before_admission_is_never_stepped(svc, monkeypatch):
    """Target.run read the run's cancel flag before ``submit_run``; a flag set between that read and
    the engine thread's admission was seen only by the 0.1 s poll, after the run was prefilled and
    stepped. The flag is now read at admission, once per run: the run is refused before any step."""
    from gambit.deployments.target import Target

    reads = _reads(svc, monkeypatch)
    me = type("T", (), {"svc": svc, "loop": None, "replica": "r0"})()
    svc.tree.claim_run("f1", status="queued")
    steps, tokens = svc._steps, svc.engine.stats.generated_tokens

    async def run():
        svc._cv.acquire()  # the engine thread admits nothing until this is released
        try:
            events = asyncio.ensure_future(_collect(Target.func_or_class.run(me, "f1", PROBLEM, CFG)))
            while not svc._inbox:  # submitted: any read before ``submit_run`` is behind it
                await asyncio.sleep(0.01)
            svc.tree.request_cancel("f1")
        finally:
            svc._cv.release()
        return await asyncio.wait_for(events, 60)

    got = asyncio.run(run())
    assert [(d["kind"], d.get("status")) for d in got] == [("result", "cancelled")]
    assert got[0]["message"] == "cancelled by CancelRun (before a Target admitted it)"
    assert (svc._steps, svc.engine.stats.generated_tokens) == (steps, tokens)  # never stepped
    assert svc.load()["runs"] == 0 and svc.load()["reserved_blocks"] == 0
    assert sum("f1" in ids for ids in reads) == 1  # one read of its flag, at admission
    rec = svc.tree.get_run("f1")
    assert rec["status"] == "cancelled" and rec["result"]["message"] == got[0]["message"]


def test_admission_reads_no_flags_for_a_while_after_redis_did_not_answer(svc, monkeypatch):
    """An unreachable Redis must not hold every admission (and the engine) for a socket timeout: a run
    is admitted unread (the poll stops it if flagged), and flags are not read again for a while."""
    from gambit.serving import target_service

    reads = []

    def down(ids):
        if threading.current_thread().name == "target-loop":  # admission's (not the poll's)
            reads.append(list(ids))
        raise StoreUnavailable("tree store (Redis at test) unreachable")

    monkeypatch.setattr(svc.tree, "cancel_requested", down)
    monkeypatch.setattr(svc, "_flags_at", 0.0)
    for run_id in ("d1", "d2"):
        assert svc.submit_run(run_id, PROBLEM, SolveConfig(**CFG), lambda d: None).result(60) is None
        assert svc.cancel(run_id, "cancelled", "test over")
    assert reads == [["d1"]]
    assert svc._flags_at > 0.0 and target_service.FLAGS_RETRY_S > 0


async def _collect(gen) -> list[dict]:
    return [d async for d in gen]


def test_gambit_runs_that_overfill_the_batch_are_held_queued_and_search_as_alone():
    """Three runs of C 4 on a Target of 8 slots: the third waited unscored behind the others' traces
    and branched where alone it did not (K 0). It is admitted, held (GetRun: queued) until a run ends,
    then searches as alone."""
    import queue

    svc = build_target(EmbeddedConfig(scorer="random:mlp:192", num_blocks=600, max_num_seqs=8), None)
    problems = [p.prompt for p in generate("test", 3, 3, TaskConfig(6, 8))]

    def cfg(i):
        return SolveConfig(capacity=4, swap=0, round_interval=8, warmup=24, max_tokens=200, seed=i)

    def solve(ids) -> dict:
        q: queue.Queue = queue.Queue()
        svc._cv.acquire()  # admitted together, before any step
        try:
            futs = [svc.submit_run(f"{tag}{i}", problems[i], cfg(i), q.put) for tag, i in ids]
        finally:
            svc._cv.release()
        for f in futs:
            assert f.result(60) is None
        status = {f"{tag}{i}": svc.tree.get_run(f"{tag}{i}")["status"] for tag, i in ids}
        out = {}
        while len(out) < len(ids):
            d = q.get(timeout=120)
            if d["kind"] == "result":
                out[d["run_id"][1:]] = (d["status"], d["answer"], len(d["traces"]),
                                        sum(t["parent_id"] >= 0 for t in d["traces"]))
        return status, out

    try:
        alone = {}
        for i in range(3):
            alone.update(solve([("a", i)])[1])
        status, shared = solve([("s", i) for i in range(3)])
        assert shared == alone  # traces and children (branched) per run, answers
        assert status == {"s0": "running", "s1": "running", "s2": "queued"}
        assert svc.tree.get_run("s2")["status"] == "done"
    finally:
        svc.close()


def test_runs_held_for_batch_slots_are_gauged_and_reported_to_the_router():
    """Stop 67: a run held for batch slots showed only in gambit_num_requests_running (held ones
    included), and the router's stats had no batch: an operator could not see it wait, and the router
    sent runs to a full batch. Three runs of C 4 on 8 slots: one held, the gauges and the routing
    stats say so; once a launched run ends the held one launches; with none left all are 0."""
    import queue

    from gambit.deployments.target import Target
    from gambit.serving.metrics import Metrics, PrometheusBackend

    backend = PrometheusBackend()
    svc = build_target(EmbeddedConfig(scorer="random:mlp:192", num_blocks=600, max_num_seqs=8),
                       Metrics(backend))
    problems = [p.prompt for p in generate("test", 3, 3, TaskConfig(6, 8))]
    me = type("T", (), {"svc": svc})()
    names = ("num_requests_running", "num_requests_held", "batch_slots_used", "batch_slots_total")
    exports, export = [], svc._gauges

    def gauges() -> tuple:
        """What the gauges say, and the router's stats at the same time: max_num_seqs, batch_slots."""
        stats = Target.func_or_class.record_routing_stats(me)
        return (*(backend.registry.get_sample_value(f"gambit_{k}") for k in names),
                stats["max_num_seqs"], stats["batch_slots"])

    def recorded() -> None:  # each export of the gauges (engine thread, between steps)
        export()
        exports.append(gauges())

    svc._gauges = recorded
    try:
        assert gauges() == (0, 0, 0, 8, 8, 0)
        q: queue.Queue = queue.Queue()
        svc._cv.acquire()  # admitted together, before any step
        try:
            futs = [svc.submit_run(f"h{i}", problems[i], SolveConfig(capacity=4, swap=0, max_tokens=200,
                                                                     seed=i), q.put) for i in range(3)]
            mark = len(exports)
        finally:
            svc._cv.release()
        for f in futs:
            assert f.result(60) is None
        ended = 0
        while ended < 3:
            ended += q.get(timeout=120)["kind"] == "result"
        got = exports[mark:]
        # at admission: running (held included), held, slots used, slots; launched and held: 3 x 4
        assert got[0] == (3, 1, 8, 8, 8, 12)
        # after a launched run ended, the held one launched: none held, runs in flight
        assert any(e[1] == 0 and e[0] > 0 and e[5] <= 8 for e in got)
        assert all(e[2] <= 8 for e in got) and got[-1] == gauges() == (0, 0, 0, 8, 8, 0)
    finally:
        svc.close()
