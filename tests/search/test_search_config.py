"""SearchConfig's edge cases a user meets: greedy pools, and a warmup no trace can reach."""

import pytest

from gambit.search.config import SearchConfig


@pytest.mark.parametrize("method", ["gambit", "sc", "step"])
def test_a_greedy_pool_of_more_than_one_trace_is_refused(method):
    """At temperature 0 every root, and every child branched from one (0 x the multiplier), is the same
    decode: C traces were C copies of one answer, and Gambit's branches copied their parents."""
    with pytest.raises(ValueError, match=r"^capacity 4 at temperature 0 \(greedy\) are 4 copies of one "
                                         r"decode .*give temperature > 0 or capacity 1$"):
        SearchConfig(method=method, capacity=4, swap=1, temperature=0.0)
    SearchConfig(method=method, capacity=1, swap=1, temperature=0.0)  # one greedy trace: plain decoding
    SearchConfig(method=method, capacity=4, swap=1, temperature=0.1)


def test_deepconf_at_temperature_0_is_refused_without_offering_one_trace():
    with pytest.raises(ValueError, match=r"copies of one decode .*give temperature > 0$"):
        SearchConfig(method="deepconf", capacity=4, temperature=0.0)


def test_a_warmup_the_traces_never_reach_is_said():
    """w >= max_tokens: no trace is ever scored (scoring starts at depth w, a trace ends at max_tokens),
    so no round can prune or branch: Gambit ran as self-consistency without a word."""
    note = SearchConfig(capacity=4, swap=2, warmup=64, max_tokens=64).idle_warmup
    assert note.startswith("warmup w=64 is not below max_tokens 64: no trace is scored")
    assert "no round can prune or branch" in note
    assert SearchConfig(capacity=4, swap=2, warmup=63, max_tokens=64).idle_warmup == ""
    assert SearchConfig(method="sc", capacity=4, warmup=64, max_tokens=8).idle_warmup == ""  # no tournament


def test_gambit_run_refuses_a_greedy_pool_and_an_explicit_warmup_past_max_tokens():
    from gambit.run import RunConfig

    with pytest.raises(ValueError, match=r"^samples 16 at temperature 0 \(greedy\) are 16 copies"):
        RunConfig(temperature=0.0, save="", png="")
    RunConfig(temperature=0.0, samples=1, swap=0, save="", png="")
    with pytest.raises(ValueError, match=r"^--warmup 40 must be below --max-tokens 40: no trace"):
        RunConfig(warmup=40, max_tokens=40, save="", png="")
    # the default w against a short smoke run: it runs (the note is printed), as before
    assert RunConfig(max_tokens=12, save="", png="").search().idle_warmup


def test_a_gambit_pool_larger_than_one_engine_batch_is_refused():
    """C above max_num_seqs: the traces beyond the batch waited unscored and every slot a trace freed was
    refilled with a child (C 8 on 2 slots, K 0: 165 traces). SC's traces only wait their turn."""
    from gambit.run import RunConfig
    from gambit.search.config import check_batch

    with pytest.raises(ValueError, match=r"^capacity 8: Gambit keeps as many traces alive at once, more "
                                         r"than one engine batch holds \(max_num_seqs 2\)"):
        check_batch("gambit", 8, 2)
    check_batch("gambit", 2, 2)
    check_batch("sc", 8, 2)
    with pytest.raises(ValueError, match=r"^samples 300: Gambit keeps .*\(max_num_seqs 256\)"):
        RunConfig(samples=300, save="", png="")
