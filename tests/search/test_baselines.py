"""SC@N, STEP and DeepConf on the same engine; many runs over one engine; cancel; config errors."""

from __future__ import annotations

import pytest

from gambit.search import tree as T
from gambit.search.config import SearchConfig
from gambit.search.deepconf import threshold, vote_weights
from gambit.search.driver import SearchDriver
from gambit.search.vote import majority_vote, weighted_vote


def test_sc_is_c_independent_traces_and_majority(make_engine, hard_problems):
    driver = SearchDriver(make_engine())
    rid = driver.submit(hard_problems[0], SearchConfig(method="sc", capacity=6))
    res = driver.run_until_done()[rid]
    assert res.branched == res.pruned == 0 and len(res.traces) == 6
    answers = [t["answer"] for t in res.traces]
    assert res.answer == majority_vote(answers) and res.finished_traces == sum(a is not None for a in answers)
    assert res.tokens == sum(t["tokens"] for t in res.traces)
    assert res.correct == (res.answer == str(hard_problems[0].answer))
    # unscored: the weighted answer is the majority's and its votes are all 0 (the Result's contract)
    assert res.weighted == res.majority == res.answer and res.vote_rule == "majority"
    assert set(res.weighted_votes) == set(res.votes) and not any(res.weighted_votes.values())


def test_sc_requeues_under_pressure_and_step_evicts_without_replacement(make_engine, scorer, hard_problems):
    sc = SearchDriver(make_engine(num_blocks=30))
    rid = sc.submit(hard_problems[1], SearchConfig(method="sc", capacity=6))
    res = sc.run_until_done()[rid]
    assert res.evicted > 0 and res.finished_traces == 6  # recomputed, all finish (vLLM-style preemption)

    step = SearchDriver(make_engine(num_blocks=30), scorer)
    rid = step.submit(hard_problems[1], SearchConfig(method="step", capacity=6, kv_ratio=0.9))
    res = step.run_until_done()[rid]
    assert res.evicted > 0 and len(res.traces) == 6 and res.branched == 0  # no replacement
    evicted = [t for t in res.traces if t["state"] == T.EVICTED]
    kept = [t for t in res.traces if t["state"] == T.FINISHED]
    assert len(evicted) == res.evicted and len(kept) == 6 - res.evicted
    # score-weighted vote over the survivors
    assert res.vote_rule == "score-weighted"
    assert res.answer == weighted_vote([t["answer"] for t in kept], [t["score"] or 0.0 for t in kept])


def test_step_evicts_the_lowest_scored(make_engine, scorer, hard_problems):
    driver = SearchDriver(make_engine(num_blocks=40), scorer)
    rid = driver.submit(hard_problems[2], SearchConfig(method="step", capacity=6, kv_ratio=0.9))
    run = driver.runs[rid]
    checked = 0
    while driver.has_work():
        before = {n.id: n.rank_score() for n in run.nodes.values() if n.resident}
        driver.step()
        gone = [i for i in before if run.nodes[i].state == T.EVICTED]
        for i in gone:  # nobody still resident ranked strictly lower than an evicted trace
            lower = [j for j, s in before.items() if s < before[i] and run.nodes[j].resident]
            assert not lower
            checked += 1
    assert checked > 0


def test_deepconf_threshold_from_warmup_and_stops_below(make_engine, hard_problems):
    driver = SearchDriver(make_engine())
    cfg = SearchConfig(method="deepconf", capacity=8, deepconf_warmup=4, deepconf_window=8,
                       deepconf_keep=50.0)
    rid = driver.submit(hard_problems[3], cfg)
    run = driver.runs[rid]
    res = driver.run_until_done()[rid]
    nodes = list(run.nodes.values())
    warm, rest = nodes[:4], nodes[4:]
    assert len(nodes) == 8
    assert res.deepconf_threshold == pytest.approx(threshold([n.conf_min for n in warm], 50.0))
    assert all(n.state == T.FINISHED for n in warm)
    assert all(n.birth_step >= max(w.end_step for w in warm) for n in rest)  # launched after warm-up
    stopped = [n for n in rest if n.state == T.STOPPED]
    assert all(n.conf_min < res.deepconf_threshold for n in stopped)
    assert all(n.conf_min >= res.deepconf_threshold for n in rest if n.state == T.FINISHED)
    fin = [n for n in nodes if n.state == T.FINISHED]
    assert res.answer == weighted_vote([n.answer for n in fin], vote_weights([n.conf_min for n in fin],
                                                                          res.deepconf_threshold))



