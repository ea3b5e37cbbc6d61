"""``ServeAppSpec`` (the chart's config) and ``ServeConfig`` (`gambit serve`) share one check of their
common fields (``serve_config.check_serve_settings``): the spec had drifted and took values `gambit
serve` refused, which failed in a replica after Ray started."""

from __future__ import annotations

import re

import pytest

from gambit.deployments.local import ServeConfig
from gambit.ops.serve_config import ServeAppSpec


@pytest.mark.parametrize("cls", [ServeAppSpec, ServeConfig])
@pytest.mark.parametrize("fields, message", [
    ({"hidden_size": -1}, "hidden_size must be >= 0, got -1"),
    ({"num_blocks": -1}, "num_blocks must be >= 0, got -1"),
    ({"target_gpus": -2}, "target_gpus must be >= 0, or -1"),
    ({"max_keys": 1.5}, "max_keys must be a whole number, got 1.5"),
    ({"max_state_mb": True}, "max_state_mb must be a whole number, got True"),
])
def test_both_configs_refuse_the_same_values_naming_the_field(cls, fields, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        cls(**fields)


@pytest.mark.parametrize("cls", [ServeAppSpec, ServeConfig])
@pytest.mark.parametrize("fields, message", [
    ({"batch_wait_ms": 2000}, "batch_wait_ms must be at most 1000"),
    ({"max_rows": 8}, "max_rows: 8 is below max_num_seqs 256"),
    ({"max_keys": 0}, "max_keys must be >= 1, got 0"),
    ({"spec_max_batch": -1}, "spec_max_batch must be >= 0, got -1"),
    ({"resume_wait_s": 0}, "resume_wait_s must be > 0, got 0"),
    ({"retention_s": 0}, "retention_s must be >= 1, got 0"),
    ({"scorer_address": "nohost"}, "scorer_address: 'nohost' is not host:port"),
    ({"tree": "redis://:pw@h:6379/0"}, "tree"),
])
def test_the_checks_both_had_keep_their_messages(cls, fields, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        cls(**fields)
