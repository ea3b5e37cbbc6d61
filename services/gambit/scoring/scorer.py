"""``BoundaryScorer``: scores boundary states per trace key, keeping each key's history.

The tournament calls ``score(keys, states)`` with the boundary states of a round (one row per
boundary, in order), ``fork`` when it branches a trace and ``drop`` when a trace ends. Inputs are
checked before anything changes: a wrong width, dtype or shape is a ``ValueError`` that says what
was expected, never a crash deep inside a matmul.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from gambit.scoring import invariant
from gambit.scoring.config import ScorerConfig
from gambit.scoring.invariant import InvariantNet, reason_unavailable
from gambit.scoring.nets import build_net

WEIGHTS = "model.safetensors"
# trace histories a sequence scorer keeps (the least recently used go first beyond it). A GRU state
# (model_dim 128) is 512 B, ~2.4 KB of RSS with its tensor, key and dict entry: ~160 MB at the cap.
# Live traces are runs x capacity over every Target sharing the Scorer, a few thousand; the cap is for
# ids never dropped (a Target that died, a caller inventing ids), which grew ~130 MB/s without it.
MAX_KEYS = 65_536
# bytes of trace history a sequence scorer keeps, all keys together (least recently used go first beyond
# it). The GRU's fixed 512 B states stay far below it at ``MAX_KEYS`` (32 MiB); an attn key keeps every
# boundary row it was given ([T, input_size] floats, ~0.8 KB a boundary on the shipped target), so the
# key cap alone let 65,536 long traces hold many GB.
MAX_STATE_MB = 512

log = logging.getLogger(__name__)


# ATen sums fewer elements than its grain size on the calling thread; a larger sum forks the intra-op
# threads (~50 us at 2 threads for 64 rows of width 578, numpy's check ~6 us)
SERIAL_SUM = 32_768


def _all_finite(x: torch.Tensor) -> bool:
    """No NaN or inf in ``x``. A sum with a NaN or inf in it is never finite, so a finite sum proves every
    element finite in one reduction (``sum().item()``, ~2 us for a round's rows: numpy's isfinite + all
    took ~2.7 us warm and ~20 us more cold, ATen's ``isfinite().all()`` 8-80 us); only a non-finite sum,
    which finite rows of huge values can also give, looks at each element. Beyond ``SERIAL_SUM``
    elements: numpy on the CPU."""
    if x.numel() < SERIAL_SUM:
        return math.isfinite(x.sum().item()) or bool(torch.isfinite(x).all())
    if x.device.type == "cpu":
        return bool(np.isfinite(x.numpy(force=True)).all())
    return bool(torch.isfinite(x).all())


def check_rows(states, width: int, hidden_size: int, confidence: bool, device: torch.device) -> torch.Tensor:
    """A scorer's input rows as float32 ``[N, width]`` on ``device``, or ValueError saying what was
    expected (``width``: ``hidden_size``, plus the confidence features when the scorer reads them).
    Rows already float32 on ``device`` without grad come back as ``states`` itself (no copy on the
    search's hot path): read them, never write them in place, and copy what is kept past the call."""
    w = width
    if not isinstance(states, torch.Tensor):
        raise ValueError(f"states must be a torch.Tensor of shape [N, {w}], got {type(states).__name__}")
    if states.dim() != 2:
        raise ValueError(f"states must be 2-D [N, {w}] (one row per boundary), "
                         f"got shape {tuple(states.shape)}")
    if states.shape[1] != w:
        extra = f" + {w - hidden_size} confidence features (gambit.scoring.confidence)" if confidence else ""
        hint = "the confidence features are missing" if confidence and states.shape[1] == hidden_size \
            else "was the scorer trained for another model?"
        raise ValueError(f"this scorer reads width {w} (hidden_size {hidden_size}{extra}), but the rows "
                         f"have width {states.shape[1]} (the model's hidden size"
                         f"{' + features' if extra else ''}): {hint}")
    if not states.dtype.is_floating_point:
        raise ValueError(f"states must be floating point (float32, bfloat16, float16 or float64), "
                         f"got dtype {states.dtype}")
    if states.dtype is not torch.float32 or states.device != device or states.requires_grad:
        states = states.detach().to(device, torch.float32)  # else already the rows it would give
    if not _all_finite(states):
        raise ValueError("states contain NaN or infinite values")
    return states


class BoundaryScorer:
    """A scorer network plus per-key state. ``kind`` is "mlp" (stateless) or "sequence"."""

    def __init__(self, net: torch.nn.Module, config: ScorerConfig,
                 device: str | torch.device = "cpu", invariant: bool = True,
                 max_keys: int = MAX_KEYS, max_state_mb: int = MAX_STATE_MB) -> None:
        """``invariant``: score each row with the floats it has alone (``scoring/invariant.py``) where
        this scorer and machine allow (``invariant_reason`` says why not); the net's weights are packed
        at the first score, so change them before scoring, not after. ``max_keys``: histories kept, the
        least recently scored or forked forgotten beyond it (``evicted`` counts them): such a key
        scores again as a new trace. ``max_state_mb``: the same for the histories' bytes together (an
        attn history grows by a row per boundary)."""
        if isinstance(max_keys, bool) or not isinstance(max_keys, int) or max_keys < 1:
            raise ValueError(f"max_keys must be an int >= 1 (trace histories kept), got {max_keys!r}")
        if isinstance(max_state_mb, bool) or not isinstance(max_state_mb, int) or max_state_mb < 1:
            raise ValueError(f"max_state_mb must be an int >= 1 (MiB of trace history kept), "
                             f"got {max_state_mb!r}")
        self.config = config
        self.device = torch.device(device)
        self.net = net.to(self.device, torch.float32).eval()
        self._state: OrderedDict[Hashable, torch.Tensor] = OrderedDict()  # least recently used first
        self.max_keys = max_keys
        self.max_state_mb = max_state_mb
        self.state_bytes = 0  # the kept histories' bytes, all keys together
        self.evicted = 0
        self._lock = threading.Lock()
        self.invariant_reason = reason_unavailable(config, self.device) if invariant else "not asked"
        self._inv: InvariantNet | None = None

    @property
    def kind(self) -> str:
        return self.config.kind

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def input_size(self) -> int:
        """Width of the rows ``score`` takes: ``hidden_size`` (+ 2 confidence features, when used)."""
        return self.config.input_size

    @property
    def confidence(self) -> bool:
        """The caller appends the target's sampled-token confidence to each state (``confidence.py``)."""
        return self.config.confidence

    @property
    def num_keys(self) -> int:
        """Keys that hold history (always 0 for the MLP)."""
        return len(self._state)

    # -- validation -------------------------------------------------------------------------
    def check_states(self, states) -> torch.Tensor:
        """``states`` as float32 ``[N, input_size]`` on the scorer's device, or ValueError."""
        return check_rows(states, self.input_size, self.hidden_size, self.confidence, self.device)

    @staticmethod
    def check_keys(keys, n: int) -> list[Hashable]:
        if type(keys) not in (list, tuple) and (  # the ABC's check is Python code: only for the rest
                isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence)):
            raise ValueError(f"keys must be a sequence (list or tuple) of trace keys, "
                             f"got {type(keys).__name__}")
        if len(keys) != n:
            raise ValueError(f"got {len(keys)} keys for {n} state rows; need one key per row")
        keys = list(keys)
        try:
            hash(tuple(keys))  # every key hashed in one C call; the loop below only names the culprit
        except TypeError:
            for k in keys:
                try:
                    hash(k)
                except TypeError:
                    raise ValueError(f"key {k!r} is not hashable") from None
        return keys

    # -- API --------------------------------------------------------------------------------
    def score(self, keys: Sequence[Hashable], states: torch.Tensor) -> torch.Tensor:
        """Scores in [0, 1], one per row (float32 on CPU). The sequence scorer first appends each
        row to its key's history (rows of one key in order) and scores the whole history."""
        states = self.check_states(states)
        keys = self.check_keys(keys, states.shape[0])
        with self._lock, torch.inference_mode():
            if not len(keys):
                return torch.zeros(0)
            inv = self._invariant_net()
            if self.kind == "mlp":
                if inv is not None:
                    return invariant.sigmoid(inv.mlp_logits(states))
                return torch.sigmoid(self.net(states)).float().cpu()
            return self._score_sequence(keys, states, inv)

    @property
    def invariant(self) -> bool:
        """Whether ``score`` gives each row the floats it has alone, in any batch."""
        return self.invariant_reason is None

    def _invariant_net(self) -> InvariantNet | None:
        if self.invariant_reason is not None:
            return None
        if self._inv is None:
            self._inv = InvariantNet(self.net, self.config)
        return self._inv

    def _score_sequence(self, keys: list[Hashable], states: torch.Tensor,
                        inv: InvariantNet | None) -> torch.Tensor:
        # rows of one key are applied in waves (its 1st row in wave 0, 2nd in wave 1, ...); all keys of
        # a wave go through the network in one batch
        seen: dict[Hashable, int] = {}
        waves: list[list[int]] = []
        for row, k in enumerate(keys):
            w = seen.get(k, 0)
            seen[k] = w + 1
            if w == len(waves):
                waves.append([])
            waves[w].append(row)
        out = torch.empty(len(keys))
        for rows in waves:
            ks = [keys[r] for r in rows]
            prev = [self._state[k] if k in self._state else self.net.init_state() for k in ks]
            if inv is not None:
                h, logits = inv.gru_step(torch.stack(prev), states[rows])
                self._keep(ks, h.unbind(0))
                out[rows] = invariant.sigmoid(logits)
                continue
            new, logits = self.net.step(prev, states[rows])
            self._keep(ks, new)
            out[rows] = torch.sigmoid(logits).float().cpu()
        self._evict()
        return out

    def _keep(self, keys: list[Hashable], states) -> None:
        """Store each key's new state as its most recently used. A view is cloned: a row of the batch's
        tensor would keep the whole batch alive while any one key of it is kept."""
        for k, s in zip(keys, states, strict=True):
            self._put(k, s.clone() if s.untyped_storage().nbytes() > s.nbytes else s)

    def _put(self, key: Hashable, state: torch.Tensor) -> None:
        """Keep ``state`` as ``key``'s history, its most recently used, counting its bytes."""
        old = self._state.pop(key, None)
        if old is not None:
            self.state_bytes -= old.nbytes
        self._state[key] = state
        self.state_bytes += state.nbytes

    def _pop(self, key: Hashable) -> None:
        old = self._state.pop(key, None)
        if old is not None:
            self.state_bytes -= old.nbytes

    def _evict(self) -> None:
        """Forget the least recently used histories beyond ``max_keys`` or ``max_state_mb`` (after a
        call, not within it)."""
        budget = self.max_state_mb * (1 << 20)
        over = 0
        while self._state and (len(self._state) > self.max_keys or self.state_bytes > budget):
            _, old = self._state.popitem(last=False)
            self.state_bytes -= old.nbytes
            over += 1
        if not over:
            return
        if not self.evicted:
            log.warning("sequence scorer holds max_keys=%d trace histories or max_state_mb=%d MiB of them: "
                        "forgetting the least recently used (traces never dropped, or more live traces than "
                        "that); one scored again starts as a new trace. Logged once; BoundaryScorer.evicted "
                        "counts them", self.max_keys, self.max_state_mb)
        self.evicted += over

    def fork(self, parent_key: Hashable, child_key: Hashable) -> None:
        """The child starts with the parent's history (a parent without boundaries yet: none)."""
        try:
            hash(parent_key), hash(child_key)
        except TypeError:
            raise ValueError("fork keys must be hashable") from None
        if parent_key == child_key:
            raise ValueError(f"fork of key {parent_key!r} onto itself")
        with self._lock:
            if child_key in self._state:
                raise ValueError(f"fork child key {child_key!r} already has a history")
            if parent_key in self._state:
                self._state.move_to_end(parent_key)
                self._put(child_key, self._state[parent_key].clone())
                self._evict()

    def drop(self, key: Hashable) -> None:
        """Forget a key's history (no-op for an unknown key)."""
        with self._lock:
            self._pop(key)

    def reset(self) -> None:
        with self._lock:
            self._state.clear()
            self.state_bytes = 0

    def score_history(self, history: torch.Tensor) -> torch.Tensor:
        """Stateless: the score after each prefix of one trace's boundary states ``[T, d] -> [T]``."""
        history = self.check_states(history)
        with torch.inference_mode():
            if self.kind == "mlp":
                logits = self.net(history)
            else:
                logits = self.net(history[None])[0]
        return torch.sigmoid(logits).float().cpu()


def random_scorer(kind: str = "mlp", hidden_size: int = 192, seed: int = 0, invariant: bool = True,
                  max_keys: int = MAX_KEYS, max_state_mb: int = MAX_STATE_MB, **kw) -> BoundaryScorer:
    """A randomly initialised scorer (seeded), for tests and before a trained one exists; ``kw``:
    ``ScorerConfig`` fields."""
    cfg = ScorerConfig(kind=kind, hidden_size=hidden_size, **kw)
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        net = build_net(cfg)
    finally:
        torch.random.set_rng_state(gen_state)
    return BoundaryScorer(net, cfg, invariant=invariant, max_keys=max_keys, max_state_mb=max_state_mb)


def save_scorer(net: torch.nn.Module | BoundaryScorer, config: ScorerConfig, folder: str | Path) -> Path:
    """``config.json`` + ``model.safetensors`` (fp32) in ``folder``."""
    if isinstance(net, BoundaryScorer):
        net = net.net
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config.to_json(), indent=2) + "\n")
    state = {k: v.detach().float().cpu().contiguous() for k, v in net.state_dict().items()}
    save_file(state, str(folder / WEIGHTS), metadata={"format": "pt"})
    return folder


