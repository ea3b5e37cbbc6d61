"""Batched sampling with per-trace seeds, with no per-row Python loop.

Randomness is counter-based: the one uniform that draws the token at position ``p`` of a trace
with seed ``s`` is a hash of ``(s, p)``. A trace's samples therefore depend only on its seed, its
positions and its logits — not on batch composition or step order — which is what makes a forked
child continue exactly as a freshly prefilled trace with the same seed would. Sampling inverts the
CDF of the temperature-scaled, top-k/top-p-filtered distribution at that uniform: O(1) random
numbers per row (hashing a number per vocabulary entry cost a fifth of a decode step at a
49k vocabulary).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gambit.engine.host_lists import to_device

_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as int64
_C1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_C2 = -7723592293110705685  # 0x94D049BB133111EB


def _srl(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift on int64 (torch's >> is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64 finaliser on int64 tensors (wrapping arithmetic)."""
    x = (x ^ _srl(x, 30)) * _C1
    x = (x ^ _srl(x, 27)) * _C2
    return x ^ _srl(x, 31)


def uniforms(seeds: torch.Tensor, counters: torch.Tensor, n: int, stream: int = 0) -> torch.Tensor:
    """[B, n] uniforms in (0, 1) from per-row (seed, counter); ``stream`` separates uses."""
    h = mix64(mix64(seeds * _GOLDEN + stream) + counters)
    x = mix64(h[:, None] + torch.arange(1, n + 1, device=seeds.device)[None, :] * _GOLDEN)
    u = _srl(x, 11).to(torch.float64) * (1.0 / (1 << 53))
    return u.to(torch.float32).clamp(1e-12, 1 - 2.0 ** -24)  # clamp after the cast: never 1.0 in float32


def uses_filter(top_ks, top_ps) -> bool:
    """Whether some row of these settings asks for top-k or top-p (else the sort is skipped)."""
    return any(k > 0 for k in top_ks) or any(p < 1 for p in top_ps)


@dataclass
class SamplingBatch:
    """Per-row sampling settings as tensors on the logits' device."""

    temperature: torch.Tensor  # [B] float, 0 = greedy
    top_k: torch.Tensor  # [B] long, 0 = off
    top_p: torch.Tensor  # [B] float, 1 = off
    seeds: torch.Tensor  # [B] long
    counters: torch.Tensor  # [B] long, the position being sampled
    filtered: bool = True  # False when no row uses top-k / top-p (skips the sort)
    hot: str | None = None  # "all" / "none" / "some" rows with temperature > 0; None: read the tensor

    @classmethod
    def build(cls, temps, top_ks, top_ps, seeds, counters, device) -> SamplingBatch:
        """From per-row lists: two copies to the device (floats, integers), not five, and which rows
        sample known on the host, so ``sample`` needs no device-to-host read to branch (on CUDA each
        was a stream synchronisation)."""
        filtered = uses_filter(top_ks, top_ps)
        n_hot = sum(t > 0 for t in temps)
        hot = "all" if n_hot == len(temps) else "none" if n_hot == 0 else "some"
        f = torch.tensor([list(temps), list(top_ps)], dtype=torch.float32)
        i = torch.tensor([list(top_ks), list(seeds), list(counters)], dtype=torch.long)
        f, i = to_device(f, torch.device(device)), to_device(i, torch.device(device))
        return cls(f[0], i[0], f[1], i[1], i[2], filtered, hot)


def _needs_filter(V: int, top_k: torch.Tensor, top_p: torch.Tensor) -> bool:
    return bool(((top_k > 0) & (top_k < V)).any() | (top_p < 1).any())


