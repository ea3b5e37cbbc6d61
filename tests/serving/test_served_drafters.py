"""A served Target of a real checkpoint decodes `pr` with the drafter its `drafters` option maps (the
shipped drafters read only the shipped target)."""

from __future__ import annotations

import pytest

from gambit.deployments.local import ServeConfig
from gambit.drafter_map import parse_drafters
from gambit.serving.embedded import Embedded, EmbeddedConfig
from gambit.serving.solve_config import SolveConfig
from gambit.speculative.decodings import DecodingUnavailable

PROMPT = "What is 12 + 30? Think step by step."


def test_parse_drafters_and_the_configs_that_take_it():
    assert parse_drafters("") == {}
    assert parse_drafters(" pr=/a , eagle3.1=/b ") == {"pr": "/a", "eagle3.1": "/b"}
    for bad, match in (("pr", "must be NAME=FOLDER"), ("pr=", "must be NAME=FOLDER"),
                       ("hass=/x", "'hass' is not a decoding")):
        with pytest.raises(ValueError, match=match):
            parse_drafters(bad)
        with pytest.raises(ValueError, match=match):
            EmbeddedConfig(drafters=bad)
        with pytest.raises(ValueError, match=match):
            ServeConfig(drafters=bad)
    assert ServeConfig(drafters="pr=/a").app_args()["target"]["drafters"] == "pr=/a"


def test_a_served_smollm2_target_drafts_pr_with_its_mapped_drafter(smollm2_folder, smollm2_pr_drafter):
    cfg = SolveConfig(capacity=2, swap=1, round_interval=4, warmup=4, max_tokens=16, seed=1, decoding="pr")
    e = Embedded(EmbeddedConfig(model=str(smollm2_folder), num_blocks=256, spec_max_batch=0,
                                drafters=f"pr={smollm2_pr_drafter}"))
    try:
        out = list(e.solve(PROMPT, cfg))[-1]
        drafts = e.target.engine.stats.spec_drafts
    finally:
        e.close()
    assert out["status"] == "done" and out["generated_tokens"] > 0
    assert drafts > 0  # the traces were drafted by the mapped drafter, not decoded plainly


def test_a_served_smollm2_target_without_a_mapping_refuses_pr_saying_how_to_map_it(smollm2_folder):
    """Refused at admission, as DecodingUnavailable: the Target deployment answers UNIMPLEMENTED (a valid
    decoding this Target has no drafter for), not INVALID_ARGUMENT; plain runs go on."""
    e = Embedded(EmbeddedConfig(model=str(smollm2_folder), num_blocks=256))
    try:
        with pytest.raises(DecodingUnavailable, match=r"--drafters pr=FOLDER"):
            list(e.solve(PROMPT, SolveConfig(capacity=2, swap=1, max_tokens=8, seed=1, decoding="pr")))
        out = list(e.solve(PROMPT, SolveConfig(capacity=2, swap=1, max_tokens=8, seed=1)))[-1]
    finally:
        e.close()
    assert out["status"] == "done"
