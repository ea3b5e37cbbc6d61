"""Hidden states on the wire: raw little-endian bytes + dtype + shape. Never pickle.

``decode_states`` checks every field before touching the bytes and raises ``ValueError`` whose
message starts with the field name, so servers can answer INVALID_ARGUMENT naming it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from gambit.serving.limits import MAX_TRACE_ID_BYTES  # the longest trace id a Scorer keeps

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
MAX_STATE = 65504.0  # the largest |value| a hidden-state row may hold: float16's largest
LOGPROB_SLACK = 1e-4  # a log-probability feature above 0 by more than rounding is not one


def encode_states(states: torch.Tensor) -> tuple[bytes, str, list[int]]:
    """``(raw bytes, dtype name, shape)`` of a [N, d] float tensor (float64 is sent as float32)."""
    if states.dim() != 2:
        raise ValueError(f"states must be [N, d], got shape {tuple(states.shape)}")
    if states.dtype == torch.float64:
        states = states.float()
    name = next((k for k, v in DTYPES.items() if v == states.dtype), None)
    if name is None:
        raise ValueError(f"states dtype {states.dtype} is not one of {sorted(DTYPES)}")
    t = states.detach().cpu().contiguous()
    raw = t.view(torch.int16).numpy().tobytes() if name == "bfloat16" else t.numpy().tobytes()
    return raw, name, list(t.shape)


def decode_states(raw: bytes, dtype: str, shape: Sequence[int], trace_ids: Sequence[str],
                  hidden_size: int, max_rows: int) -> torch.Tensor:
    """The [N, d] float32 tensor a request carries, or ValueError naming the bad field."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype: {dtype!r} is not one of {sorted(DTYPES)}")
    shape = list(shape)
    if len(shape) != 2:
        raise ValueError(f"shape: expected [N, d] (2 dimensions), got {shape}")
    n, d = shape
    if d != hidden_size:
        raise ValueError(f"shape: width d={d} does not match the scorer's hidden size {hidden_size}")
    if not 0 <= n <= max_rows:  # 0: a request that only carries forks and drops
        raise ValueError(f"shape: N={n} rows must be in [0, {max_rows}]")
    want = n * d * _ITEMSIZE[dtype]
    if len(raw) != want:
        raise ValueError(f"states: {len(raw)} bytes, but {dtype} x {shape} needs {want}")
    if len(trace_ids) != n:
        raise ValueError(f"trace_ids: {len(trace_ids)} ids for {n} rows")
    check_ids("trace_ids", trace_ids)
    # numpy only: this runs on a server's handler threads, and a torch op there could start an
    # OpenMP pool per thread (``gambit.engine.torch_threads``); bfloat16 is float32's top 16 bits
    if dtype == "bfloat16":
        a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        a = np.frombuffer(raw, dtype="<f4" if dtype == "float32" else "<f2").astype(np.float32)
    a = a.reshape(n, d)
    if not np.isfinite(a).all():
        raise ValueError(f"states: contains NaN or infinity ({_rows(~np.isfinite(a).all(1), trace_ids)})")
    big = float(np.abs(a).max()) if n else 0.0
    if big > MAX_STATE:  # finite, but a scorer's layers overflow on it: NaN scores, not in [0, 1]
        where = _rows(np.abs(a).max(1) > MAX_STATE, trace_ids)
        raise ValueError(f"states: |value| up to {big:.3g}, at most {MAX_STATE:g} (float16's range; a "
                         f"post-norm hidden state is far smaller; {where})")
    return torch.from_numpy(a)


def _rows(bad: np.ndarray, trace_ids: Sequence[str]) -> str:
    """The refused rows, named for the caller: a caller scores the others alone (``scorer_core.bad_rows``)."""
    rows = np.flatnonzero(bad).tolist()
    more = f" and {len(rows) - 4} more" if len(rows) > 4 else ""
    return f"rows {rows[:4]}{more}, trace_ids {[trace_ids[i] for i in rows[:4]]}"


def check_ids(field: str, ids: Sequence[str]) -> None:
    """ValueError naming ``field`` for an empty id or one over ``MAX_TRACE_ID_BYTES``: a sequence
    scorer keeps every id it is sent as a key, so a huge one would stay in its memory."""
    for k in ids:
        if not k:
            raise ValueError(f"{field}: empty trace id")
        if len(k) <= MAX_TRACE_ID_BYTES // 4:  # at most 4 bytes a character: short enough
            continue
        size = len(k.encode("utf-8", "surrogatepass"))
        if size > MAX_TRACE_ID_BYTES:
            raise ValueError(f"{field}: trace id {k[:32]!r}... is {size} bytes, at most "
                             f"{MAX_TRACE_ID_BYTES} (a Target sends \"run:node\")")


def states_with_features(states: torch.Tensor, feats: np.ndarray | None) -> torch.Tensor:
    """A scorer's input rows ``[N, d + F]``: the decoded states, then their features (numpy: no ATen
    op on a server's handler thread)."""
    if feats is None:
        return states
    return torch.from_numpy(np.concatenate([states.numpy(), feats], axis=1))


def decode_features(values: Sequence[float], n: int, per_row: int) -> np.ndarray | None:
    """The [N, F] float32 confidence features a request carries (``ScoreRequest.features``), None when
    the scorer reads none, or ValueError naming the field."""
    if per_row == 0:
        if len(values):
            raise ValueError(f"features: {len(values)} values, but this scorer reads none (send none)")
        return None
    if len(values) != n * per_row:
        raise ValueError(f"features: {len(values)} values for {n} rows; this scorer reads {per_row} a row "
                         f"(the target's sampled-token confidence, gambit.scoring.confidence)")
    a = np.asarray(values, dtype=np.float32).reshape(n, per_row)
    if not np.isfinite(a).all():
        raise ValueError("features: contains NaN or infinity")
    if (a > LOGPROB_SLACK).any():
        raise ValueError(f"features: log-probabilities must be <= 0, got {float(a.max()):.3g}")
    return a