def _filter_sorted(logits: torch.Tensor, k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """``filter_logits`` by a stable sort of whole rows (k: each row's top-k, V when off)."""
    V = logits.shape[-1]
    order = logits.sort(dim=-1, descending=True, stable=True)[1]  # rank → vocabulary index
    outside = torch.arange(V, device=logits.device)[None, :] >= k[:, None]  # by rank
    probs = logits.masked_fill(_to_vocab(outside, order), float("-inf")).softmax(-1).gather(1, order)
    beyond = ((probs.cumsum(-1) - probs) > top_p[:, None]) & (top_p < 1)[:, None]
    outside |= beyond.cumsum(-1) > 0
    outside[:, 0] = False
    return logits.masked_fill(_to_vocab(outside, order), float("-inf"))


def _to_vocab(by_rank: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """A [B, V] bool mask over ranks → the same mask over vocabulary entries."""
    return torch.zeros_like(by_rank).scatter(1, order, by_rank)


def filter_logits(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Set logits outside each row's top-k / top-p nucleus to -inf (keeps at least one token).

    Ranks are a stable descending sort's: tied logits rank by vocabulary index (NaN first), so the
    nucleus is one set whatever finds it. Top-k keeps the first k ranks. Top-p (rows with top_p < 1)
    then takes the softmax of what top-k kept, in vocabulary order, and ends the nucleus at the first
    rank whose cumulative probability before it exceeds top_p: a prefix of the ranking by construction,
    which is what lets the compiled filter (``cpu_filter``) find it without ranking the whole row.
    Only the top of the ranking is built here too (``top_entries``: ``topk`` with the ties at its cut
    fixed up): the first max(k) ranks, and for top-p rows without a k a prefix grown until every
    nucleus ends in it (a stable sort of SmolLM2's 49k entries cost 5-10 ms a row here)."""
    B, V = logits.shape
    if not _needs_filter(V, top_k, top_p):
        return logits
    k = torch.where(top_k > 0, top_k.clamp(max=V), V)
    if V <= _SORT_WHOLE:
        return _filter_sorted(logits, k, top_p)
    nucleus = top_p < 1
    open_p = nucleus & (k >= V)  # top-p rows whose prefix is not bounded by a k
    k_host = k.tolist()
    n = max([c for c in k_host if c < V] + [1])
    if bool(open_p.any()):
        n = max(n, min(V, _P_PREFIX))
    ranks = torch.arange(V, device=logits.device)
    probs_v = None
    while True:
        if n >= V:
            return _filter_sorted(logits, k, top_p)
        ids = top_entries(logits, n)[1]  # [B, n] rank -> vocabulary index
        outside = ranks[None, :n] >= k[:, None]
        if bool(nucleus.any()):
            if probs_v is None:  # the softmax of what top-k kept (k <= n where k < V)
                kept = torch.zeros(B, V, dtype=torch.bool, device=logits.device)
                kept.scatter_(1, ids, ~outside)
                kept |= (k >= V)[:, None]
                probs_v = logits.masked_fill(~kept, float("-inf")).softmax(-1)
                if bool(open_p.any()):  # size the prefix from the open rows' mass
                    grown = max(n, _nucleus_bound(probs_v[open_p], top_p[open_p]))
                    if grown > n:
                        n = V if 2 * grown > V else grown
                        continue
            probs = probs_v.gather(1, ids)
            beyond = ((probs.cumsum(-1) - probs) > top_p[:, None]) & nucleus[:, None]
            if bool((open_p & ~beyond.any(-1)).any()):  # a nucleus runs past the prefix
                n = V if n * 8 > V else n * 4
                continue
            outside |= beyond.cumsum(-1) > 0
        break
    outside[:, 0] = False
    # an entry past the prefix ranks after it: outside wherever the row filters at all
    keep = torch.zeros(B, V, dtype=torch.bool, device=logits.device).scatter_(1, ids, ~outside)
    keep |= ((k >= V) & ~nucleus)[:, None]
    return logits.masked_fill(~keep, float("-inf"))


_P_PREFIX = 64  # the least prefix ranked for a top-p row without top-k
_SORT_WHOLE = 1024  # rows up to this long are sorted whole (topk's extra calls cost more there)


def _nucleus_bound(probs: torch.Tensor, top_p: torch.Tensor) -> int:
    """About how many ranks the rows' nuclei span (+1, the rank that ends each), V if some row's never
    ends: probabilities binned by their float exponent below the row's largest (bit arithmetic, no log);
    the entries in the bins that first hold more than top_p (+1e-4) rank before all others. Only the
    prefix's length comes from it: the cut is checked on the ranked entries themselves."""
    R, V = probs.shape
    e = probs.contiguous().view(torch.int32) >> 23  # probabilities are >= 0 (NaN: 255, a NaN row's)
    bins = (e.amax(-1, keepdim=True) - e).clamp_(0, 63) + 64 * torch.arange(R, device=probs.device)[:, None]
    mass = torch.bincount(bins.flatten(), probs.flatten(), minlength=64 * R).view(R, 64)
    count = torch.bincount(bins.flatten(), minlength=64 * R).view(R, 64)
    past = mass.cumsum(-1) > top_p[:, None] + 1e-4
    spans = count.cumsum(-1).gather(1, past.to(torch.uint8).argmax(-1, keepdim=True))[:, 0] + 1
    return int(torch.where(past.any(-1), spans, V).max().clamp(max=V))


CDF_BLOCK = 256  # vocabulary entries per block of the two-level CDF


def _invert_cdf_(w: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Index i with cdf[i-1] <= u * total < cdf[i] per row; zero-weight entries are never chosen.
    Also which rows' largest value is finite (else their weights are NaN and the index means nothing).

    ``w`` holds scaled logits and is overwritten with exp(x - max) (no normalisation needed: u
    scales by the row's own total). The CDF is two-level, in float64 so that a 49k-entry row keeps
    its small probabilities exact: block sums (fp32, pairwise) locate the block, then only that
    block's 256 entries are accumulated in float64. A draw differs from one float64 cumsum over the
    row only when the uniform lands within ~1e-7 of a block's total from a block edge; the row is
    read twice instead of being copied to float64 and scanned.
    """
    B, V = w.shape
    top = w.amax(-1, keepdim=True)
    w.sub_(top).exp_()
    nb = -(-V // CDF_BLOCK)
    if nb * CDF_BLOCK != V:
        w = torch.nn.functional.pad(w, (0, nb * CDF_BLOCK - V))
    blocks = w.view(B, nb, CDF_BLOCK)
    bcdf = blocks.sum(-1).to(torch.float64).cumsum_(-1)  # [B, nb]; fp32 sums: no fp64 copy of the row
    x = u.to(torch.float64)[:, None] * bcdf[:, -1:]
    blk = torch.searchsorted(bcdf, x, right=True).clamp_(max=nb - 1)  # [B, 1]
    prefix = torch.where(blk > 0, bcdf.gather(1, (blk - 1).clamp(min=0)), 0.0)
    inner = blocks.gather(1, blk[:, :, None].expand(B, 1, CDF_BLOCK))[:, 0]  # [B, CDF_BLOCK]
    icdf = inner.to(torch.float64).cumsum_(-1).add_(prefix)
    j = torch.searchsorted(icdf, x, right=True)
    # rounding can put x at or past the block's last sum: take its last positive entry instead
    ranks = torch.arange(1, CDF_BLOCK + 1, device=inner.device)
    last = (inner > 0).to(torch.long).mul_(ranks).argmax(-1, keepdim=True)
    j = torch.where(j >= CDF_BLOCK, last, j)
    return (blk * CDF_BLOCK + j)[:, 0].clamp_(max=V - 1), top[:, 0].isfinite()


def sample(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Next token per row: argmax where temperature is 0, else one uniform per row inverts the CDF
    (argmax too for a row whose scaled logits are not a distribution: +inf, NaN or all -inf)."""
    logits = logits.float()
    hot = batch.temperature > 0
    all_hot = batch.hot == "all" if batch.hot is not None else bool(hot.all())
    if batch.hot == "none" or (batch.hot is None and not all_hot and not bool(hot.any())):
        return logits.argmax(-1)
    t = batch.temperature if all_hot else torch.where(hot, batch.temperature, 1.0)
    scaled = torch.div(logits, t[:, None])  # a fresh buffer, consumed in place below
    if batch.filtered:
        scaled = filter_logits(scaled, batch.top_k, batch.top_p)
    # always in vocabulary order, filtered or not, so a row's draw ignores its neighbours' settings
    sampled, drawn = _invert_cdf_(scaled, uniforms(batch.seeds, batch.counters, 1)[:, 0])
    if not bool(drawn.all()):  # +inf (logits / a tiny temperature overflowed), NaN or all -inf: T -> 0's
        hot = hot & drawn  # limit, the argmax (NaN first), not the index a NaN CDF search lands on
        all_hot = False
    return sampled if all_hot else torch.where(hot, sampled, logits.argmax(-1))


def _same(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a == b, NaN equal to NaN (topk ranks NaN above every number, so NaNs tie with each other)."""
    return (a == b) | (a.isnan() & b.isnan())


def top_entries(x: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's n (1..V) largest entries [B, n], largest first, ties by ascending id, NaN above all.

    The order is the row's own, so a row's top n are the first n of its top m >= n: a batch asks for
    its largest ``logprobs`` and each trace keeps its own, whatever the others ask. ATen's ``topk`` picks
    among ties by its kernel's path (k, the thread count), so only its values are used as they come:
    one more entry tells whether ties cross the cut, and only those rows are scanned for their lowest ids
    at the cut (one compare and a ``nonzero``; the other rows cost a few [B, n] operations)."""
    B, V = x.shape
    vals, ids = x.topk(min(n + 1, V), dim=-1)
    kth = vals[:, n - 1:n]
    cut = (_same(vals[:, n], kth[:, 0]) if n < V else torch.zeros(B, dtype=torch.bool, device=x.device))
    vals, ids = vals[:, :n], ids[:, :n]
    if bool(cut.any()):  # ties left out at the cut: list the lowest ids at it instead
        rows = cut.nonzero()[:, 0]
        xr, kr = (x, kth) if rows.numel() == B else (x[rows], kth[rows])
        at_cut = xr == kr
        if bool(kr.isnan().any()):  # NaN at the cut (a NaN row): NaNs tie (a pass only then)
            at_cut |= xr.isnan() & kr.isnan()
        r, col = at_cut.nonzero().unbind(1)  # row-major: ascending id within a row
        rank = torch.arange(r.numel(), device=x.device) - torch.searchsorted(r, r)  # within its row
        listed = _same(vals[rows], kth[rows]).sum(-1)  # ties at the cut that the row lists (its last ones)
        # the first `listed` ties of a row replace its listed ones; the rest land in a column dropped after
        at = torch.where(rank < listed[r], n - listed[r] + rank, n)
        ids = torch.cat([ids, ids[:, :1]], 1).index_put_((rows[r], at), col)[:, :n]
    ids = ids.sort(-1)[0]  # then a stable sort by value: ties in ascending id
    vals, order = x.gather(1, ids).sort(dim=-1, descending=True, stable=True)
    return vals, ids.gather(1, order)


def top_logprobs(logits: torch.Tensor, tokens: torch.Tensor, n: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Model log-probabilities (before temperature): chosen [B], top values [B, n], top ids [B, n]
    (``top_entries``' order: a row's list does not depend on the batch)."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    chosen = lp.gather(1, tokens[:, None]).squeeze(1)
    vals, ids = top_entries(lp, min(n, lp.shape[-1]))
    return chosen, vals, ids
