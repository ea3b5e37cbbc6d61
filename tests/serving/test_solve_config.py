import math

import pytest

from gambit.serving.protos import load
from gambit.serving.solve_config import SolveConfig, from_request


@pytest.mark.parametrize("fields,name", [
    (dict(capacity=0), "capacity"), (dict(capacity=2, swap=3), "swap"), (dict(method="beam"), "method"),
    (dict(decoding="medusa"), "decoding"), (dict(round_interval=0), "round_interval"),
    (dict(max_tokens=0), "max_tokens"), (dict(temperature=-1.0), "temperature"),
    (dict(temperature=math.nan), "temperature"), (dict(timeout_s=-1.0), "timeout_s"),
    (dict(timeout_s=math.inf), "timeout_s"), (dict(timeout_s=math.nan), "timeout_s"),
])
def test_bad_values_name_their_field(fields, name):
    with pytest.raises(ValueError, match=rf"^{name}:"):
        SolveConfig(**fields)


def test_request_defaults_and_overrides():
    pb2, _ = load("reasoning")
    d = SolveConfig(capacity=6, swap=2, max_tokens=100)
    problem, cfg = from_request(pb2.SolveRequest(problem="Compute 1+2.\nSolution:\n"), d)
    assert (cfg.capacity, cfg.swap, cfg.max_tokens) == (6, 2, 100)
    assert (cfg.method, cfg.decoding) == ("gambit", "plain")
    _, cfg = from_request(pb2.SolveRequest(problem="x", capacity=1, method="sc", temperature=0.0), d)
    assert (cfg.capacity, cfg.swap, cfg.method, cfg.temperature) == (1, 1, "sc", 0.0)
    req = pb2.SolveRequest(problem="x", capacity=3)
    req.swap = 0
    assert from_request(req, d)[1].swap == 0
    bad_requests = ((pb2.SolveRequest(problem=""), "problem"), (pb2.SolveRequest(problem="x" * 9000),
                                                                "problem"),
                    (pb2.SolveRequest(problem="x", capacity=0), "capacity"))
    for bad, field in bad_requests:
        with pytest.raises(ValueError, match=rf"^{field}:"):
            from_request(bad, d)
