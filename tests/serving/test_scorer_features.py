"""The served scorer reads the target's confidence too: ``ScoreRequest.features`` over real gRPC.

The served default (spec "") is the search's scorer, ``scorer-process`` (hidden state + the target's
sampled-token confidence). Its scores through the ScorerService equal the in-process scorer's bit for
bit, bad features are INVALID_ARGUMENT naming the field, and a Target calling the service decodes the
same search as one scoring in process."""

import grpc
import pytest
import torch

from gambit.paths import SCORER_MLP
from gambit.scoring import load_scorer, random_scorer
from gambit.scoring.confidence import with_confidence
from gambit.scoring.spec import load_scorer_spec, reads_confidence, shipped_folder
from gambit.serving.embedded import Embedded, EmbeddedConfig
from gambit.serving.payload import encode_states
from gambit.serving.protos import load
from gambit.serving.scorer_client import RemoteScorer
from gambit.serving.scorer_server import ScorerServerConfig, start_scorer_server
from gambit.serving.solve_config import SolveConfig
from gambit.tasks.arithmetic import TaskConfig, generate

pb2, pb2_grpc = load("scorer")
H = 192


@pytest.fixture(scope="module")
def server():
    cfg = ScorerServerConfig(port=0, metrics_port=0, batch_wait_ms=5)
    srv = start_scorer_server(cfg, scorer=load_scorer_spec(""))
    yield srv
    srv.stop()


def stub(srv):
    return pb2_grpc.ScorerServiceStub(grpc.insecure_channel(f"127.0.0.1:{srv.port}"))


def rows(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, H, generator=g), -torch.rand(n, 2, generator=g) * 6  # log-probabilities <= 0


def request(x, feats, ids):
    raw, dtype, shape = encode_states(x)
    return pb2.ScoreRequest(states=raw, dtype=dtype, shape=shape, trace_ids=ids,
                            features=[] if feats is None else feats.reshape(-1).tolist())


def test_the_served_default_is_the_process_scorer_and_says_it_reads_two_features(server):
    assert shipped_folder("process").name == "scorer-process"
    info = stub(server).Info(pb2.InfoRequest())
    assert (info.kind, info.hidden_size, info.features) == ("mlp", H, 2)
    assert reads_confidence("") and not reads_confidence("random:mlp:192")
    assert not reads_confidence(str(SCORER_MLP))


def test_scores_with_features_equal_the_in_process_scorer(server):
    ref = load_scorer(shipped_folder("process"))
    x, f = rows(7)
    ids = [f"r:{i}" for i in range(7)]
    got = torch.tensor(list(stub(server).Score(request(x, f, ids)).scores))
    assert torch.equal(got, ref.score(ids, with_confidence(x, f)))
    # the features move the scores: the same states with other confidences score otherwise
    other = torch.tensor(list(stub(server).Score(request(x, f - 3.0, ids)).scores))
    assert not torch.equal(other, got)


def test_remote_scorer_sends_the_features_the_driver_appends(server):
    ref = load_scorer(shipped_folder("process"))
    rs = RemoteScorer(f"127.0.0.1:{server.port}", H, confidence=True)
    try:
        x, f = rows(5, seed=1)
        xf = with_confidence(x, f)
        ids = [f"a:{i}" for i in range(5)]
        want = ref.score(ids, xf)
        assert torch.equal(rs.score(ids, xf), want)
        futs = [rs.score_async(ids[:2], xf[:2]), rs.score_async(ids[2:], xf[2:])]
        assert torch.equal(torch.cat([fu.result(10) for fu in futs]), want) and rs.fallbacks == 0
        with pytest.raises(ValueError, match="194"):
            rs.score(ids, x)  # the hidden state alone: the features are missing
    finally:
        rs.close()


@pytest.mark.parametrize("feats, msg", [
    ("none", "features: 0 values for 3 rows"),
    ("short", "features: 5 values for 3 rows"),
    ("nan", "features: contains NaN"),
])
def test_bad_features_are_invalid_argument_naming_the_field(server, feats, msg):
    x, f = rows(3)
    vals = {"none": [], "short": f.reshape(-1).tolist()[:5],
            "nan": [float("nan")] + f.reshape(-1).tolist()[1:]}[feats]
    raw, dtype, shape = encode_states(x)
    with pytest.raises(grpc.RpcError) as e:
        stub(server).Score(pb2.ScoreRequest(states=raw, dtype=dtype, shape=shape, trace_ids=["a", "b", "c"],
                                            features=vals))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and msg in e.value.details()


def test_features_to_a_scorer_that_reads_none_are_refused():
    srv = start_scorer_server(ScorerServerConfig(port=0, metrics_port=0), scorer=random_scorer("mlp", H))
    try:
        assert stub(srv).Info(pb2.InfoRequest()).features == 0
        x, f = rows(2)
        with pytest.raises(grpc.RpcError) as e:
            stub(srv).Score(request(x, f, ["a", "b"]))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "features: 4 values, but this scorer reads none" in e.value.details()
        assert len(stub(srv).Score(request(x, None, ["a", "b"])).scores) == 2
    finally:
        srv.stop()


def test_a_target_calling_the_service_runs_the_search_it_runs_in_process(server):
    """The Target's remote scorer gets the confidence features the driver computes, so a seeded solve
    through the ScorerService is the in-process solve: the same traces, scores and answer."""
    prob = generate("test", 1, 5, TaskConfig(6, 8))[0].prompt
    cfg = SolveConfig(capacity=6, swap=2, round_interval=8, warmup=8, max_tokens=200, seed=4)
    out = {}
    for name, ecfg in (("local", EmbeddedConfig(num_blocks=300)),
                       ("remote", EmbeddedConfig(num_blocks=300, scorer_address=f"127.0.0.1:{server.port}"))):
        e = Embedded(ecfg)
        try:
            assert e.target.scorer.confidence
            res = list(e.solve(prob, cfg))[-1]
            assert e.target.scorer.fallbacks == 0
        finally:
            e.close()
        out[name] = res
    a, b = out["local"], out["remote"]
    assert a["status"] == b["status"] == "done" and a["answer"] == b["answer"]
    assert a["traces"] == b["traces"] and a["rounds"] == b["rounds"]
    assert any(t["score"] for t in a["traces"]) and any(t["parent_id"] >= 0 for t in a["traces"])