def load_scorer(folder: str | Path, device: str | torch.device = "cpu", invariant: bool = True,
                max_keys: int = MAX_KEYS, max_state_mb: int = MAX_STATE_MB) -> BoundaryScorer:
    """A scorer from its folder; a missing, extra or wrong-shaped tensor is a ValueError naming it.
    ``max_keys`` / ``max_state_mb``: its history bounds (``BoundaryScorer``), given at construction so a
    served scorer is never unbounded, not even between its load and a later assignment."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: scorer folder does not exist")
    cfg = ScorerConfig.from_file(folder / "config.json")
    path = folder / WEIGHTS
    if not path.is_file():
        raise FileNotFoundError(f"{path}: scorer weights do not exist")
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{path}: unreadable safetensors file: {e}") from None
    net = build_net(cfg)
    expected = net.state_dict()
    missing = sorted(set(expected) - set(state))
    extra = sorted(set(state) - set(expected))
    if missing or extra:
        raise ValueError(f"{path}: weights do not match config.json: missing {missing}, unexpected {extra}")
    for name, t in expected.items():
        if tuple(state[name].shape) != tuple(t.shape):
            raise ValueError(f"{path}: tensor {name} has shape {tuple(state[name].shape)}, "
                             f"config.json implies {tuple(t.shape)}")
    net.load_state_dict(state)
    return BoundaryScorer(net, cfg, device, invariant, max_keys=max_keys, max_state_mb=max_state_mb)
