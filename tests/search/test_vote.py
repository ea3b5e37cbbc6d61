from gambit.search.vote import majority_vote, weighted_vote


def test_majority_vote_counts_and_breaks_ties_by_first_seen():
    assert majority_vote(["3", "5", "5", None, "3", "5"]) == "5"
    assert majority_vote(["7", "3", "3", "7"]) == "7"
    assert majority_vote([None, None]) is None
    assert majority_vote([]) is None


def test_weighted_vote_uses_weights():
    assert weighted_vote(["1", "2", "2"], [0.9, 0.3, 0.4]) == "1"
    assert weighted_vote(["1", "2", "2"], [0.5, 0.3, 0.4]) == "2"
    assert weighted_vote([None, "4"], [5.0, 0.1]) == "4"


def test_weighted_vote_counts_a_nan_weight_as_zero():
    """A NaN total first in line made ``max`` return NaN and the vote raise StopIteration."""
    nan = float("nan")
    assert weighted_vote(["1", "2"], [nan, 0.5]) == "2"
    assert weighted_vote(["1", "2", "1"], [0.4, 0.5, nan]) == "2"
    assert weighted_vote(["1", "2"], [nan, nan]) == "1"  # no weight at all: a tie, to the first reached
    assert weighted_vote(["1", "2", "2"], [0.6, 0.3, 0.3]) == "1"  # a tie in weight: the first reached
