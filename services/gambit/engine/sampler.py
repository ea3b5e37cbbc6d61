"""Batched sampling with per-trace seeds, with no per-row Python loop.

Randomness is counter-based: the uniform noise for the token at position ``p`` of a trace with
seed ``s`` is a hash of ``(s, p, vocab index)``. A trace's samples therefore depend only on its
seed, its positions and its logits — not on batch composition or step order — which is what makes
a forked child continue exactly as a freshly prefilled trace with the same seed would. Sampling is
Gumbel-max over the temperature-scaled, top-k/top-p-filtered logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

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


@dataclass
class SamplingBatch:
    """Per-row sampling settings as tensors on the logits' device."""

    temperature: torch.Tensor  # [B] float, 0 = greedy
    top_k: torch.Tensor  # [B] long, 0 = off
    top_p: torch.Tensor  # [B] float, 1 = off
    seeds: torch.Tensor  # [B] long
    counters: torch.Tensor  # [B] long, the position being sampled
    filtered: bool = True  # False when no row uses top-k / top-p (skips the sort)

    @classmethod
    def build(cls, temps, top_ks, top_ps, seeds, counters, device) -> SamplingBatch:
        filtered = any(k > 0 for k in top_ks) or any(p < 1 for p in top_ps)
        return cls(torch.tensor(temps, dtype=torch.float32, device=device),
                   torch.tensor(top_ks, dtype=torch.long, device=device),
                   torch.tensor(top_ps, dtype=torch.float32, device=device),
                   torch.tensor(seeds, dtype=torch.long, device=device),
                   torch.tensor(counters, dtype=torch.long, device=device), filtered)


def filter_logits(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Set logits outside each row's top-k / top-p nucleus to -inf (keeps at least one token)."""
    V = logits.shape[-1]
    if not bool(((top_k > 0) & (top_k < V)).any() | (top_p < 1).any()):
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    k = torch.where(top_k > 0, top_k.clamp(max=V), V)
    rank = torch.arange(V, device=logits.device)[None, :]
    remove = rank >= k[:, None]
    probs = sorted_logits.masked_fill(remove, float("-inf")).softmax(-1)
    remove |= (probs.cumsum(-1) - probs) > top_p[:, None]
    remove[:, 0] = False
    return logits.masked_fill(torch.zeros_like(remove).scatter(1, order, remove), float("-inf"))


def sample(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Next token per row: argmax where temperature is 0, else Gumbel-max sampling."""
    logits = logits.float()
    greedy = logits.argmax(-1)
    hot = batch.temperature > 0
    if not bool(hot.any()):
        return greedy
    t = torch.where(hot, batch.temperature, 1.0)
    scaled = logits / t[:, None]
    if batch.filtered:
        scaled = filter_logits(scaled, batch.top_k, batch.top_p)
    gumbel = -torch.log(-torch.log(uniforms(batch.seeds, batch.counters, logits.shape[-1])))
    sampled = (scaled + gumbel).argmax(-1)
    return torch.where(hot, sampled, greedy)


def top_logprobs(logits: torch.Tensor, tokens: torch.Tensor, n: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Model log-probabilities (before temperature): chosen [B], top values [B, n], top ids [B, n]."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    chosen = lp.gather(1, tokens[:, None]).squeeze(1)
    vals, ids = lp.topk(min(n, lp.shape[-1]), dim=-1)
    return chosen, vals, ids