def test_deepconf_vote_weights_are_the_references_lowest_confidence_above_the_bar():
    """deepconf-online.py votes with ``min_conf`` and only for traces at or above ``conf_bar``: the
    warm-up trace that set the bottom of the percentile, and a short trace below it, vote with 0."""
    lows = [1.0, 2.0, 3.0, 4.0]
    bar = threshold(lows, 90.0)  # keep the top 90%: the 10th percentile, 1.3
    assert bar == pytest.approx(1.3)
    assert vote_weights(lows, bar) == [0.0, 2.0, 3.0, 4.0]
    assert vote_weights([2.0, None, 1.3], bar) == [2.0, 0.0, 1.3]  # no confidence: 0; at the bar: votes
    assert vote_weights([0.5, 2.0], None) == [0.5, 2.0]  # no threshold set (warm-up not done)

def test_many_runs_share_one_engine_each_with_its_capacity(make_engine, scorer, hard_problems):
    engine = make_engine()
    driver = SearchDriver(engine, scorer)
    caps = {"a": 3, "b": 5, "c": 4}
    for rid, c in caps.items():
        driver.submit(hard_problems[4], SearchConfig(capacity=c, swap=1, interval=4, warmup=12), run_id=rid)
    driver.submit(hard_problems[4], SearchConfig(method="sc", capacity=2), run_id="d")
    seen = set()
    for _ in range(60):
        for ev in driver.step():
            if hasattr(ev, "active") and ev.run_id in caps:
                assert ev.active <= caps[ev.run_id]
                seen.add(ev.run_id)
    assert seen == set(caps)
    res = driver.cancel("b")
    assert res.reason == "cancelled" and driver.store.load("b")["result"]["reason"] == "cancelled"
    assert all(owner[0].run_id != "b" for owner in driver.owner.values())
    for rid in list(driver.runs):
        driver.cancel(rid)
    engine.step()  # delivers the abort events
    assert engine.kv_usage() == 0.0 and not engine.has_unfinished()
    with pytest.raises(ValueError, match="no running run"):
        driver.cancel("b")


@pytest.mark.parametrize("kw,field", [
    ({"method": "beam"}, "method"), ({"decoding": "medusa"}, "decoding"),
    ({"capacity": 0}, "capacity"),
    ({"swap": 9, "capacity": 4, "method": "gambit"}, "swap"), ({"interval": 0}, "interval"),
    ({"warmup": -1}, "warmup"),
    ({"floor": 1.5}, "floor"), ({"child_temperature": 0}, "child_temperature"), ({"kv_ratio": 0}, "kv_ratio"),
    ({"max_tokens": 0}, "max_tokens"), ({"top_p": 0}, "top_p"), ({"max_wall_s": -1}, "max_wall_s"),
    ({"method": "deepconf", "deepconf_warmup": 16, "capacity": 16}, "deepconf_warmup"),
    ({"method": "deepconf", "capacity": 1}, "capacity must be >= 2 for method deepconf"),
])
def test_config_errors_name_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        SearchConfig(**kw)


@pytest.mark.parametrize("capacity,warm", [(2, 1), (3, 2), (4, 3), (5, 4), (16, 4), (64, 4)])
def test_deepconf_default_warmup_fits_every_pool(capacity, warm):
    """No warm-up count set: a fixed few that leave a trace to hold to the threshold, at any C >= 2
    (a pool of 4 or fewer was refused for a knob no surface sets); a count set is kept."""
    assert SearchConfig(method="deepconf", capacity=capacity).deepconf_warm == warm
    assert SearchConfig(method="deepconf", capacity=16, deepconf_warmup=8).deepconf_warm == 8


def test_deepconf_small_pool_runs_its_warmup_then_the_rest(make_engine, hard_problems):
    driver = SearchDriver(make_engine())
    rid = driver.submit(hard_problems[0], SearchConfig(method="deepconf", capacity=3, max_tokens=48))
    run = driver.runs[rid]
    res = driver.run_until_done()[rid]
    nodes = list(run.nodes.values())
    assert len(nodes) == 3 and res.deepconf_threshold is not None
    assert min(n.birth_step for n in nodes[2:]) >= max(n.end_step for n in nodes[:2])  # 2 warm, then 1


def test_driver_bad_input(make_engine):
    driver = SearchDriver(make_engine())
    with pytest.raises(ValueError, match="needs a scorer"):
        driver.submit("Compute 1+2.\nSolution:\n", SearchConfig(method="gambit"))
    with pytest.raises(ValueError, match="prompt"):
        driver.submit("", SearchConfig(method="sc"))
    with pytest.raises(ValueError, match="run id"):
        driver.submit("Compute 1+2.\nSolution:\n", SearchConfig(method="sc"), run_id="a:b")
    with pytest.raises(ValueError, match="capacity"):
        driver.submit("Compute 1+2.\nSolution:\n", {"method": "sc", "capacity": -1})
    with pytest.raises(ValueError, match=r"^problem: .*'×' \(U\+00D7\)"):  # not in the vocabulary
        driver.submit("Compute 1×2.\nSolution:\n", SearchConfig(method="sc"))
    assert not driver.runs and not driver.engine.has_unfinished()


