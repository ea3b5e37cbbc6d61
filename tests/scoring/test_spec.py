"""One scorer grammar for `gambit run`, the benchmarks and the services (gambit.scoring.spec)."""

from __future__ import annotations

import grpc
import pytest
import torch

from gambit import paths
from gambit.scoring import BoundaryScorer, ConfidenceScorer, load_scorer
from gambit.scoring.spec import SHIPPED, keeps_history, load_scorer_spec, reads_confidence, shipped_folder
from gambit.serving.scorer_core import feature_count

SPECS = ["", "process", "mlp", "sequence", "confidence", "confidence:64", "random", "random:sequence",
         "random:mlp:32:7"]


@pytest.mark.parametrize("spec", SPECS)
def test_reads_confidence_says_what_the_loaded_scorer_reads(spec):
    """A Target decides from the spec alone whether to send the confidence features: it must agree
    with the scorer the Scorer app loads from the same spec, at the shipped width and at another."""
    for hidden in (0, 192, 576):
        scorer = load_scorer_spec(spec, hidden, note=None)
        assert reads_confidence(spec) == (feature_count(scorer) > 0), (spec, hidden)


def test_shipped_names_load_the_shipped_folders_bit_for_bit():
    x = torch.randn(5, 194, generator=torch.Generator().manual_seed(0))
    for name in SHIPPED:
        got, ref = load_scorer_spec(name, 192), load_scorer(shipped_folder(name))
        assert isinstance(got, BoundaryScorer) and got.kind == ref.kind
        rows = x[:, :got.input_size]
        keys = [f"t{i}" for i in range(5)]
        assert torch.equal(got.score(keys, rows), ref.score(keys, rows))
    assert load_scorer_spec("", 192).confidence and load_scorer_spec("process", 192).confidence


def test_random_and_confidence_arguments():
    r = load_scorer_spec("random:sequence:32:3")
    assert (r.kind, r.hidden_size) == ("sequence", 32)
    a, b = load_scorer_spec("random:mlp:32:3"), load_scorer_spec("random:mlp:32:3")
    c = load_scorer_spec("random:mlp:32:4")
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(1))
    keys = ["a", "b", "c"]
    sa = a.score(keys, x)
    assert torch.equal(sa, b.score(keys, x)) and not torch.equal(sa, c.score(keys, x))
    assert load_scorer_spec("random", 576).hidden_size == 576  # the model's width where none is named
    assert load_scorer_spec("random").hidden_size == 192 and load_scorer_spec("confidence").hidden_size == 192
    assert isinstance(load_scorer_spec("confidence:64", 576), ConfidenceScorer)


@pytest.mark.parametrize("spec, match", [
    ("random:gru", "random kind must be mlp or sequence"),
    ("random:mlp:wide", "hidden size 'wide' is not an integer"),
    ("random:mlp:0", "hidden size must be >= 1"),
    ("random:mlp:32:-1", "seed must be >= 0"),
    ("confidence:x", "hidden size 'x' is not an integer"),
    ("confidence:64:1", "at most a hidden size"),
    ("no/such/folder", "no scorer folder there .*process \\| mlp \\| sequence"),
])
def test_a_bad_spec_is_refused_with_what_was_wrong(spec, match):
    with pytest.raises(ValueError, match=match):
        load_scorer_spec(spec)


def test_a_fallback_is_noted_once_and_says_why():
    notes: list[str] = []
    assert isinstance(load_scorer_spec("process", 576, note=notes.append), ConfidenceScorer)
    assert isinstance(load_scorer_spec("mlp", 576, note=notes.append), BoundaryScorer)
    load_scorer_spec("process", 192, note=notes.append)  # fits: no note
    assert len(notes) == 2
    assert "reads width 192, this model has 576" in notes[0] and "ConfidenceScorer" in notes[0]
    assert "random one (no signal)" in notes[1]


def test_the_standalone_scorer_server_takes_a_shipped_name():
    """`gambit scorer serve --scorer mlp` refused the name before (the services took folders only)."""
    from gambit.serving.protos import load
    from gambit.serving.scorer_server import ScorerServerConfig, start_scorer_server

    pb2, pb2_grpc = load("scorer")
    srv = start_scorer_server(ScorerServerConfig(scorer="mlp", port=0, metrics_port=-1))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{srv.port}") as ch:
            info = pb2_grpc.ScorerServiceStub(ch).Info(pb2.InfoRequest(), timeout=10)
        assert (info.kind, info.hidden_size, info.features) == ("mlp", 192, 0)
    finally:
        srv.stop()


@pytest.mark.parametrize("spec, keeps", [
    ("", False), ("process", False), ("mlp", False), ("confidence", False), ("random", False),
    ("sequence", True), ("random:sequence", True), ("random:sequence:576:3", True),
    (str(paths.SCORER_SEQUENCE), True), (str(paths.SCORER_MLP), False),
])
def test_keeps_history_names_the_sequence_scorers(spec, keeps):
    assert keeps_history(spec) is keeps
    if spec:  # the loaded scorer agrees (the Scorer replica checks the loaded one)
        assert (getattr(load_scorer_spec(spec, note=None), "kind", "") == "sequence") is keeps


def test_a_sequence_scorer_deploys_as_one_replica(monkeypatch):
    """Two replicas of a sequence scorer each scored a trace from half of its boundaries: `gambit serve
    --scorer sequence` autoscaled to two, the chart's default to four."""
    from types import SimpleNamespace

    from ray import serve

    from gambit.deployments import scorer as scorer_deployment
    from gambit.deployments.app import build_scorer
    from gambit.ops.serve_config import ServeAppSpec, profile, serve_config

    config = build_scorer({"scorer": "sequence"})._bound_deployment._deployment_config
    assert (config.num_replicas, config.autoscaling_config) == (1, None)
    assert build_scorer({"scorer": "mlp"})._bound_deployment._deployment_config.autoscaling_config is not None
    for name in ("sequence", "random:sequence", str(paths.SCORER_SEQUENCE)):
        apps = serve_config(profile("kubernetes", ServeAppSpec(scorer=name)))["applications"]
        deps = apps[1]["deployments"]
        assert deps[0]["num_replicas"] == 1 and "autoscaling_config" not in deps[0], name
    deps = serve_config(profile("kubernetes", ServeAppSpec()))["applications"][1]["deployments"]
    assert deps[0]["autoscaling_config"]["max_replicas"] == 4
    # a config file that still autoscales a sequence scorer folder is refused by the replica itself
    auto = SimpleNamespace(max_replicas=4)
    monkeypatch.setattr(serve, "get_replica_context", lambda: SimpleNamespace(
        _deployment_config=SimpleNamespace(autoscaling_config=auto, num_replicas=None)))
    with pytest.raises(ValueError, match="may run 4 replicas; set the Scorer's num_replicas to 1"):
        scorer_deployment._check_one_replica("folder")
    auto.max_replicas = 1
    scorer_deployment._check_one_replica("folder")
