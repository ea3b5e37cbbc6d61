"""``run_lease.Progress``: the heartbeat speaks for an engine loop that moves, not for a live process."""

import pytest

from gambit.serving.run_lease import LEASE_S, STUCK_S, Progress


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_step_stuck_longer_than_stuck_s_stops_the_beat_and_an_idle_loop_never_does():
    clock = _Clock()
    p = Progress(stuck_s=10, clock=clock)
    assert p.moving() and p.stuck_for() == 0.0
    clock.t += 1000  # idle for long: no work is stuck
    assert p.moving()
    p.busy()
    clock.t += 9.5  # a long step is no death
    assert p.moving() and p.stuck_for() == pytest.approx(9.5)
    clock.t += 1  # the step hangs
    assert not p.moving()
    p.idle()  # it ended after all: beat again
    assert p.moving()
    p.busy()
    clock.t += 5
    p.busy()  # the next piece of work: counted from its own start
    clock.t += 6
    assert p.moving()


def test_stuck_s_is_far_above_the_lease_and_must_be_positive():
    assert STUCK_S >= 4 * LEASE_S  # a long prefill or a slow step is not taken for a wedged engine
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="stuck_s"):
            Progress(stuck_s=bad)
