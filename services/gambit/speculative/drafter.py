"""EAGLE-3.1 drafter: fused target taps, one decoder layer M over [norm(embedding), norm(feature)].

Alignment (the EAGLE convention): drafter row ``j`` reads the fused target feature of position ``j``
and the embedding of token ``j + 1``, sits at RoPE position ``j`` and predicts token ``j + 2``. Its
``next_feature`` stands in for the target's feature at position ``j + 1`` in the next draft step.

Layer M (``midlayer``, public EAGLE-3 naming): ``x = [input_layernorm(e), hidden_norm(h)]`` (2H),
q/k/v read x, the residual adds the un-normed h, then a SwiGLU MLP. Rows flagged ``self_query`` (PR's
reconsideration pass) build their query from ``[input_layernorm(h), hidden_norm(h)]`` — the feature
replaces the token-embedding half — while their keys and values stay those of x.
``norm_output`` (EAGLE-3.1) hands the post-norm state to the next step; EAGLE-3 hands the pre-norm one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch
from torch import nn

from gambit.checks import above
from gambit.model.config import ModelConfig
from gambit.model.layers import MLP, FastLinear, RMSNorm, RotaryEmbedding, apply_rope, project
from gambit.model.llama import AttentionFn, CausalLM, causal_attention, eagle_taps


@dataclass
class DrafterConfig:
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # the target's vocabulary
    draft_vocab_size: int  # == vocab_size: no reduced draft vocabulary
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    target_taps: tuple[int, int, int] = (2, 3, 4)  # layers whose input states are fused (see eagle_taps)
    num_layers: int = 1  # 2: the "EAGLE-3.1 with a second layer" ablation
    fc_norm: bool = True  # EAGLE-3.1: RMSNorm on each tapped state before fc
    norm_output: bool = True  # EAGLE-3.1: the next step receives the post-norm state
    method: str = "eagle3.1"  # how it was trained (eagle3.1 | pr | hass | hass+pr); informational

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                     "intermediate_size", "vocab_size", "draft_vocab_size", "max_position_embeddings",
                     "num_layers"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"drafter {name} must be a positive integer, got {v!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("drafter num_attention_heads must be a multiple of num_key_value_heads")
        if self.draft_vocab_size > self.vocab_size:
            raise ValueError(f"draft_vocab_size {self.draft_vocab_size} exceeds vocab_size {self.vocab_size}")
        taps = tuple(self.target_taps)
        if len(taps) != 3 or len(set(taps)) != 3 or any(not isinstance(i, int) or i < 0 for i in taps):
            raise ValueError(f"target_taps must be three distinct non-negative layer indices, got {taps!r}")
        self.target_taps = taps
        above(0, rms_norm_eps=self.rms_norm_eps, rope_theta=self.rope_theta)

    @classmethod
    def for_target(cls, config: ModelConfig, **kw) -> DrafterConfig:
        """A drafter shaped like ``config``'s layers, tapping three distinct layers of it."""
        base = dict(hidden_size=config.hidden_size, num_attention_heads=config.num_attention_heads,
                    num_key_value_heads=config.num_key_value_heads, head_dim=config.head_dim,
                    intermediate_size=config.intermediate_size, vocab_size=config.vocab_size,
                    draft_vocab_size=config.vocab_size, rms_norm_eps=config.rms_norm_eps,
                    rope_theta=config.rope_theta, max_position_embeddings=config.max_position_embeddings,
                    target_taps=eagle_taps(config.num_hidden_layers))
        return cls(**{**base, **kw})

    def model_config(self) -> ModelConfig:
        """The same shapes as a ModelConfig (RoPE table, MLP, KV cache)."""
        return ModelConfig(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                           intermediate_size=self.intermediate_size, num_hidden_layers=self.num_layers,
                           num_attention_heads=self.num_attention_heads,
                           num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim,
                           max_position_embeddings=self.max_position_embeddings,
                           rms_norm_eps=self.rms_norm_eps, rope_theta=self.rope_theta)

    def to_dict(self) -> dict:
        """config.json: our fields plus the names public EAGLE-3 configs and vLLM use."""
        d = asdict(self)
        d["target_taps"] = list(self.target_taps)
        return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
                "num_hidden_layers": self.num_layers,
                "eagle_aux_hidden_state_layer_ids": list(self.target_taps), **d}

    @classmethod
    def from_dict(cls, d: dict, target: ModelConfig | None = None) -> DrafterConfig:
        """Our config.json or a public EAGLE-3 one (no fc_norm / norm_output keys: EAGLE-3 behaviour)."""
        d = dict(d)
        d.setdefault("num_layers", d.get("num_hidden_layers", 1))
        if "target_taps" not in d:
            ids = d.get("eagle_aux_hidden_state_layer_ids") or (d.get("eagle_config") or {}).get(
                "eagle_aux_hidden_state_layer_ids")
            if ids is None and target is None:
                raise ValueError("drafter config names no target_taps and no target model was given")
            d["target_taps"] = tuple(ids) if ids is not None else eagle_taps(target.num_hidden_layers)
        d.setdefault("fc_norm", False)
        d.setdefault("norm_output", False)
        d.setdefault("draft_vocab_size", d.get("vocab_size"))
        if d.get("head_dim") is None and d.get("num_attention_heads"):
            d["head_dim"] = d["hidden_size"] // d["num_attention_heads"]
        d.setdefault("num_key_value_heads", d.get("num_attention_heads"))
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in d.items() if k in known})
        except TypeError as e:
            raise ValueError(f"invalid drafter config: {e}") from None


