"""``gambit run``'s wall limit: on by default only for the shipped target, and named when it stops a run."""

import pytest

from gambit.cli import main
from gambit.run import SHIPPED_WALL_S, RunConfig


def test_the_wall_limit_defaults_to_25_s_on_the_shipped_target_only():
    """25 s cut every trace of the README's SmolLM2 question at 17 tokens (graded WRONG)."""
    assert RunConfig().wall_limit() == SHIPPED_WALL_S == 25.0
    assert RunConfig().search().max_wall_s == 25.0
    assert RunConfig(model="smollm2").wall_limit() == 0.0  # no limit on another model
    assert RunConfig(model="smollm2", max_wall_s=5).wall_limit() == 5.0
    assert RunConfig(max_wall_s=0).wall_limit() == 0.0
    for bad in (-2.0, float("nan")):
        with pytest.raises(ValueError, match="max_wall_s must be >= 0 seconds"):
            RunConfig(max_wall_s=bad)


def test_a_run_cut_by_the_wall_limit_says_so_not_max_tokens(tmp_path, capsys):
    """It said "a trace stops at --max-tokens 400" whatever stopped the run."""
    assert main(["run", "--problems", "1", "--samples", "2", "--swap", "1", "--max-wall-s", "0.001",
                 "--save", "", "--png", ""]) == 0
    out = capsys.readouterr().out
    assert "the run stopped at its limit, max_wall_s 0.001: raise --max-wall-s (0 = no limit)" in out
    assert "a trace stops at --max-tokens" not in out
