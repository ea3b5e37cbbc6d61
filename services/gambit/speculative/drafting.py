"""The drafting side of a speculative cycle: each group of traces sharing a drafter reads its unread
context (one paged drafter forward, the context pass), then grows a tree (``tree.draft_tree``, or the same
tree in one C++ call, ``cpu_tree``). Functions of the decoder, bound as its methods (``SpecDecoder``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from gambit.engine.attention import PagedAttention, SeqInput
from gambit.engine.block_manager import OutOfBlocks
from gambit.engine.host_lists import long_tensor
from gambit.engine.sequence import Trace
from gambit.speculative import cpu_tree
from gambit.speculative.draft_state import Plan, context_tables, span_positions, span_slots
from gambit.speculative.drafter import Drafter
from gambit.speculative.tree import TreeAttention, TreeConfig, draft_tree

if TYPE_CHECKING:
    from gambit.engine.config import SpecConfig
    from gambit.speculative.decoder import SpecDecoder


def tree_config(spec: SpecDecoder, key: str) -> TreeConfig:
    """The tree settings for drafter ``key``: ``spec`` (the engine's), reconsideration where it fits."""
    return tree_settings(spec.engine.config.spec, spec.drafters[key].config.method, key)


def tree_settings(s: SpecConfig, method: str, key: str) -> TreeConfig:
    """``s`` as a ``TreeConfig`` for a drafter trained by ``method`` and served as ``key``; a ValueError
    where the tree cannot be built (a budget above the candidates it offers): ``register`` calls it so
    that the error comes when the drafter is loaded, not from inside ``Engine.step``."""
    # reconsideration needs a drafter trained for it; "advance" (extra one-pass rows) fits any
    pr = method.endswith("pr") or key in ("pr", "hass+pr") or s.extra == "advance"
    return TreeConfig(s.gamma, s.budget, s.grow_width, s.offer_width, s.reconsider if pr else 0,
                      s.extra, s.self_query, s.fresh, s.select)


def draft(spec: SpecDecoder, traces: list[Trace], num_new: list[int]) -> dict[int, tuple[Plan, int]]:
    """Trees for the decode-ready speculative traces of this batch: trace id → (plan, index)."""
    s = spec.engine.config.spec
    if s.max_batch and len(traces) > s.max_batch:  # plain steps; ``store`` keeps the context current
        spec.engine.stats.spec_capped_steps += 1
        return {}  # (before ``inference_mode``: entering it costs a capped step ~3 µs)
    return _draft(spec, traces, num_new)


@torch.inference_mode()
def _draft(spec: SpecDecoder, traces: list[Trace], num_new: list[int]) -> dict[int, tuple[Plan, int]]:
    e, s = spec.engine, spec.engine.config.spec
    t0 = time.perf_counter()
    groups: dict[str, list[Trace]] = {}
    cap = e.num_blocks * e.config.block_size
    # the step's token budget: the scheduler counted one row a trace, a tree feeds 1 + B; trees go to
    # the batch's first traces (rank order) while the rows left after its prefill and decode rows last
    room = e.config.max_num_batched_tokens - sum(num_new)
    for t, n in zip(traces, num_new, strict=True):
        if t.params.decoding == "plain":
            continue
        N = t.num_cached
        if n != 1 or N + 1 != len(t.token_ids):
            continue
        st = t.draft if t.draft is not None else spec._state(t)
        if N <= st.drafter_len:  # nothing unread
            continue
        if N + s.gamma + 2 > e.max_model_len or N + 1 + s.budget > cap:
            continue  # too close to the end of the context: a plain step
        if s.budget > room:  # no tree fits the step's token budget: a plain step (lossless either way)
            e.tell_once("spec_tokens", "a speculative trace decoded plainly: its tree's %d rows did not "
                        "fit the step's max_num_batched_tokens = %d (%d left after the step's other rows)",
                        1 + s.budget, e.config.max_num_batched_tokens, room + 1)
            continue
        try:
            e.blocks.ensure(t, N + 1 + s.budget)
        except OutOfBlocks:
            continue
        room -= s.budget
        groups.setdefault(st.key, []).append(t)
    out: dict[int, tuple[Plan, int]] = {}
    for key, ts in groups.items():
        plan = spec._draft_group(key, ts)  # the method: tests wrap it per decoder
        for i, t in enumerate(ts):
            out[t.id] = (plan, i)
    e.stats.draft_seconds += time.perf_counter() - t0
    return out


def draft_group(spec: SpecDecoder, key: str, ts: list[Trace]) -> Plan:
    """One group's cycle up to verification: the context pass, then the tree and its items."""
    e, d, cache = spec.engine, spec.drafters[key], spec.caches[key]
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
    pos = span_positions(spans, dev)
    attn = PagedAttention(cache, items, dev, e.runner.use_kernel, speculative=True)
    feats = group_features(spec, d, ts, attn.slots, ends)
    logits, nxt = d(ids[None], feats[None], pos[None], attention=attn)
    last = long_tensor([n - 1 for n in ends], dev)
    for t in ts:
        t.draft.drafter_len = t.num_cached
        t.draft.set_feats([])
    # the context, gathered dense once per cycle for the tree steps
    Ns = torch.tensor([t.num_cached for t in ts], device=dev)
    tables = context_tables(ts, e.config.block_size, dev)
    S, nb = tables.shape
    cfg = spec.tree_config(key)  # the method: tools swap it on the class
    root_tok = torch.tensor([t.token_ids[-1] for t in ts], device=dev)
    if cpu_tree.serves(d, cfg, spec.records is not None):  # the same tree in one C++ call
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
                          analysis=spec.records is not None)
    vitems = []
    for t, row, dep, mask in zip(ts, tree.tokens.tolist(), tree.depth.tolist(), tree.mask, strict=True):
        N = t.num_cached
        vitems.append(SeqInput([t.token_ids[-1], *row], [N, *(N + x for x in dep)], N, t.block_table,
                               mask))
    return Plan(key, ts, tree, vitems)


def group_features(spec: SpecDecoder, d: Drafter, ts: list[Trace], slots: torch.Tensor | None = None,
                    ends: list[int] | None = None) -> torch.Tensor:
    """The pending rows of every trace of a group, in order, as drafter features [rows, H]: each
    trace's verified features, then its raw taps from the tap buffer (gathered and fused once for
    the whole group). The raw rows are the last of each trace's context-pass rows and the drafter
    KV shares the trace's block table, so their tap slots are the context pass's KV slots
    (``slots``, flat; ``ends``: each trace's end in them): views, no slot list a token. Without
    them (a caller outside the context pass) they come from the block tables (``span_slots``)."""
    if slots is None or ends is None:
        slots, ends = span_slots(ts, spec.engine.config.block_size, spec.engine.device)
    raws = [t.draft.raw(t.num_cached) for t in ts]
    if all(raw == e - b for raw, b, e in zip(raws, [0, *ends[:-1]], ends, strict=True)):
        picked = slots  # every pending row raw (the first cycle, after a re-prefill): all of them
    else:
        picked = [slots[e - raw:e] for raw, e in zip(raws, ends, strict=True) if raw]
        picked = (picked[0] if len(picked) == 1 else torch.cat(picked)) if picked else None
    buf = spec._tap_buffer(d.config.target_taps)
    fused = d.fuse(buf[picked]) if picked is not None else None
    parts, at = [], 0
    for t, raw in zip(ts, raws, strict=True):
        parts.extend(t.draft.feats)  # verified features are fused already (width H)
        if raw:
            parts.append(fused[at:at + raw])
            at += raw
    return parts[0] if len(parts) == 1 else torch.cat(parts)