class DraftAttention(nn.Module):
    def __init__(self, cfg: DrafterConfig, in_dim: int, layer: int) -> None:
        super().__init__()
        self.layer, self.n_heads, self.n_kv, self.head_dim = (layer, cfg.num_attention_heads,
                                                              cfg.num_key_value_heads, cfg.head_dim)
        self.q_proj = nn.Linear(in_dim, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(in_dim, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(in_dim, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=False)
        self.fast: dict[str, FastLinear] = {}  # "qkv" / "kv" / "q" / "o" fast paths (inference only)

    def fuse(self) -> None:
        """Serve q, k, v from one matmul (inference); their weights become views of the fused one."""
        projs = (self.q_proj, self.k_proj, self.v_proj)
        weight = torch.cat([p.weight.data for p in projs], dim=0)
        start = 0
        for p in projs:
            n = p.weight.shape[0]
            p.weight.data = weight[start:start + n]
            start += n
        self.qkv = weight

    def forward(self, x: torch.Tensor, q_in, rope, attention: AttentionFn) -> torch.Tensor:
        """``q_in``: the query input (``x`` itself, or per-row inputs), or ``(n, tail)``: the query
        of the last ``n`` rows reads ``tail`` [B, n, in_dim] instead of ``x``."""
        B, T, _ = x.shape
        H, Hkv, D = self.n_heads, self.n_kv, self.head_dim
        w, fast = getattr(self, "qkv", None), self.fast
        tail = None
        if isinstance(q_in, tuple):
            (n, tail), q_in = q_in, x
            if w is None:  # unfused: the general path
                q_in = torch.cat([x[:, :T - n], tail], 1)
        if w is not None and q_in is x:  # one matmul, one rotation for q and k together
            if tail is None:
                qkv = project(x, w, None, fast.get("qkv")).view(B, T, H + 2 * Hkv, D)
            else:  # only the tail's queries change: its rows ride in the same matmul, after x's
                n = tail.shape[1]
                qkv = project(torch.cat([x, tail], 1), w, None, fast.get("qkv"))
                qkv = qkv.view(B, T + n, H + 2 * Hkv, D)
                qkv[:, T - n:T, :H] = qkv[:, T:, :H]
                qkv = qkv[:, :T]
            qk, v = qkv.split((H + Hkv, Hkv), 2)
            q, k = apply_rope(qk, rope).split((H, Hkv), dim=2)
        else:
            if w is not None:
                q = project(q_in, w[:H * D], None, fast.get("q")).view(B, T, H, D)
                k, v = project(x, w[H * D:], None, fast.get("kv")).view(B, T, 2 * Hkv, D).split((Hkv, Hkv), 2)
            else:
                q = self.q_proj(q_in).view(B, T, H, D)
                k, v = self.k_proj(x).view(B, T, Hkv, D), self.v_proj(x).view(B, T, Hkv, D)
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        o = attention(self.layer, q, k, v).reshape(B, T, -1)
        return project(o, self.o_proj.weight, None, fast.get("o"))


class DraftLayer(nn.Module):
    """``first``: EAGLE-3's midlayer (2H attention input); otherwise a plain decoder layer."""

    def __init__(self, cfg: DrafterConfig, layer: int, first: bool) -> None:
        super().__init__()
        H = cfg.hidden_size
        self.first = first
        self.self_attn = DraftAttention(cfg, 2 * H if first else H, layer)
        self.mlp = MLP(cfg.model_config())
        self.input_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        if first:
            self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(H, cfg.rms_norm_eps)

    def forward(self, h: torch.Tensor, emb: torch.Tensor | None, rope, attention: AttentionFn,
                self_query: torch.Tensor | int | None) -> torch.Tensor:
        if self.first:
            hn = self.hidden_norm(h)
            x = torch.cat([self.input_layernorm(emb), hn], dim=-1)
            q_in = x
            if isinstance(self_query, int):  # the last n rows (serving: reconsider rows come last)
                n = self_query
                if n:
                    q_in = (n, torch.cat([self.input_layernorm(h[:, -n:]), hn[:, -n:]], dim=-1))
            elif self_query is not None:
                sq = torch.cat([self.input_layernorm(h), hn], dim=-1)
                q_in = torch.where(self_query[..., None], sq, x)
        else:
            x = q_in = self.input_layernorm(h)
        h = h + self.self_attn(x, q_in, rope, attention)
        return h + self.mlp(self.post_attention_layernorm(h))


class Drafter(nn.Module):
    """The drafter; ``embed_tokens`` is the target's (frozen, not a registered submodule, not saved)."""

    def __init__(self, config: DrafterConfig, embed_tokens: nn.Embedding) -> None:
        super().__init__()
        self.config = c = config
        H = c.hidden_size
        if embed_tokens.weight.shape != (c.vocab_size, H):
            raise ValueError(f"target embedding {tuple(embed_tokens.weight.shape)} does not match the "
                             f"drafter (vocab_size {c.vocab_size}, hidden_size {H})")
        object.__setattr__(self, "embed_tokens", embed_tokens)
        self.fc = nn.Linear(3 * H, H, bias=False)
        if c.fc_norm:
            self.fc_norm = nn.ModuleList(RMSNorm(H, c.rms_norm_eps) for _ in range(3))
        self.midlayer = DraftLayer(c, 0, first=True)
        self.extra_layers = nn.ModuleList(DraftLayer(c, i, first=False) for i in range(1, c.num_layers))
        self.norm = RMSNorm(H, c.rms_norm_eps)
        self.lm_head = nn.Linear(H, c.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
        t2d[: c.draft_vocab_size] = True
        self.register_buffer("t2d", t2d)
        self.rope = RotaryEmbedding(c.model_config())
        self.identity_vocab = False  # True when d2t is all zeros over a full vocabulary (a shortcut)
        self.fast: dict[str, FastLinear] = {}  # "fc" / "head" fast paths (inference only)
        # the whole forward in C++ (cpu_drafter.install); returns None for calls it does not serve
        self.fast_forward: Callable | None = None

    def fuse(self, taps: torch.Tensor) -> torch.Tensor:
        """[..., 3H] concatenated target taps (layer order of ``target_taps``) → [..., H] feature."""
        if self.config.fc_norm:
            parts = taps.chunk(3, dim=-1)
            taps = torch.cat([n(p) for n, p in zip(self.fc_norm, parts, strict=True)], dim=-1)
        return project(taps, self.fc.weight, None, self.fast.get("fc"))

    def forward(self, input_ids: torch.Tensor, feature: torch.Tensor, positions: torch.Tensor,
                attention: AttentionFn = causal_attention, self_query: torch.Tensor | int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """ids/positions [B, T], feature [B, T, H] → (draft logits [B, T, Vd], next feature [B, T, H]).

        ``self_query``: [B, T] bool, rows whose query reads the feature in place of the embedding
        (PR's reconsideration pass), or an int n: the last n rows.
        """
        if self.fast_forward is not None:
            out = self.fast_forward(input_ids, feature, positions, attention, self_query)
            if out is not None:
                return out
        rope = self.rope.table(positions)
        emb = self.embed_tokens(input_ids).to(feature.dtype)
        h = self.midlayer(feature, emb, rope, attention, self_query)
        for layer in self.extra_layers:
            h = layer(h, None, rope, attention, None)
        out = self.norm(h)
        return project(out, self.lm_head.weight, None, self.fast.get("head")), \
            (out if self.config.norm_output else h)

    def cover_positions(self, n: int) -> None:
        """A RoPE table of at least ``n`` positions. RoPE is a formula of the position (the config's base),
        so a drafter whose ``max_position_embeddings`` is below the target's context (public EAGLE-3
        configs say 2048, SmolLM2's context is 8192) drafts past it as one built with the longer table
        does; the short table made the Python path raise IndexError and the C++ one read past it."""
        if self.rope.cos.shape[0] >= n:
            return
        rope = RotaryEmbedding(replace(self.config.model_config(), max_position_embeddings=n))
        self.rope.cos, self.rope.sin = (x.to(self.rope.cos.device) for x in (rope.cos, rope.sin))

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids → target ids (``target = draft + d2t[draft]``)."""
        if self.identity_vocab:  # set by the engine once the weights are final
            return draft_ids
        return draft_ids + self.d2t[draft_ids]

    def logits_to_target(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """Scatter draft logits into the target vocabulary (tokens outside the draft vocab: -inf)."""
        if self.config.draft_vocab_size == self.config.vocab_size and not bool(self.d2t.any()):
            return draft_logits
        out = draft_logits.new_full((*draft_logits.shape[:-1], self.config.vocab_size), float("-inf"))
        idx = self.to_target(torch.arange(self.config.draft_vocab_size, device=draft_logits.device))
        return out.index_copy_(-1, idx, draft_logits)


# -- checkpoints (public EAGLE-3 key layout) --------------------------------------------------------

def _expected_shapes(drafter: Drafter) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in drafter.state_dict().items()}


def save_drafter(drafter: Drafter, folder: str | Path, extra_card: str = "") -> Path:
    """Write ``model.safetensors`` (EAGLE-3 keys), ``config.json`` and a model card ``README.md``.

    Other files already in the folder (e.g. ``training.json``) are kept.
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in drafter.state_dict().items()}
    tmp = folder / ".model.safetensors.tmp"
    save_file(state, str(tmp), metadata={"format": "pt"})
    tmp.replace(folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(drafter.config.to_dict(), indent=2) + "\n")
    c = drafter.config
    n = sum(v.numel() for v in state.values() if v.is_floating_point())
    card = (f"# Drafter ({c.method})\n\nEAGLE-3.1-style drafter: taps {list(c.target_taps)}, "
            f"{c.num_layers} decoder layer(s), fc_norm={c.fc_norm}, norm_output={c.norm_output}, "
            f"draft vocabulary {c.draft_vocab_size}/{c.vocab_size}, {n} parameters (the token embedding is "
            "the target's and is not stored). Public EAGLE-3 key layout.\n")
    (folder / "README.md").write_text(card + ("\n" + extra_card.strip() + "\n" if extra_card else ""))
    return folder


class DrafterMismatch(ValueError):
    """A drafter trained for another target (its width or vocabulary differ)."""


def load_drafter(folder: str | Path, target_model: CausalLM) -> Drafter:
    """A drafter for ``target_model`` from a folder in the public EAGLE-3 layout (ours or published).

    A missing, unexpected or wrong-shaped tensor raises ValueError naming it.
    """
    from gambit.model.loader import load_state_dict

    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: drafter folder does not exist")
    path = folder / "config.json"
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no config.json in the drafter folder") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: malformed JSON at line {e.lineno}: {e.msg}") from None
    tc = target_model.config
    try:
        config = DrafterConfig.from_dict(raw, tc)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    if config.hidden_size != tc.hidden_size or config.vocab_size != tc.vocab_size:
        raise DrafterMismatch(f"{path}: drafter (hidden {config.hidden_size}, vocab {config.vocab_size}) "
                              f"does not fit the target (hidden {tc.hidden_size}, vocab {tc.vocab_size})")
    if max(config.target_taps) >= tc.num_hidden_layers:  # made for a deeper target, too
        raise DrafterMismatch(f"{path}: target_taps {list(config.target_taps)} outside the target's "
                         f"{tc.num_hidden_layers} layers")
    state = {k.removeprefix("model."): v for k, v in load_state_dict(folder).items()}
    state.pop("embed_tokens.weight", None)  # some published drafters carry the target's embedding
    drafter = Drafter(config, target_model.model.embed_tokens)
    expected = _expected_shapes(drafter)
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ValueError(f"{folder}: drafter checkpoint lacks tensor(s) {missing}")
    unexpected = sorted(k for k in set(state) - set(expected) if "rotary_emb" not in k)
    if unexpected:
        raise ValueError(f"{folder}: drafter checkpoint has unexpected tensor(s) {unexpected}")
    for k, shape in expected.items():
        if tuple(state[k].shape) != shape:
            raise ValueError(f"{folder}: drafter tensor {k} has shape {tuple(state[k].shape)}, "
                             f"config.json implies {shape}")
    state["t2d"] = state["t2d"].bool()
    state["d2t"] = state["d2t"].long()
    drafter.load_state_dict({k: state[k] for k in expected}, strict=True)
    w = target_model.model.embed_tokens.weight
    drafter = drafter.to(device=w.device, dtype=w.dtype).eval()
    drafter.rope.cos, drafter.rope.sin = drafter.rope.cos.float(), drafter.rope.sin.float()
    return drafter


def random_drafter(target_model: CausalLM, seed: int = 0, std: float = 0.2, **kw) -> Drafter:
    """A randomly initialised drafter for ``target_model`` (losslessness tests need no training)."""
    drafter = Drafter(DrafterConfig.for_target(target_model.config, **kw), target_model.model.embed_tokens)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(noise * std if p.dim() >= 2 else 1.0 + noise * std / 2)
            if name == "lm_head.weight":  # sharper draft distributions, like a trained drafter's
                p.mul_(4.0)
    w = target_model.model.embed_tokens.weight
    drafter = drafter.to(device=w.device, dtype=w.dtype).eval()
    drafter.rope.cos, drafter.rope.sin = drafter.rope.cos.float(), drafter.rope.sin.float()
    return drafter


__all__ = ["Drafter", "DrafterConfig", "load_drafter", "random_drafter", "save_drafter"]
