"""The verification side of a speculative cycle: accept each trace's path from the target's logits over
its tree (``verify``: greedy lists, or the rejection / "match" rules), move the path's KV into place, keep
its target features for the next cycle and emit its tokens. A function of the decoder, bound as its
``verify`` method (``SpecDecoder``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from gambit.engine import cpu_sampler
from gambit.engine.events import BoundaryEvent, Event, TokenEvent
from gambit.engine.sampler import top_logprobs
from gambit.engine.sequence import Trace
from gambit.speculative.cycle_ends import classify
from gambit.speculative.decodings import decoding_label
from gambit.speculative.draft_state import Plan
from gambit.speculative.tree import DraftTree
from gambit.speculative.verify import accept, greedy_paths, spec_uniforms, target_probs

if TYPE_CHECKING:
    from gambit.speculative.decoder import SpecDecoder


@torch.inference_mode()
def verify(spec: SpecDecoder, plan: Plan, logits: torch.Tensor, hidden: torch.Tensor, taps: dict,
           logit_rows: torch.Tensor, flat_rows: torch.Tensor) -> list[Event]:
    """Accept each trace's path, move its KV, emit its tokens.

    ``logit_rows`` [S, B+1] index ``logits``; ``flat_rows`` [S, B+1] index ``hidden`` and ``taps``.
    """
    e, d, tree = spec.engine, spec.drafters[plan.key], plan.tree
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
        path_l, n_l, bonus_l = _sampled_paths(spec, ts, tree, lg, (tok_l, par_l, dep_l, val_l), G)
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
    if want or spec.records is not None:
        path = torch.tensor(path_l, device=dev)
    if want:  # [S, G]: the accepted tokens, the bonus right after them, then padding (not read)
        emitted = torch.tensor([[tl[x] for x in pth[1:a + 1]] + [b] + [0] * (G - 1 - a) for tl, pth, a, b
                                in zip(tok_l, path_l, n_l, bonus_l, strict=True)], device=dev)
        lp_rows = lg.gather(1, path[..., None].expand(S, G, lg.shape[-1]))
        ch, vals, ids = (x.view(S, G, -1).tolist() for x in
                         top_logprobs(lp_rows.reshape(S * G, -1), emitted.reshape(-1), want))
    closes = e.boundary.closes  # the detector's full rule: also "\n" then "\n" (BPE)
    if spec.records is not None:  # confidences from the untempered target distribution
        bonus, tokens = torch.tensor(bonus_l, device=dev), torch.tensor(tok_l, device=dev)
        n_acc = torch.tensor(n_l, device=dev)
        _record(spec, plan, torch.softmax(lg.float(), -1), tokens, path, n_acc, bonus)
        spec.cycle_ends += classify(tree, d, path_l, n_l, bonus_l)
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


def _sampled_paths(spec: SpecDecoder, ts: list[Trace], tree: DraftTree, lg: torch.Tensor, lists: tuple,
                   G: int) -> tuple[list[list[int]], list[int], list[int]]:
    """(path, accepted count, bonus) per trace when some row samples: ``SpecConfig.verify`` "match"
    walks plain decoding's own draws like greedy; "rejection" runs ``accept``. ``lists``: the tree's
    (tokens with the root, parent, depth, valid) as lists."""
    dev, (S, B), p = spec.engine.device, tree.tokens.shape, [t.params for t in ts]
    Ns = torch.tensor([t.num_cached for t in ts], device=dev)
    zero = torch.zeros(S, 1, dtype=torch.long, device=dev)
    depth = torch.cat([zero, tree.depth], 1)
    if spec.engine.config.spec.verify == "match":  # plain decoding's own draws: the same text
        # the token plain decoding draws from each node's logits, by the engine's own sampler (its
        # plain-loop step where it serves): row (s, j) samples with trace s's settings at position
        # N_s + 1 + depth, the position its next token takes
        T = depth.shape[1]
        rep = lambda xs: [x for x in xs for _ in range(T)]  # noqa: E731
        counters = (Ns[:, None] + 1 + depth).reshape(-1).tolist()
        drawn, _ = spec.engine.draw_rows(lg.reshape(S * T, -1), rep(x.temperature for x in p),
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


def _record(spec: SpecDecoder, plan: Plan, probs, tokens, path, n_acc, bonus) -> None:
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
            spec.records.append({"cpd": float(conf[s_, j]), "cpt": float(pt[s_, j]),
                                 "accepted": bool(top1[s_, j] == nxt[s_, j]),
                                 "reconsidered": bool(recon[s_, j] >= 0),
                                 "recovered": bool(recon[s_, j] == nxt[s_, j]),
                                 "recon_in_path": bool(tree.reconsidered[s_, path[s_, j + 1] - 1])
                                 if j < int(n_acc[s_]) else False})
