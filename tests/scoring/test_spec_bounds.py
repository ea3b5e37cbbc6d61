"""A scorer's history bounds (``max_keys``, ``max_state_mb``) are given as it is built, on every path
that builds one from a spec: the start paths set them afterwards, so a scorer was briefly unbounded and
a path that forgot kept the defaults."""

from __future__ import annotations

import pytest

from gambit.scoring import ScorerConfig, load_scorer, random_scorer, save_scorer
from gambit.scoring.spec import load_scorer_spec


@pytest.mark.parametrize("spec", ["random:sequence:16", "random:mlp:16", "sequence", "mlp"])
def test_load_scorer_spec_builds_the_scorer_with_its_bounds(spec):
    s = load_scorer_spec(spec, 192 if ":" not in spec else 0, note=None, max_keys=3, max_state_mb=7)
    assert (s.max_keys, s.max_state_mb) == (3, 7)


def test_a_scorer_folder_loads_with_its_bounds(tmp_path):
    net = random_scorer("sequence", 16, seed=1)
    folder = save_scorer(net, ScorerConfig(kind="sequence", hidden_size=16), tmp_path / "s")
    got = load_scorer(folder, max_keys=5, max_state_mb=2)
    assert (got.max_keys, got.max_state_mb) == (5, 2)
    assert load_scorer_spec(str(folder), 16, max_keys=4).max_keys == 4
    with pytest.raises(ValueError, match="max_keys must be an int >= 1"):
        load_scorer_spec(str(folder), 16, max_keys=0)


def test_the_confidence_scorer_takes_no_bounds_and_is_still_loaded():
    assert load_scorer_spec("confidence:16", max_keys=3).hidden_size == 16
