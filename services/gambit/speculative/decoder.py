"""Speculative decoding inside the engine: the decoder's drafters, their KV caches and the tap buffers.

Per trace, ``DraftState`` (``draft_state``) marks the positions the drafter has not read yet
(``drafter_len .. num_cached - 1``): the verified path's fused features (kept with the state), then the raw
target taps of rows fed the plain way, which live in a paged tap buffer indexed like the KV cache (one
write per step for the whole batch; fork copies a partial block of it like the KV's). Every fed row of a
speculative trace has its taps written, so the raw count follows from ``num_cached`` and a plain step
touches no state; the state is made when the trace first drafts and dropped with its KV. Each cycle
the drafter first reads them (its context pass, over a paged drafter KV cache that shares the trace's
block table, so fork and preemption treat drafter and target KV alike), then grows a tree
(``drafting``, ``tree.draft_tree``). The engine feeds the tree in one target forward with its tree mask;
``verifying`` picks the path (``verify.accept``); the path's KV moves into place, the rest of the tree's
slots are released, and the path's target features become the next cycle's context.
"""

from __future__ import annotations

from pathlib import Path

import torch

from gambit.engine.kv_cache import KVCache, bytes_per_block
from gambit.engine.linear import pack_drafter
from gambit.engine.sequence import Trace
from gambit.speculative import cpu_drafter, drafting, verifying
from gambit.speculative.decodings import SHIPPED, DecodingUnavailable, drafter_path
from gambit.speculative.draft_state import DraftState
from gambit.speculative.drafter import Drafter, DrafterMismatch, load_drafter
from gambit.speculative.tap_store import write_rows