def test_the_kv_ratio_check_follows_the_runs_of_the_driver(make_engine, scorer, hard_problems):
    """The lowest KV ratio of the scored runs (Gambit, STEP) is kept until a run comes or goes: submit,
    finish, and a run adopted from the store each change it; SC and DeepConf never evict by it."""
    driver = SearchDriver(make_engine(), scorer)
    assert driver._evict_ratio() == float("inf")
    driver.submit(hard_problems[0], SearchConfig(method="sc", capacity=2, swap=1, kv_ratio=0.1))
    assert driver._evict_ratio() == float("inf")
    step = driver.submit(hard_problems[1], SearchConfig(method="step", capacity=2, swap=1, kv_ratio=0.7))
    gambit = driver.submit(hard_problems[2], SearchConfig(method="gambit", capacity=2, swap=1, kv_ratio=0.9))
    assert driver._evict_ratio() == 0.7
    driver.cancel(step)
    assert driver._evict_ratio() == 0.9
    data = driver.store.load(gambit)
    driver.cancel(gambit)
    assert driver._evict_ratio() == float("inf")
    data["result"] = None  # as if it had been left unfinished by a lost coordinator
    other = SearchDriver(make_engine(), scorer, driver.store)
    other.adopt("again", data)
    assert other._evict_ratio() == 0.9


def test_a_prompt_one_token_short_of_the_context_is_accepted(make_engine):
    """The proto allows the context minus one token (room for one generated): the driver refused it
    (its check counted one more than the engine's), with "1023 tokens; the context holds 1024"."""
    driver = SearchDriver(make_engine())
    n = driver.engine.max_model_len
    tok = driver.engine.tokenizer
    fits = "1" * (n - len(tok.encode("")) - 1)  # one token a character, the BOS beside them
    assert len(tok.encode(fits)) == n - 1
    rid = driver.submit(fits, SearchConfig(method="sc", capacity=2, max_tokens=8))
    res = driver.run_until_done()[rid]
    assert [t["tokens"] for t in res.traces] == [1, 1]  # the context's last position, then its length
    with pytest.raises(ValueError, match=f"prompt has {n} tokens; the context holds {n} including at least"):
        driver.submit(fits + "1", SearchConfig(method="sc", capacity=2, max_tokens=8))


def test_runs_sharing_a_small_engine_each_keep_a_trace(make_engine, scorer, hard_problems):
    """Under memory pressure the engine evicted a run's last resident trace (the KV-ratio check spares a
    run's last two, the engine's own eviction did not): with ghosts only, the run ended 'done' with no
    answer. Its last trace is requeued now, as vLLM requeues a preempted request."""
    driver = SearchDriver(make_engine(num_blocks=40), scorer)
    driver.submit(hard_problems[1], SearchConfig(seed=3, capacity=8, swap=2, interval=4, warmup=12,
                                                  kv_ratio=0.85), run_id="A")
    driver.submit(hard_problems[2], SearchConfig(seed=4, capacity=4, swap=1, interval=4, warmup=12,
                                                  kv_ratio=0.85), run_id="B")
    done = driver.run_until_done()
    assert done["B"].evicted > 0  # the pressure is real
    for res in done.values():
        assert res.answer is not None and res.finished_traces > 0, (res.run_id, res.votes)
    assert driver.engine.kv_usage() == 0.0


def test_a_childs_temperature_compounds_but_stays_capped(make_engine, scorer, hard_problems):
    """x3 a generation reached T = 5249 in eight (one answer in 66 traces); the roots' cap bounds it."""
    driver = SearchDriver(make_engine(), scorer)
    rid = driver.submit(hard_problems[0], SearchConfig(capacity=8, swap=4, interval=4, warmup=4,
                                                        child_temperature=3.0))
    driver.run_until_done()
    temps = sorted({n["temperature"] for n in driver.store.load(rid)["nodes"].values()})
    assert temps == pytest.approx([0.8, 2.4, 7.2, 10.0]), temps  # then the cap, generation after generation


def test_a_budget_the_run_spends_exactly_by_itself_is_not_a_limit(make_engine, hard_problems):
    """Every trace finished on its own at exactly max_total_tokens: the result said 'limit'."""
    def run(budget: int):
        driver = SearchDriver(make_engine())
        rid = driver.submit(hard_problems[0], SearchConfig(method="sc", capacity=4, max_total_tokens=budget))
        return driver.run_until_done()[rid]

    natural = run(0).tokens
    exact, short = run(natural), run(natural - 1)
    assert (exact.reason, exact.limit, exact.tokens) == ("done", "", natural)
    assert (short.reason, short.tokens) == ("limit", natural - 1)
