"""The tree view reads tokens from the engine traces (``SearchRun.sync``) instead of routing every
token event: what it ends up with must equal what routing each event would have given — every node's
tokens, the run's token count, and the confidence features each boundary is scored with (replayed
here token by token from the engine's own events, forks included)."""

from __future__ import annotations

import pytest

from gambit.engine import BoundaryEvent, TokenEvent
from gambit.scoring.confidence import ConfidenceTracker
from gambit.scoring.spec import load_scorer_spec
from gambit.search.config import SearchConfig
from gambit.search.driver import SearchDriver


@pytest.fixture(scope="module")
def process_scorer(target):
    return load_scorer_spec("process", target[0].config.hidden_size)  # reads confidence features


def _record(driver):
    """Per engine step: its events; the engine-id -> node-id map; every (key, features) scored."""
    steps, node_of, scored = [], {}, []
    step, score = driver.engine.step, driver._score

    def rec_step(token_events=True):
        node_of.update({eid: nid for eid, (_, nid, _) in driver.owner.items()})
        driver.asked_token_events = getattr(driver, "asked_token_events", False) or token_events
        out = step()  # every token event, for the replay (the driver asks for none here: it reads none)
        steps.append(list(out))
        return out

    def rec_score(rows):
        scored.extend((r[0], r[2]) for r in rows)
        return score(rows)

    driver.engine.step, driver._score = rec_step, rec_score
    return steps, node_of, scored


@pytest.mark.parametrize("method", ["step", "gambit"])
def test_synced_view_equals_routing_every_token(make_engine, process_scorer, hard_problems, method):
    driver = SearchDriver(make_engine(num_blocks=36), process_scorer)
    steps, node_of, scored = _record(driver)
    cfg = SearchConfig(method=method, capacity=6, swap=2, interval=8, warmup=16, kv_ratio=0.85, seed=3)
    rid = driver.submit(hard_problems[3], cfg)
    run = driver.runs[rid]
    res = driver.run_until_done()[rid]
    events = [e for s in steps for e in s]
    assert res.tokens == sum(isinstance(e, TokenEvent) for e in events)  # the run owns every trace
    assert not driver.asked_token_events  # a plain run reads its tokens from the traces
    if method == "gambit":
        assert res.branched > 0
    else:
        assert res.evicted > 0

    # replay: a node's tokens are its parent's up to the branch point, then its engine trace's events;
    # its tracker is fresh (a root) or its parent's forked at the round it was born in
    tokens = {i: [] for i in run.nodes}
    trackers: dict[int, ConfidenceTracker] = {}
    want: dict[int, list[list[float]]] = {}  # node id -> features at each of its boundaries, in order
    for k, step_events in enumerate(steps):
        for n in run.nodes.values():  # born at the previous step's round (roots: before the first)
            if n.birth_step == k and n.id not in trackers:
                if n.parent is None:
                    trackers[n.id] = ConfidenceTracker()
                else:
                    trackers[n.id] = trackers[n.parent].fork()
                    tokens[n.id] = tokens[n.parent][:n.birth_depth]
        for e in step_events:
            nid = node_of.get(e.trace_id)
            if nid is None:
                continue
            if isinstance(e, TokenEvent):
                tokens[nid].append(e.token_id)
                trackers[nid].token(e.position, e.logprob)
            elif isinstance(e, BoundaryEvent):
                want.setdefault(nid, []).append(trackers[nid].boundary(e.position))
    assert {i: n.tokens for i, n in run.nodes.items()} == tokens

    got: dict[int, list[list[float]]] = {}
    for key, f in scored:
        got.setdefault(int(key.rsplit(":", 1)[1]), []).append(f)
    assert sum(map(len, got.values())) > 10
    for nid, fs in got.items():  # a node's scored boundaries are its last len(fs) ones (warmup first)
        assert fs == want[nid][len(want[nid]) - len(fs):], nid
