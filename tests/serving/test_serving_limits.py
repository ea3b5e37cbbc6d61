"""The Scorer path's message and size limits live in ``gambit.serving.limits``: the client, the server,
the payload checks and the message-size arithmetic read the same numbers (one raised, all raised)."""

from __future__ import annotations


def test_every_reader_takes_the_limits_from_one_module():
    from gambit.ops import serve_config, serve_env
    from gambit.serving import limits, payload, scorer_client, scorer_core, scorer_endpoints, scorer_server

    assert scorer_client.MAX_PENDING == scorer_core.MAX_PENDING == limits.MAX_PENDING
    assert payload.MAX_TRACE_ID_BYTES == limits.MAX_TRACE_ID_BYTES
    assert serve_env.EDIT_BYTES == limits.EDIT_BYTES == 2 * limits.MAX_PENDING * (
        2 * (limits.MAX_TRACE_ID_BYTES + 2) + 2)
    assert (serve_env.SCORER_ENDPOINT_MESSAGE_BYTES == scorer_endpoints.SCORER_ENDPOINT_MESSAGE_BYTES
            == scorer_server.SCORER_ENDPOINT_MESSAGE_BYTES == limits.SCORER_ENDPOINT_MESSAGE_BYTES)
    assert scorer_server.MAX_BATCH_WAIT_MS == limits.MAX_BATCH_WAIT_MS
    assert serve_config.MAX_KEYS == limits.MAX_KEYS and serve_config.MAX_ROWS == limits.MAX_ROWS
    assert scorer_core.max_edits(1) == 2 * limits.MAX_PENDING  # a down Scorer's whole queue is taken


def test_the_torch_free_copies_match_the_scorer_and_every_default():
    from gambit.deployments.local import ServeConfig
    from gambit.scoring import scorer
    from gambit.serving import limits
    from gambit.serving.scorer_server import ScorerServerConfig

    assert (limits.MAX_KEYS, limits.MAX_STATE_MB) == (scorer.MAX_KEYS, scorer.MAX_STATE_MB)
    for cfg in (ServeConfig(), ScorerServerConfig()):
        assert (cfg.max_keys, cfg.max_state_mb, cfg.max_rows) == (
            limits.MAX_KEYS, limits.MAX_STATE_MB, limits.MAX_ROWS)
