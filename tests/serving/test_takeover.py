"""A run whose Target replica dies is taken over by another replica from its tree in Redis: two real
engines (shipped target) on one real Redis; replica A is frozen mid-run with its writes cut off, as
a killed process would leave it, and replica B resumes the run. Plus the takeover policy (``Lost``)."""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time
import uuid

import pytest

from gambit.deployments.takeover import Lost, TargetLost, target_died
from gambit.serving.embedded import Embedded, EmbeddedConfig
from gambit.serving.solve_config import SolveConfig
from gambit.tasks.arithmetic import TaskConfig, generate

PROBLEM = generate("test", 1, 0, TaskConfig(3, 4))[0].prompt


@pytest.fixture(scope="module")
def pair():
    prefix = f"test-takeover-{uuid.uuid4().hex[:8]}:"
    cfg = EmbeddedConfig(scorer="random:mlp:192", tree="redis://127.0.0.1:6379/0", prefix=prefix,
                         num_blocks=400)
    a, b = Embedded(cfg), Embedded(cfg)
    a.target.replica, b.target.replica = "A", "B"
    yield a, b
    b.close()
    r = b.target.tree.r
    keys = list(r.scan_iter(f"{prefix}*"))
    if keys:
        r.delete(*keys)


def _kill(svc, frozen: bool = False) -> None:
    """Freeze a TargetService as a dead process leaves it: its engine thread stops at the next step
    (or is already held, ``frozen``) and nothing it still has to write reaches Redis."""
    if not frozen:
        svc._cv.acquire()  # the engine thread takes it before every step: it never steps again
    svc.records.flush()
    for name in ("update", "put_run", "put_held", "after"):
        setattr(svc.records, name, lambda *a, **k: None)


def _nodes(tree, run_id: str) -> dict[int, dict]:
    raw = tree.r.hgetall(f"{tree.prefix}tree:run:{run_id}:nodes")
    return {int(k): json.loads(v) for k, v in raw.items()}


def test_a_run_resumes_on_another_replica_from_its_tree_in_redis(pair):
    a, b = pair
    cfg = SolveConfig(capacity=6, swap=2, round_interval=8, warmup=4, max_tokens=240, seed=4)
    run_id = "takeover-" + uuid.uuid4().hex[:6]
    seen: queue.Queue = queue.Queue()
    hold = threading.Event()  # never set: A's engine thread stays in its delivery of round 3
    deliver = a.target._deliver

    def deliver_then_freeze(outs, gauges=True):  # freeze A here, mid-run, however fast its engine is
        deliver(outs, gauges)
        if any(o is not None and o.get("round") == 3 for o in outs):
            hold.wait()

    a.target._deliver = deliver_then_freeze
    sink = seen.put  # on A's record writer, once each round's tree write was tried

    a.target.start_run(run_id, PROBLEM, cfg, sink)
    before = [seen.get(timeout=60) for _ in range(3)]  # three rounds on A
    assert [d["round"] for d in before] == [1, 2, 3]
    _kill(a.target, frozen=True)
    tree = b.target.tree
    stored = _nodes(tree, run_id)
    assert len(stored) >= 6 and any(n["tokens"] for n in stored.values())
    raw_meta = tree.r.hgetall(f"{tree.prefix}tree:run:{run_id}:meta")
    stored_meta = {k: json.loads(v) for k, v in raw_meta.items()}

    got: queue.Queue = queue.Queue()
    assert b.target.submit_run(run_id, PROBLEM, cfg, got.put, resume=True).result(timeout=60) is True
    events = [got.get(timeout=120)]
    while events[-1]["kind"] != "result":
        events.append(got.get(timeout=120))
    res = events[-1]
    assert res["status"] == "done" and res["answer"]
    rounds = [d["round"] for d in events if d["kind"] == "progress"]
    assert rounds and rounds[0] == stored_meta["round"] + 1 and rounds == sorted(rounds)
    after = _nodes(tree, run_id)
    assert set(stored) <= set(after)  # nothing recorded before the loss is gone
    assert {t["trace_id"] for t in res["traces"]} == set(after)
    for nid, old in stored.items():  # every trace goes on from the tokens it had
        assert after[nid]["tokens"][:len(old["tokens"])] == old["tokens"]
        assert after[nid]["parent"] == old["parent"]
    assert res["generated_tokens"] >= stored_meta["tokens"]
    assert tree.get_run(run_id)["status"] == "done"
    # its tree says where it was taken over (`gambit inspect`'s header), written through B's record writer
    resumed = json.loads(tree.r.hget(f"{tree.prefix}tree:run:{run_id}:meta", "resumed_at"))
    assert resumed == [stored_meta["step"]]
    assert b.target.load()["runs"] == 0 and b.target.engine.kv_usage() == 0.0


def test_a_run_lost_before_its_first_write_starts_afresh_under_its_id(pair):
    _, b = pair
    got: queue.Queue = queue.Queue()
    cfg = SolveConfig(capacity=2, max_tokens=40, seed=1)
    restored = b.target.submit_run("never-written", PROBLEM, cfg, got.put, resume=True).result(timeout=60)
    assert restored is False
    while (d := got.get(timeout=120))["kind"] != "result":
        pass
    assert d["status"] == "done" and sum(t["parent_id"] == -1 for t in d["traces"]) == 2


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_lost_allows_max_resumes_each_within_the_wait():
    from ray.exceptions import ActorDiedError

    clock = _Clock()
    lost = Lost(max_resumes=1, wait_s=10, retry_s=0.001, clock=clock)
    e = ActorDiedError()
    assert target_died(e) and not target_died(ValueError("x"))
    asyncio.run(lost.wait(e))  # first loss: try at once
    clock.t = 5
    asyncio.run(lost.wait(e))  # the router still picked the dead replica: retry, within the wait
    lost.taken_over()
    assert (lost.resumes, lost.losses) == (1, 1)
    with pytest.raises(TargetLost, match="at most 1 times"):
        asyncio.run(lost.wait(e))  # a second loss is one too many
    slow = Lost(max_resumes=2, wait_s=10, clock=clock)
    asyncio.run(slow.wait(e))
    clock.t = 15.5
    with pytest.raises(TargetLost, match="no replica took the run over within 10 s"):
        asyncio.run(slow.wait(e))
    with pytest.raises(ValueError, match="max_resumes"):
        Lost(max_resumes=-1)


def test_progress_reaches_its_client_only_once_its_round_is_in_redis(pair):
    """A takeover resumes from the tree in Redis: a round the client was told of must be there, or
    the stream's rounds go back after a replica is lost (seen once in tests/deployments/test_serve.py)."""
    _, b = pair
    w, tree = b.target.records, b.target.tree
    write = w._write
    w._write = lambda: (time.sleep(0.03), write())[1]  # a slow Redis: progress is ready before the write
    run_id = "progress-" + uuid.uuid4().hex[:6]
    got: queue.Queue = queue.Queue()

    def sink(d: dict) -> None:
        stored = tree.r.hget(f"{tree.prefix}tree:run:{run_id}:meta", "round")
        got.put((d, json.loads(stored) if stored else 0))

    try:
        cfg = SolveConfig(capacity=4, swap=2, round_interval=4, warmup=4, max_tokens=120, seed=2)
        b.target.start_run(run_id, PROBLEM, cfg, sink)
        events = [got.get(timeout=120)]
        while events[-1][0]["kind"] != "result":
            events.append(got.get(timeout=120))
    finally:
        del w._write
    seen = [(d["round"], stored) for d, stored in events if d["kind"] == "progress"]
    assert len(seen) >= 3 and all(stored >= r for r, stored in seen), seen
