import math
import re

import pytest

from gambit.serving.protos import load
from gambit.serving.solve_config import SolveConfig, check_run_id, from_request, server_defaults


@pytest.mark.parametrize("fields,name", [
    (dict(capacity=0), "capacity"), (dict(capacity=2, swap=3), "swap"), (dict(method="beam"), "method"),
    (dict(decoding="medusa"), "decoding"), (dict(round_interval=0), "round_interval"),
    (dict(max_tokens=0), "max_tokens"), (dict(temperature=-1.0), "temperature"),
    (dict(temperature=math.nan), "temperature"), (dict(timeout_s=-1.0), "timeout_s"),
    (dict(timeout_s=math.inf), "timeout_s"), (dict(timeout_s=math.nan), "timeout_s"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(top_p=math.nan), "top_p"),
    (dict(top_k=-1), "top_k"), (dict(method="deepconf", capacity=1, swap=1), "capacity"),
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


def test_top_p_and_top_k_reach_the_traces_sampling():
    """A request's top_p / top_k (or the server's defaults) become every trace's sampling filter."""
    from gambit.serving.driver_adapter import search_config

    pb2, _ = load("reasoning")
    d = SolveConfig(top_p=0.9)
    _, cfg = from_request(pb2.SolveRequest(problem="x"), d)
    assert (cfg.top_p, cfg.top_k) == (pytest.approx(0.9), 0)
    _, cfg = from_request(pb2.SolveRequest(problem="x", top_p=0.95, top_k=40), d)
    assert (cfg.top_p, cfg.top_k) == (pytest.approx(0.95), 40)
    sc = search_config(cfg)
    assert (sc.top_p, sc.top_k) == (pytest.approx(0.95), 40)
    for bad, field in ((pb2.SolveRequest(problem="x", top_p=0.0), "top_p"),
                       (pb2.SolveRequest(problem="x", top_p=1.25), "top_p")):
        with pytest.raises(ValueError, match=rf"^{field}:"):
            from_request(bad, d)


def test_client_sends_only_what_it_was_given():
    from gambit.serving.client import ClientConfig, solve_request

    pb2, _ = load("reasoning")
    req = solve_request(pb2, "x", ClientConfig())
    assert not req.HasField("temperature") and not req.HasField("top_p") and not req.HasField("top_k")
    req = solve_request(pb2, "x", ClientConfig(temperature=0.0, top_p=0.95, top_k=0))
    assert (req.temperature, req.top_k) == (0.0, 0) and req.top_p == pytest.approx(0.95)
    assert req.HasField("temperature") and req.HasField("top_k")


def test_server_defaults_take_a_swap_above_the_capacity_as_the_capacity():
    # the chart's serve.solveDefaults {capacity: 1} (swap 2 left as is) used to fail every Coordinator replica
    small = server_defaults({"capacity": 1, "swap": 2})
    assert (small.capacity, small.swap) == (1, 1)
    assert server_defaults({"swap": 9}).swap == SolveConfig().capacity
    assert server_defaults({"capacity": 4, "swap": 0}).swap == 0
    assert server_defaults(None) == SolveConfig()
    with pytest.raises(ValueError, match=r"^capacity:"):
        server_defaults({"capacity": 0, "swap": 2})


@pytest.mark.parametrize("run_id", ["abc\n", "a" * 65, "bad id", "", "x/y"])
def test_a_bad_run_id_is_refused_naming_the_field(run_id):
    # 'abc\n' passed (re.match's $ matches before a final newline) and failed later without the field
    with pytest.raises(ValueError, match="^run_id:"):
        check_run_id(run_id)


def test_a_greedy_request_of_more_than_one_trace_is_refused_naming_capacity():
    """temperature 0 with C > 1 ran C copies of one decode (and Gambit branched copies of their parents);
    a request is refused now, with the way out. One greedy trace stays a valid request."""
    with pytest.raises(ValueError, match=r"^capacity: C 4 at temperature 0 \(greedy\) are 4 copies .*"
                                         r"give temperature > 0 or C 1$"):
        SolveConfig(capacity=4, swap=1, temperature=0.0)
    with pytest.raises(ValueError, match=r"^capacity: C 2 at temperature 0 .*give temperature > 0$"):
        SolveConfig(method="deepconf", capacity=2, swap=0, temperature=0.0)
    pb2, _ = load("reasoning")
    with pytest.raises(ValueError, match=r"^capacity: C 8 at temperature 0"):  # the server's default C
        from_request(pb2.SolveRequest(problem="x", temperature=0.0), SolveConfig())
    _, cfg = from_request(pb2.SolveRequest(problem="x", capacity=1, temperature=0.0), SolveConfig())
    assert (cfg.capacity, cfg.swap, cfg.temperature) == (1, 1, 0.0)
    with pytest.raises(ValueError, match=r"^capacity: C 8 at temperature 0"):  # `gambit serve`: at its start
        server_defaults({"temperature": 0.0})


@pytest.mark.parametrize("fields,message", [
    (dict(max_tokens="8"), "max_tokens: must be an integer, got '8'"),  # a TypeError from a comparison
    (dict(capacity=2.5), "capacity: must be an integer, got 2.5"),  # refused at admission, unnamed
    (dict(swap=True), "swap: must be an integer, got True"),
    (dict(temperature="hot"), "temperature: must be a number, got 'hot'"),
    (dict(raw_prompt=1), "raw_prompt: must be true or false, got 1"),
    (dict(method=None), "method: must be a string, got None"),
])
def test_a_config_built_in_python_with_a_wrong_type_is_refused_naming_its_field(fields, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        SolveConfig(**fields)
    assert SolveConfig(temperature=1, timeout_s=5).temperature == 1  # an int where a float goes: fine
