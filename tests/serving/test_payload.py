import pytest
import torch

from gambit.serving.payload import decode_features, decode_states, encode_states


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_roundtrip_is_exact(dtype):
    x = torch.randn(5, 12).to(dtype)
    raw, name, shape = encode_states(x)
    back = decode_states(raw, name, shape, [f"r:{i}" for i in range(5)], 12, 64)
    assert back.dtype == torch.float32
    assert torch.equal(back, x.float())


@pytest.mark.parametrize("change,field", [
    (dict(dtype="int8"), "dtype"),
    (dict(shape=[4, 12]), "states"),  # bytes do not match N*d*itemsize
    (dict(shape=[5, 13]), "shape"),  # wrong width
    (dict(shape=[60]), "shape"),  # wrong rank
    (dict(shape=[0, 12]), "states"),  # N = 0 is allowed (forks and drops alone), with no bytes
    (dict(raw=b"\x00" * 7), "states"),
    (dict(ids=["a"] * 4), "trace_ids"),
    (dict(ids=["a", "", "b", "c", "d"]), "trace_ids"),
])
def test_malformed_payload_names_the_field(change, field):
    raw, name, shape = encode_states(torch.randn(5, 12))
    args = dict(raw=raw, dtype=name, shape=shape, ids=[str(i) for i in range(5)])
    args.update(change)
    with pytest.raises(ValueError, match=rf"^{field}:"):
        decode_states(args["raw"], args["dtype"], args["shape"], args["ids"], 12, 64)


def test_zero_rows_decode_to_an_empty_batch():
    """A request of forks and drops alone: it was refused ("N=0 rows must be in [1, 4096]")."""
    assert decode_states(b"", "float32", [0, 12], [], 12, 64).shape == (0, 12)
    assert decode_features([], 0, 2).shape == (0, 2)
    with pytest.raises(ValueError, match=r"^trace_ids: 1 ids for 0 rows"):
        decode_states(b"", "float32", [0, 12], ["a"], 12, 64)


def test_too_many_rows_and_nan_are_refused():
    raw, name, shape = encode_states(torch.randn(5, 12))
    with pytest.raises(ValueError, match="^shape:"):
        decode_states(raw, name, shape, list("abcde"), 12, 4)
    bad = torch.randn(2, 12)
    bad[1, 3] = float("nan")
    raw, name, shape = encode_states(bad)
    with pytest.raises(ValueError, match="^states:"):
        decode_states(raw, name, shape, ["a", "b"], 12, 64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_states_are_refused_in_every_dtype(dtype, bad):
    x = torch.randn(3, 12)
    x[2, 7] = bad
    raw, name, shape = encode_states(x.to(dtype))
    with pytest.raises(ValueError, match="^states: contains NaN or infinity"):
        decode_states(raw, name, shape, ["a", "b", "c"], 12, 64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_states_too_large_for_a_scorer_are_refused(dtype):
    """Finite but huge rows (3e38) overflowed the scorer's layers: NaN scores, where the proto promises
    [0, 1]. float16's range is the bound; a row at it still scores."""
    x = torch.randn(3, 12)
    x[1, 4] = 3e38
    raw, name, shape = encode_states(x.to(dtype))
    with pytest.raises(ValueError, match=r"^states: \|value\| up to 3[.0-9]*e\+38, at most 65504"):
        decode_states(raw, name, shape, ["a", "b", "c"], 12, 64)
    x[1, 4] = -6e4
    raw, name, shape = encode_states(x.to(dtype))
    assert decode_states(raw, name, shape, ["a", "b", "c"], 12, 64).shape == (3, 12)


def test_features_must_be_log_probabilities():
    assert decode_features([-0.5, 0.0, -3.0, -1e-7], 2, 2).shape == (2, 2)
    with pytest.raises(ValueError, match=r"^features: log-probabilities must be <= 0, got 1e\+30"):
        decode_features([-0.5, 1e30, -3.0, -1.0], 2, 2)


def test_trace_ids_are_bounded_in_bytes_and_a_targets_keys_pass():
    """A 64 MB trace id was accepted and kept by a sequence scorer as a key (no bound on its length)."""
    from gambit.serving.payload import MAX_TRACE_ID_BYTES, check_ids

    raw, name, shape = encode_states(torch.randn(2, 12))
    longest = "r" * 64 + ":" + str(2**63)  # a Target's "run:node": run ids are at most 64 characters
    assert decode_states(raw, name, shape, [longest, "x" * MAX_TRACE_ID_BYTES], 12, 64).shape == (2, 12)
    for bad in ("x" * 10_000, "\U0001F600" * 33):  # 132 bytes in 33 characters
        size = len(bad.encode())
        with pytest.raises(ValueError, match=rf"^trace_ids: trace id .* is {size} bytes, at most 128"):
            decode_states(raw, name, shape, ["a", bad], 12, 64)
    with pytest.raises(ValueError, match="^drops: empty trace id"):
        check_ids("drops", ["a", ""])
