import math

import pytest

from gambit.checks import above, at_least


def test_a_range_error_names_the_value_and_what_it_was():
    at_least(1, steps=3, batch_size=1)
    above(0, lr=1e-4)
    with pytest.raises(ValueError, match=r"^batch_size must be >= 1, got 0$"):
        at_least(1, steps=3, batch_size=0)
    with pytest.raises(ValueError, match=r"^lr must be > 0, got 0.0$"):
        above(0, lr=0.0)
    with pytest.raises(ValueError, match="lr must be > 0, got nan"):  # NaN passes no comparison
        above(0, lr=math.nan)


@pytest.mark.parametrize("argv, said", [
    (["train", "drafter", "--steps", "0"], "gambit train drafter: error: --steps must be >= 1, got 0"),
    (["train", "target", "--lr", "0"], "gambit train target: error: --lr must be > 0, got 0.0"),
    (["train", "drafter", "--hass-topk", "0"],
     "gambit train drafter: error: --hass-topk must be >= 1, got 0"),
    (["run", "--kv-blocks", "0"], "gambit run: error: --kv-blocks must be >= 1, got 0"),
])
def test_the_cli_names_the_flag_out_of_range(argv, said):
    """`gambit train drafter --steps 0` said "steps, batch_size, ttt_steps and lr must be positive"."""
    from gambit.cli import main

    with pytest.raises(SystemExit, match=said):  # said before anything loads
        main(argv)


def test_finite_and_within_name_the_first_bad_value():
    from gambit.checks import finite, within

    finite(a=0.0, b=-1e300)
    within(0, 1, a=0.0, b=1.0)
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(ValueError, match=r"^b must be a finite number, got"):
            finite(a=1.0, b=bad)
    for bad in (float("nan"), 1.5, -0.1):
        with pytest.raises(ValueError, match=r"^b must be in \[0, 1\], got"):
            within(0, 1, a=0.5, b=bad)
