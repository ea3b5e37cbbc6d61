"""Speculative decoding inside the engine: drafter state per trace, drafting, verification.

Per trace, ``DraftState`` marks the positions the drafter has not read yet (``drafter_len ..
num_cached - 1``): the verified path's fused features (kept with the state), then the raw target taps
of rows fed the plain way, which live in a paged tap buffer indexed like the KV cache (one write per
step for the whole batch; fork copies a partial block of it like the KV's). Every fed row of a
speculative trace has its taps written, so the raw count follows from ``num_cached`` and a plain step
touches no state; the state is made when the trace first drafts and dropped with its KV. Each cycle
the drafter first reads them (its context pass, over a paged drafter KV cache that shares the trace's
block table, so fork and preemption treat drafter and target KV alike), then grows a tree
(``tree.draft_tree``). The engine feeds the tree in one target forward with its tree mask;
``verify.accept`` picks the path; the path's KV moves into place, the rest of the tree's slots are
released, and the path's target features become the next cycle's context.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gambit.engine import cpu_sampler
from gambit.engine.attention import PagedAttention, SeqInput, _padded_tables
from gambit.engine.block_manager import OutOfBlocks
from gambit.engine.events import BoundaryEvent, Event, TokenEvent
from gambit.engine.host_lists import long_tensor
from gambit.engine.kv_cache import KVCache, bytes_per_block
from gambit.engine.linear import pack_drafter
from gambit.engine.sampler import top_logprobs
from gambit.engine.sequence import Trace
from gambit.speculative import cpu_drafter, cpu_tree
from gambit.speculative.cycle_ends import classify
from gambit.speculative.drafter import Drafter, DrafterMismatch, load_drafter
from gambit.speculative.tap_store import write_rows
from gambit.speculative.tree import DraftTree, TreeAttention, TreeConfig, draft_tree
from gambit.speculative.verify import accept, greedy_paths, spec_uniforms, target_probs

SHIPPED = ("eagle3.1", "pr", "hass", "hass+pr")


def decoding_label(decoding: str) -> str:
    """A trace's decoding as a metric label: a shipped name, or "other" (a path would be unbounded)."""
    return decoding if decoding in SHIPPED else "other"


class DecodingUnavailable(ValueError):
    """A decoding this engine cannot draft: no drafter where its name points, or one made for another
    target (the services answer UNIMPLEMENTED: the request is valid, this Target lacks the drafter)."""


@dataclass
class DraftState:
    key: str  # which drafter
    drafter_len: int = 0  # drafter rows in its KV cache (row j: feature j, token j + 1)
    feats: list[torch.Tensor] = field(default_factory=list)  # [n, H] chunks, positions drafter_len..
    cycles: int = 0
    emitted: int = 0
    nfeat: int = 0  # rows of ``feats``: positions drafter_len .. drafter_len + nfeat - 1

    def set_feats(self, feats: list[torch.Tensor]) -> None:
        self.feats, self.nfeat = feats, sum(f.shape[0] for f in feats)

    def raw(self, num_cached: int) -> int:
        """Unread positions past the verified features (the trace's last ones): raw taps in the
        decoder's tap buffer, written for every row the target was fed the plain way."""
        return num_cached - self.drafter_len - self.nfeat

    @property
    def tau(self) -> float:
        return self.emitted / self.cycles if self.cycles else 0.0

    def clone(self) -> DraftState:
        return DraftState(self.key, self.drafter_len, list(self.feats), 0, 0, self.nfeat)


@dataclass
class Plan:
    """One group of traces sharing a drafter: their trees and verification items."""

    key: str
    traces: list[Trace]
    tree: DraftTree
    items: list[SeqInput]
    first_row: list[int] = field(default_factory=list)  # flat row of each item's root (set by the engine)


def _resolve_path(decoding: str) -> Path:
    from gambit.paths import ASSETS

    if decoding in SHIPPED:  # "hass+pr" ships as drafter-hass-pr ("+" is no character for a folder name)
        return ASSETS / f"drafter-{decoding.replace('+', '-')}"
    return Path(decoding)


# Spans of at least this many positions a trace (on average) get their positions from ``torch.arange``;
# shorter ones (a steady cycle's few accepted tokens) from Python ranges, which cost less than the ~2 µs
# of a tensor op (Stop 68's notes).
ARANGE_SPAN = 64


