"""Per-thought labels and the confidence features: values on hand-made traces."""

import torch

from gambit.scoring.confidence import CLIP, SCALE, ConfidenceTracker
from gambit.scoring.labels import boundary_labels, prefix_all
from gambit.scoring.rollouts import step_labels
from gambit.tasks.arithmetic import Problem


def test_prefix_all_turns_false_at_the_first_bad_thought_per_trace():
    ok = torch.tensor([True, False, True, True, True, False])
    trace = torch.tensor([0, 0, 0, 1, 1, 1])
    assert prefix_all(ok, trace).tolist() == [True, False, False, True, True, False]
    data = {"step_ok": ok, "step_ref": torch.ones(6, dtype=torch.bool), "trace": trace,
            "correct": torch.tensor([False, True])}
    assert boundary_labels(data, "final").tolist() == [False] * 3 + [True] * 3
    assert boundary_labels(data, "path").all()


def test_step_labels_check_arithmetic_and_the_reference():
    p = Problem("(5+3)*2", ((5, "+", 3, 8), (8, "*", 2, 16)), 16)
    ok, ref = step_labels("5+3=8\n\n8*2=17\n\n\\boxed{17}", p, 2)
    assert ok.tolist() == [True, False] and ref.tolist() == [True, False]
    ok, ref = step_labels("5+4=9\n\n9*2=18\n\n\\boxed{18}", p, 2)
    assert ok.tolist() == [True, True] and ref.tolist() == [False, False]


def test_confidence_tracker_splits_by_position_and_forks():
    t = ConfidenceTracker()
    for pos, lp in [(10, -0.1), (11, -2.0), (12, -0.2), (13, -0.5)]:  # 13: next thought's token
        t.token(pos, lp)
    assert t.boundary(12) == [-2.0 / SCALE, -2.0 / SCALE]
    c = t.fork()
    c.token(14, -50.0)
    assert c.boundary(14) == [CLIP / SCALE, CLIP / SCALE]
    assert t.boundary(14) == [-0.5 / SCALE, -2.0 / SCALE]  # the parent is unaffected by its child