class SpecDecoder:
    def __init__(self, engine) -> None:
        self.engine = engine
        self.drafters: dict[str, Drafter] = {}
        self.caches: dict[str, KVCache] = {}
        self.folders: dict[str, str] = {}  # a loaded drafter's resolved folder -> its key
        self.aliases: dict[str, str] = {}  # another spelling of a loaded drafter's folder -> its key
        self.records: list[dict] | None = None  # analyses (bench): per verified position, when set
        self.cycle_ends: list[dict] = []  # with ``records``: why each cycle stopped (``cycle_ends``)
        self.tap_buffers: dict[tuple[int, ...], torch.Tensor] = {}  # tap layers -> [slots, 3H]
        self.layers_of: dict[str, tuple[int, ...]] = {}  # drafter key -> the target layers it taps
        self._taps: tuple[int, ...] = ()
        self._tap_sets: list[tuple[int, ...]] = []  # the distinct tap layer sets (one: store's fast path)

    # -- drafters ---------------------------------------------------------------------------------
    def register(self, name: str, drafter: Drafter) -> None:
        e = self.engine
        if drafter.config.hidden_size != e.model.config.hidden_size or \
                drafter.config.vocab_size != e.model.config.vocab_size:
            raise ValueError(f"drafter {name!r} does not fit the target model")
        layers = e.model.config.num_hidden_layers  # else the first step's taps[i] was a bare KeyError
        if max(drafter.config.target_taps) >= layers:
            raise ValueError(f"drafter {name!r} taps target layers {list(drafter.config.target_taps)}; "
                             f"the target has {layers} layers")
        # the engine's tree must be buildable with this drafter: else the first draft raised inside
        # Engine.step (every trace of the batch failed) instead of here, where the caller asked for it
        s, c = e.config.spec, drafter.config
        try:
            drafting.tree_settings(s, c.method, name)
        except ValueError as err:
            raise ValueError(f"drafter {name!r} cannot draft the engine's tree (spec.gamma={s.gamma}, "
                             f"grow_width={s.grow_width}, offer_width={s.offer_width}, reconsider="
                             f"{s.reconsider}, method {c.method!r}): {err}") from None
        if s.offer_width > c.draft_vocab_size:  # each row offers its top-k draft tokens
            raise ValueError(f"drafter {name!r}: spec.offer_width={s.offer_width} exceeds its draft "
                             f"vocabulary of {c.draft_vocab_size} tokens")
        drafter = drafter.to(device=e.device, dtype=e.dtype).eval()
        drafter.rope.cos, drafter.rope.sin = drafter.rope.cos.float(), drafter.rope.sin.float()
        drafter.cover_positions(e.max_model_len)  # its config may say fewer positions than the context
        c = drafter.config
        drafter.identity_vocab = c.draft_vocab_size == c.vocab_size and not bool(drafter.d2t.any())
        for layer in (drafter.midlayer, *drafter.extra_layers):  # fewer matmuls (inference only)
            if layer.mlp.gate_up is None:
                layer.mlp.fuse()
            if getattr(layer.self_attn, "qkv", None) is None:
                layer.self_attn.fuse()
        pack_drafter(drafter, e.config.cpu_linear != "plain", e.runner.use_kernel)
        if e.runner.use_kernel and e.runner.cpp_layers:
            cpu_drafter.install(drafter)  # the same floats, from C++
        mc = drafter.config.model_config()
        if e.device.type == "cuda":  # the budget took ~all free memory, less spec.max_drafters caches
            need = bytes_per_block(mc, e.config.block_size, e.dtype) * e.num_blocks
            free = torch.cuda.mem_get_info(e.device)[0]
            if need > free:
                raise ValueError(f"drafter {name!r}: its KV cache needs {need / 2**30:.2f} GiB and "
                                 f"{free / 2**30:.2f} GiB are free; the KV budget reserved room for "
                                 f"spec.max_drafters={e.config.spec.max_drafters} drafters "
                                 f"({len(self.caches)} registered): raise it, or set num_blocks")
        self.drafters[name] = drafter
        self.caches[name] = KVCache(mc, e.num_blocks, e.config.block_size, e.dtype, e.device)
        # read every step (``store``, the engine's forward): kept, not rebuilt from the drafters
        self.layers_of = {k: d.config.target_taps for k, d in self.drafters.items()}
        self._taps = tuple(sorted({i for layers in self.layers_of.values() for i in layers}))
        self._tap_sets = sorted(set(self.layers_of.values()))

    def prepare(self, decoding: str) -> str:
        """The drafter key for a trace's ``decoding``; loads a shipped or given drafter once, however its
        folder is spelled (a name, an absolute or relative path, a trailing slash: each spelling loaded
        another copy and KV cache, seven of one drafter held more KV than the target)."""
        if decoding in self.drafters:
            return decoding
        if decoding in self.aliases:
            return self.aliases[decoding]
        mapped = self.engine.config.spec.drafters.get(decoding)
        path = Path(mapped).expanduser() if mapped else drafter_path(decoding)
        try:
            found = (path / "config.json").exists()
        except OSError as err:  # a name too long for a path (it raised OSError from Engine.add)
            raise DecodingUnavailable(f"decoding {decoding!r}: no drafter there ({err.strerror}); use "
                                      f"'plain', {', '.join(map(repr, SHIPPED))} or a drafter folder"
                                      ) from None
        if not found:
            if mapped:  # the user's --drafters: the engine-API alternatives below would not help there
                raise DecodingUnavailable(f"decoding {decoding!r}: drafters maps it to {path}, where there "
                                          f"is no drafter (config.json)")
            hint = " (not shipped yet)" if decoding in SHIPPED else ""
            raise DecodingUnavailable(f"decoding {decoding!r}: no drafter at {path}{hint}; use 'plain', "
                             f"{', '.join(map(repr, SHIPPED))} or a drafter folder")
        same = self.folders.get(str(path.resolve()))
        if same is not None:  # loaded already under another spelling
            self.aliases[decoding] = same
            return same
        try:
            drafter = load_drafter(path, self.engine.model)
        except DrafterMismatch as e:
            if decoding not in SHIPPED or mapped:
                raise DecodingUnavailable(str(e)) from None
            raise DecodingUnavailable(f"{e}; the shipped drafters are the shipped target's: map {decoding!r} "
                                      f"to a drafter trained for this model (--drafters {decoding}=FOLDER; "
                                      "`make smollm2-drafters` trains SmolLM2-135M's into "
                                      "~/.cache/gambit/drafters)") from None
        self.register(decoding, drafter)
        self.folders[str(path.resolve())] = decoding
        return decoding

    def taps(self) -> tuple[int, ...]:
        """Every target layer a registered drafter reads."""
        return self._taps

    # -- per-trace state --------------------------------------------------------------------------
    def _state(self, t: Trace) -> DraftState:
        """The trace's state, made at its first draft: the drafter has read nothing, and every cached
        position's taps are in the buffer. Freeing the trace's KV drops it (``BlockManager.free``)."""
        st = t.draft
        if st is None:
            st = t.draft = DraftState(self.prepare(t.params.decoding))
        return st

    def on_fork(self, parent: Trace, child: Trace, pair: tuple[int, int] | None, copied: bool) -> None:
        """A copied child inherits the drafter's KV (same blocks) and its pending features. Only the
        parent's own drafter has rows in those blocks, and only below its ``drafter_len``: a parent
        that never drafted (every step capped so far) has none, and the other drafters' caches hold
        nothing of it (copying them all cost 6x at 7 loaded drafters)."""
        st = parent.draft
        if pair is not None and parent.params.decoding != "plain":
            key = st.key if st is not None else self.prepare(parent.params.decoding)
            bs = self.engine.config.block_size
            n = parent.num_cached % bs or bs  # cached slots of the partial block
            base = parent.num_cached - n  # its first position
            if st is not None and st.drafter_len > base:  # the drafter's rows in it
                self.caches[key].copy_blocks([pair], min(n, st.drafter_len - base))
            if st is None or st.raw(parent.num_cached):  # its raw taps in the partial block's slots
                buf = self._tap_buffer(self.layers_of[key])
                buf[pair[1] * bs:pair[1] * bs + n] = buf[pair[0] * bs:pair[0] * bs + n]
        if copied and st is not None:
            child.draft = st.clone()

    def store(self, traces: list[Trace], num_new: list[int], offsets: list[int], taps: dict,
              slots: torch.Tensor) -> None:
        """Target taps of rows fed the plain way (prefill chunks, decode steps without a tree), written
        raw ([n, 3H]) into the tap buffer at the rows' KV slots (``slots``: every fed row's, from the
        forward), one ``write_rows`` call per tap set for the whole batch (``tap_store``); the drafter's
        ``fuse`` reads them when the trace next drafts. No per-trace state changes (``DraftState.raw``
        follows from ``num_cached``). A step of speculative traces only, none with a tree (a capped
        step, ``spec.max_batch``: every trace is here every step) writes every row in one call with no
        loop over the traces: per-trace row lists and counts cost ~1 µs a trace a step."""
        layers_of = self.layers_of
        if len(self._tap_sets) == 1 and min(offsets, default=0) >= 0 \
                and not any(t.params.decoding == "plain" for t in traces):
            layers = self._tap_sets[0]
            write_rows(self._tap_buffer(layers), slots, None, [taps[i] for i in layers])
            return
        by_taps: dict[tuple[int, ...], list[int]] = {}  # tap layers -> flat rows
        for t, n, off in zip(traces, num_new, offsets, strict=True):
            if off < 0 or t.params.decoding == "plain":
                continue
            key = t.draft.key if t.draft is not None else self.prepare(t.params.decoding)
            rows = by_taps.setdefault(layers_of[key], [])
            if n == 1:
                rows.append(off)
            else:
                rows.extend(range(off, off + n))
        for layers, rows in by_taps.items():  # all of them: every row in order (offsets increase)
            every = len(rows) == taps[layers[0]].shape[0]
            write_rows(self._tap_buffer(layers), slots, None if every else rows, [taps[i] for i in layers])

    def _tap_buffer(self, layers: tuple[int, ...]) -> torch.Tensor:
        """Raw taps by KV slot for one set of tap layers (drafters that tap the same layers share it):
        [num_blocks * block_size, len(layers) * H], allocated at first use; only written slots are read."""
        buf = self.tap_buffers.get(layers)
        if buf is None:
            e = self.engine
            buf = self.tap_buffers[layers] = torch.empty(
                e.num_blocks * e.config.block_size, len(layers) * e.model.config.hidden_size, dtype=e.dtype,
                device=e.device)
        return buf

    # -- drafting and verification: functions of the decoder in their own files, bound as its methods
    # (the engine calls them so; tests and tools wrap ``draft``, ``_draft_group``, ``tree_config`` and
    # ``verify`` per decoder or on the class, and the drafting code calls them through ``spec``)
    tree_config = drafting.tree_config
    draft = drafting.draft
    _draft_group = drafting.draft_group
    # for callers outside the context pass (slots from the block tables); the context pass calls
    # ``drafting.group_features`` itself with its own slots, so wrapping this does not see it
    _group_features = drafting.group_features
    verify = verifying.verify