def _span_positions(spans: list[tuple[int, int]], device: torch.device) -> torch.Tensor:
    """Positions a .. b - 1 of each (a, b), in order (long): tensor ops over long spans, ranges
    extended in C over short ones (no Python loop a position)."""
    if len(spans) == 1:
        return torch.arange(*spans[0], device=device)
    if sum(b - a for a, b in spans) < ARANGE_SPAN * len(spans):
        flat: list[int] = []
        for a, b in spans:
            flat += range(a, b)
        return long_tensor(flat, device)
    return torch.cat([torch.arange(a, b, device=device) for a, b in spans])


def _span_slots(ts: list[Trace], block_size: int, device: torch.device) -> tuple[torch.Tensor, list[int]]:
    """The KV slots of each trace's positions drafter_len .. num_cached - 1, flat and in order, and each
    trace's end in them: per trace, its blocks' slot rows (an arange a block) cut to the span."""
    parts, ends = [], []
    offsets = torch.arange(block_size, device=device)
    for t in ts:
        a, b = t.draft.drafter_len, t.num_cached
        base = a // block_size * block_size  # the first block's first position
        blocks = long_tensor(t.block_table[base // block_size:-(-b // block_size)], device)
        parts.append((blocks[:, None] * block_size + offsets).flatten()[a - base:b - base])
        ends.append((ends[-1] if ends else 0) + b - a)
    return (parts[0] if len(parts) == 1 else torch.cat(parts)), ends


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
        path = Path(mapped).expanduser() if mapped else _resolve_path(decoding)
        if not (path / "config.json").exists():
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

    def tree_config(self, key: str) -> TreeConfig:
        s = self.engine.config.spec
        # reconsideration needs a drafter trained for it; "advance" (extra one-pass rows) fits any
        pr = self.drafters[key].config.method.endswith("pr") or key in ("pr", "hass+pr") \
            or s.extra == "advance"
        return TreeConfig(s.gamma, s.budget, s.grow_width, s.offer_width, s.reconsider if pr else 0,
                          s.extra, s.self_query, s.fresh, s.select)

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

    def _group_features(self, d: Drafter, ts: list[Trace], slots: torch.Tensor | None = None,
                        ends: list[int] | None = None) -> torch.Tensor:
        """The pending rows of every trace of a group, in order, as drafter features [rows, H]: each
        trace's verified features, then its raw taps from the tap buffer (gathered and fused once for
        the whole group). The raw rows are the last of each trace's context-pass rows and the drafter
        KV shares the trace's block table, so their tap slots are the context pass's KV slots
        (``slots``, flat; ``ends``: each trace's end in them): views, no slot list a token. Without
        them (a caller outside the context pass) they come from the block tables (``_span_slots``)."""
        if slots is None or ends is None:
            slots, ends = _span_slots(ts, self.engine.config.block_size, self.engine.device)
        raws = [t.draft.raw(t.num_cached) for t in ts]
        if all(raw == e - b for raw, b, e in zip(raws, [0, *ends[:-1]], ends, strict=True)):
            picked = slots  # every pending row raw (the first cycle, after a re-prefill): all of them
        else:
            picked = [slots[e - raw:e] for raw, e in zip(raws, ends, strict=True) if raw]
            picked = (picked[0] if len(picked) == 1 else torch.cat(picked)) if picked else None
        buf = self._tap_buffer(d.config.target_taps)
        fused = d.fuse(buf[picked]) if picked is not None else None
        parts, at = [], 0
        for t, raw in zip(ts, raws, strict=True):
            parts.extend(t.draft.feats)  # verified features are fused already (width H)
            if raw:
                parts.append(fused[at:at + raw])
                at += raw
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    # -- drafting ---------------------------------------------------------------------------------
    def draft(self, traces: list[Trace], num_new: list[int]) -> dict[int, tuple[Plan, int]]:
        """Trees for the decode-ready speculative traces of this batch: trace id → (plan, index)."""
        s = self.engine.config.spec
        if s.max_batch and len(traces) > s.max_batch:  # plain steps; ``store`` keeps the context current
            self.engine.stats.spec_capped_steps += 1
            return {}  # (before ``inference_mode``: entering it costs a capped step ~3 µs)
        return self._draft(traces, num_new)

    @torch.inference_mode()
    def _draft(self, traces: list[Trace], num_new: list[int]) -> dict[int, tuple[Plan, int]]:
        e, s = self.engine, self.engine.config.spec
        t0 = time.perf_counter()
        groups: dict[str, list[Trace]] = {}
        cap = e.num_blocks * e.config.block_size
        for t, n in zip(traces, num_new, strict=True):
            if t.params.decoding == "plain":
                continue
            N = t.num_cached
            if n != 1 or N + 1 != len(t.token_ids):
                continue
            st = t.draft if t.draft is not None else self._state(t)
            if N <= st.drafter_len:  # nothing unread
                continue
            if N + s.gamma + 2 > e.max_model_len or N + 1 + s.budget > cap:
                continue  # too close to the end of the context: a plain step
            try:
                e.blocks.ensure(t, N + 1 + s.budget)
            except OutOfBlocks:
                continue
            groups.setdefault(st.key, []).append(t)
        out: dict[int, tuple[Plan, int]] = {}
        for key, ts in groups.items():
            plan = self._draft_group(key, ts)
            for i, t in enumerate(ts):
                out[t.id] = (plan, i)
        e.stats.draft_seconds += time.perf_counter() - t0
        return out

    def _draft_group(self, key: str, ts: list[Trace]) -> Plan:
        e, d, cache = self.engine, self.drafters[key], self.caches[key]
        dev = e.device
        # context pass: rows drafter_len .. N-1 (feature j, token j + 1) into the paged drafter cache
        # (no Python work a token: after a prefill the span is the whole prompt)
        items, tokens, spans, ends = [], [], [], []
        for t in ts:
            a, N = t.draft.drafter_len, t.num_cached
            row = t.token_ids[a + 1:N + 1]
            # positions as a range: PagedAttention reads only their count (``pos`` feeds RoPE)
            items.append(SeqInput(row, range(a, N), a, t.block_table))
            tokens += row
            spans.append((a, N))
            ends.append((ends[-1] if ends else 0) + N - a)
        ids = long_tensor(tokens, dev)
        pos = _span_positions(spans, dev)
        attn = PagedAttention(cache, items, dev, e.runner.use_kernel, speculative=True)
        feats = self._group_features(d, ts, attn.slots, ends)
        logits, nxt = d(ids[None], feats[None], pos[None], attention=attn)
        last = long_tensor([n - 1 for n in ends], dev)
        for t in ts:
            t.draft.drafter_len = t.num_cached
            t.draft.set_feats([])
        # the context, gathered dense once per cycle for the tree steps
        Ns = torch.tensor([t.num_cached for t in ts], device=dev)
        tables = _padded_tables([SeqInput([], [], t.num_cached, t.block_table) for t in ts],
                                e.config.block_size).to(dev)
        S, nb = tables.shape
        cfg = self.tree_config(key)
        root_tok = torch.tensor([t.token_ids[-1] for t in ts], device=dev)
        if cpu_tree.serves(d, cfg, self.records is not None):  # the same tree in one C++ call
            tree = cpu_tree.draft(d, cfg, cache.k[0], cache.v[0], tables, Ns, root_tok, Ns - 1, nxt[0, last],
                                  logits[0, last])
        else:
            ck, cv = [], []
            for layer in range(d.config.num_layers):
                kc, vc = cache.k[layer], cache.v[layer]
                Hkv, D = kc.shape[0], kc.shape[-1]
                ck.append(kc.index_select(1, tables.flatten()).view(Hkv, S, -1, D).transpose(0, 1))
                cv.append(vc.index_select(1, tables.flatten()).view(Hkv, S, -1, D).transpose(0, 1))
            tattn = TreeAttention(ck, cv, Ns, 1 + cfg.gamma * cfg.rows)
            tree = draft_tree(d, cfg, root_tok, Ns - 1, nxt[0, last], logits[0, last], tattn,
                              analysis=self.records is not None)
        vitems = []
        for t, row, dep, mask in zip(ts, tree.tokens.tolist(), tree.depth.tolist(), tree.mask, strict=True):
            N = t.num_cached
            vitems.append(SeqInput([t.token_ids[-1], *row], [N, *(N + x for x in dep)], N, t.block_table,
                                   mask))
        return Plan(key, ts, tree, vitems)

    # -- verification -----------------------------------------------------------------------------
    def _sampled_paths(self, ts: list[Trace], tree: DraftTree, lg: torch.Tensor, lists: tuple, G: int
                       ) -> tuple[list[list[int]], list[int], list[int]]:
        """(path, accepted count, bonus) per trace when some row samples: ``spec.verify`` "match" walks
        plain decoding's own draws like greedy; "rejection" runs ``accept``. ``lists``: the tree's
        (tokens with the root, parent, depth, valid) as lists."""
        dev, (S, B), p = self.engine.device, tree.tokens.shape, [t.params for t in ts]
        Ns = torch.tensor([t.num_cached for t in ts], device=dev)
        zero = torch.zeros(S, 1, dtype=torch.long, device=dev)
        depth = torch.cat([zero, tree.depth], 1)
        if self.engine.config.spec.verify == "match":  # plain decoding's own draws: the same text
            # the token plain decoding draws from each node's logits, by the engine's own sampler (its
            # plain-loop step where it serves): row (s, j) samples with trace s's settings at position
            # N_s + 1 + depth, the position its next token takes
            T = depth.shape[1]
            rep = lambda xs: [x for x in xs for _ in range(T)]  # noqa: E731
            counters = (Ns[:, None] + 1 + depth).reshape(-1).tolist()
            drawn, _ = self.engine.draw_rows(lg.reshape(S * T, -1), rep(x.temperature for x in p),
                                             rep(x.top_k for x in p), rep(x.top_p for x in p),
                                             rep(t.seed for t in ts), counters)
            return greedy_paths(*lists, [drawn[s * T:(s + 1) * T] for s in range(S)], G)
        temp, top_k, top_p = (torch.tensor([getattr(x, k) for x in p], device=dev)
                              for k in ("temperature", "top_k", "top_p"))
        seeds = torch.tensor([t.seed for t in ts], device=dev)
        T = B + 1
        tokens = torch.tensor(lists[0], device=dev)
        parent = torch.cat([zero, tree.parent], 1)
        valid = torch.cat([torch.ones(S, 1, dtype=torch.bool, device=dev), tree.valid], 1)
        probs = target_probs(lg, temp, top_k, top_p)
        u = spec_uniforms(seeds, Ns, T + 1)
        on_path, end, bonus = accept(tokens, parent, depth, valid, tree.mask, probs, u)
        # path[s, j]: tree index of the node at depth j (j = 0: root), for j <= n_acc
        path = torch.zeros(S, G, dtype=torch.long, device=dev)
        path.scatter_(1, torch.where(on_path, depth, G - 1), torch.arange(T, device=dev)[None].expand(S, T))
        path[:, G - 1] = 0
        return path.tolist(), depth.gather(1, end[:, None]).squeeze(1).tolist(), bonus.tolist()

    @torch.inference_mode()
    def verify(self, plan: Plan, logits: torch.Tensor, hidden: torch.Tensor, taps: dict,
               logit_rows: torch.Tensor, flat_rows: torch.Tensor) -> list[Event]:
        """Accept each trace's path, move its KV, emit its tokens.

        ``logit_rows`` [S, B+1] index ``logits``; ``flat_rows`` [S, B+1] index ``hidden`` and ``taps``.
        """
        e, d, tree = self.engine, self.drafters[plan.key], plan.tree
        ts, dev = plan.traces, e.device
        S = tree.tokens.shape[0]
        lg = logits[logit_rows]  # [S, B + 1, V]
        p = [t.params for t in ts]
        par_l, dep_l, val_l = tree.parent.tolist(), tree.depth.tolist(), tree.valid.tolist()
        tok_l = [[t.token_ids[-1], *row] for t, row in zip(ts, tree.tokens.tolist(), strict=True)]
        G = max(0, *(max(r) for r in dep_l)) + 2  # path width: the deepest node, the bonus
        if all(x.temperature == 0 for x in p):  # the same rule with one-hot p, over lists
            am = cpu_sampler.argmax(lg).tolist()
            path_l, n_l, bonus_l = greedy_paths(tok_l, par_l, dep_l, val_l, am, G)
        else:
            path_l, n_l, bonus_l = self._sampled_paths(ts, tree, lg, (tok_l, par_l, dep_l, val_l), G)
        # KV of the accepted nodes: slot of tree index i (position N + i) → position N + depth
        bs = e.config.block_size
        src, dst = [], []
        for t, pth, a in zip(ts, path_l, n_l, strict=True):
            N, table = t.num_cached, t.block_table
            for j in range(1, a + 1):
                if pth[j] != j:
                    src.append(table[(N + pth[j]) // bs] * bs + (N + pth[j]) % bs)
                    dst.append(table[(N + j) // bs] * bs + (N + j) % bs)
        if src:
            e.runner.cache.move_slots(torch.tensor(src, device=dev), torch.tensor(dst, device=dev))
        # target features of root + path rows: the next cycle's drafter context
        frows_l = flat_rows.tolist()
        rows = torch.tensor([frows_l[s_][pth[j]] for s_, (pth, a) in enumerate(zip(path_l, n_l, strict=True))
                             for j in range(a + 1)], device=dev)
        fused = d.fuse(torch.cat([taps[i][rows] for i in d.config.target_taps], dim=-1))
        fused_parts = fused.split([a + 1 for a in n_l])
        want = max(x.logprobs for x in p)
        if want or self.records is not None:
            path = torch.tensor(path_l, device=dev)
        if want:  # [S, G]: the accepted tokens, the bonus right after them, then padding (not read)
            emitted = torch.tensor([[tl[x] for x in pth[1:a + 1]] + [b] + [0] * (G - 1 - a) for tl, pth, a, b
                                    in zip(tok_l, path_l, n_l, bonus_l, strict=True)], device=dev)
            lp_rows = lg.gather(1, path[..., None].expand(S, G, lg.shape[-1]))
            ch, vals, ids = (x.view(S, G, -1).tolist() for x in
                             top_logprobs(lp_rows.reshape(S * G, -1), emitted.reshape(-1), want))
        closes = e.boundary.closes  # the detector's full rule: also "\n" then "\n" (BPE)
        if self.records is not None:  # confidences from the untempered target distribution
            bonus, tokens = torch.tensor(bonus_l, device=dev), torch.tensor(tok_l, device=dev)
            n_acc = torch.tensor(n_l, device=dev)
            self._record(plan, torch.softmax(lg.float(), -1), tokens, path, n_acc, bonus)
            self.cycle_ends += classify(tree, d, path_l, n_l, bonus_l)
        events: list[Event] = []
        stats = e.stats
        for i, t in enumerate(ts):
            N, a = t.num_cached, n_l[i]
            seq = [tok_l[i][path_l[i][j]] for j in range(1, a + 1)] + [bonus_l[i]]
            st = t.draft
            st.cycles += 1
            stats.spec_drafts += 1
            stats.spec_draft_tokens += sum(val_l[i])
            by = stats.spec_by_decoding.setdefault(decoding_label(t.params.decoding), [0, 0, 0])
            by[0], by[1] = by[0] + 1, by[1] + sum(val_l[i])
            done = False
            for j, tok in enumerate(seq):
                posn = len(t.token_ids)
                t.token_ids.append(tok)
                st.emitted += 1
                stats.generated_tokens += 1
                if want and t.params.logprobs:
                    kk = t.params.logprobs
                    chosen = ch[i][j][0] if isinstance(ch[i][j], list) else ch[i][j]
                    t.logprobs.append(chosen)
                    top = tuple(zip(ids[i][j][:kk], vals[i][j][:kk], strict=True))
                    events.append(TokenEvent(t.id, tok, posn, chosen, top))
                else:
                    events.append(TokenEvent(t.id, tok, posn))
                reason = e._stop_reason(t, tok)
                if reason:
                    e._finish(t, reason)
                    done = True
                    break
                if j < a and closes(t.token_ids[posn - 1], tok):  # accepted nodes were fed: states final
                    h = hidden[frows_l[i][path_l[i][j + 1]]].float().cpu()
                    events.append(BoundaryEvent(t.id, posn, h))
            # the accepted tokens emitted (j + 1 tokens out): a stop (max_tokens, a stop string, EOS)
            # discards the rest, and stats.tau counts tokens emitted per verification forward
            stats.spec_accepted += j
            by[2] += j
            stats.trace_tau[t.id] = st.tau
            if len(stats.trace_tau) > 4096:
                stats.trace_tau.pop(next(iter(stats.trace_tau)))
            if done:
                continue
            t.num_cached = N + 1 + a
            st.set_feats([fused_parts[i]])
            e.blocks.truncate(t, len(t.token_ids))
        return events

    def _record(self, plan: Plan, probs, tokens, path, n_acc, bonus) -> None:
        """Per verified position along each path: drafter confidence and guesses vs the target."""
        tree = plan.tree
        G = path.shape[1]
        conf = tree.conf.gather(1, path)
        top1 = tree.top1.gather(1, path)
        recon = tree.recon.gather(1, path)
        nxt = torch.cat([tokens.gather(1, path[:, 1:]), tokens.new_zeros(path.shape[0], 1)], 1)
        for s_ in range(path.shape[0]):
            nxt[s_, int(n_acc[s_])] = bonus[s_]
        pt = probs.gather(1, path[..., None].expand(*path.shape, probs.shape[-1])).max(-1).values
        for s_ in range(path.shape[0]):
            for j in range(min(G, int(n_acc[s_]) + 1)):
                if top1[s_, j] < 0:
                    continue
                self.records.append({"cpd": float(conf[s_, j]), "cpt": float(pt[s_, j]),
                                     "accepted": bool(top1[s_, j] == nxt[s_, j]),
                                     "reconsidered": bool(recon[s_, j] >= 0),
                                     "recovered": bool(recon[s_, j] == nxt[s_, j]),
                                     "recon_in_path": bool(tree.reconsidered[s_, path[s_, j + 1] - 1])
                                     if j < int(n_acc[s_]) else False})
