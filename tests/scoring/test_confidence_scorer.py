"""The training-free scorer: exp(the trace's lowest sampled-token log-probability so far), for a model
with no trained scorer of its width; what the loaders fall back to for the process scorer."""

from __future__ import annotations

import math

import pytest
import torch

from gambit.scoring import BoundaryScorer, ConfidenceScorer
from gambit.scoring.confidence import with_confidence
from gambit.scoring.spec import load_scorer_spec, reads_confidence
from gambit.serving.scorer_core import feature_count


def rows(n: int, h: int = 16, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return with_confidence(torch.randn(n, h, generator=g), -torch.rand(n, 2, generator=g) * 8)


def test_scores_are_the_probability_of_the_least_likely_sampled_token_so_far():
    s = ConfidenceScorer(16)
    x = rows(9)
    got = s.score([f"k{i}" for i in range(9)], x)
    want = torch.tensor([math.exp(v) for v in x[:, -1].tolist()], dtype=torch.float32)
    assert torch.equal(got, want) and bool(((got > 0) & (got <= 1)).all())
    assert s.score(["a"], with_confidence(torch.randn(1, 16), torch.zeros(1, 2))).item() == 1.0
    # the hidden state is unread: other states, the same features, the same scores
    y = x.clone()
    y[:, :16] = torch.randn(9, 16)
    assert torch.equal(s.score([f"k{i}" for i in range(9)], y), got)


def test_a_rows_score_is_its_own_in_any_batch():
    s = ConfidenceScorer(16)
    x = rows(40, seed=1)
    keys = [f"k{i}" for i in range(40)]
    whole = s.score(keys, x)
    for cut in (1, 7, 33):
        parts = torch.cat([s.score(keys[:cut], x[:cut]), s.score(keys[cut:], x[cut:])])
        assert torch.equal(parts, whole)


def test_bad_input_is_a_clear_error():
    s = ConfidenceScorer(16)
    with pytest.raises(ValueError, match="confidence features"):
        s.score(["a"], torch.randn(1, 16))  # the features are missing
    with pytest.raises(ValueError, match="NaN"):
        s.score(["a"], with_confidence(torch.randn(1, 16), torch.tensor([[float("nan"), -1.0]])))
    with pytest.raises(ValueError, match="one key per row"):
        s.score(["a", "b"], rows(1))
    with pytest.raises(ValueError, match="hidden_size"):
        ConfidenceScorer(0)


def test_loaders_fall_back_to_it_where_the_process_scorer_cannot_read_the_model():
    assert isinstance(load_scorer_spec("confidence", 576), ConfidenceScorer)
    fb = load_scorer_spec("process", 576, note=None)
    assert isinstance(fb, ConfidenceScorer) and fb.input_size == 578
    assert isinstance(load_scorer_spec("process", 192), BoundaryScorer)  # the shipped one fits
    mlp = load_scorer_spec("mlp", 576, note=None)  # a hidden-state scorer: a random one of its kind
    assert isinstance(mlp, BoundaryScorer) and mlp.hidden_size == 576 and not mlp.confidence
    served = load_scorer_spec("", 576)
    assert isinstance(served, ConfidenceScorer) and feature_count(served) == 2
    assert isinstance(load_scorer_spec("", 192), BoundaryScorer)
    assert load_scorer_spec("confidence:64").hidden_size == 64
    assert reads_confidence("confidence") and reads_confidence("confidence:64")


def test_a_served_target_of_a_real_checkpoint_searches_with_its_own_confidence(smollm2_folder):
    """SmolLM2-135M (width 576; the shipped scorers read 192): the served default scores with the
    target's confidence (it was a scorer that refused every row), so the tournament ranks on a signal."""
    from gambit.serving.embedded import Embedded, EmbeddedConfig
    from gambit.serving.solve_config import SolveConfig

    e = Embedded(EmbeddedConfig(model=str(smollm2_folder), num_blocks=256))
    try:
        assert isinstance(e.target.scorer.inner, ConfidenceScorer) and e.target.scorer.confidence
        cfg = SolveConfig(capacity=3, swap=1, round_interval=4, warmup=4, max_tokens=40, seed=1)
        res = list(e.solve("What is 12 + 30? Think step by step.", cfg))
    finally:
        e.close()
    out = res[-1]
    assert out["status"] == "done" and out["rounds"] >= 2
    scores = [t["score"] for t in out["traces"]]
    assert any(0 < x < 1 for x in scores) and all(0 <= x <= 1 for x in scores)
    assert out["scorer_fallbacks"] == 0
