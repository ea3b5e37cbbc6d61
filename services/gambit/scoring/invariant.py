"""Batch-invariant scoring: a boundary's score has the floats it has alone, whatever is scored with it.

A batched ``F.linear`` (MKL) rounds a row differently at different row counts, and ATen's vectorized
sigmoid takes a tensor's tail through scalar code that rounds differently again, so a boundary's score
moved in its last bits with the rest of its call: the driver's deferred rows, the other runs of its
step, the Scorer service's micro-batches across Targets. Mean scores that tie to ~1e-8 then swap two
traces' ranks, so a seeded run was not its own alone and beside other runs, nor the same with its
rows deferred. Here every product is ``cpu_invariant.linear`` (each row one chain over its input,
whatever the rows beside it), biases and ReLU are exact per element, LayerNorm is ATen's row kernel
(each row reduced alone) and the sigmoid / GRU cell run element by element in one scalar function.

For the MLP (STEP's probe, the process scorer) and the GRU sequence scorer on the CPU with the
compiled kernels; elsewhere (``reason_unavailable``) the scorer keeps its batched network.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gambit.engine import cpu_attention, cpu_invariant
from gambit.scoring.config import ScorerConfig


def reason_unavailable(cfg: ScorerConfig, device: torch.device) -> str | None:
    """Why this scorer cannot score batch-invariantly here, or None when it can."""
    if device.type != "cpu":
        return f"scorer on {device.type}: the invariant products are CPU kernels"
    if cfg.kind == "sequence" and cfg.arch != "gru":
        return f"sequence scorer arch {cfg.arch!r}: only the GRU has an invariant step"
    if cpu_attention.kernel() is None:
        return "no compiled CPU kernels (no compiler, or GAMBIT_NO_CPU_KERNEL)"
    return None


def _pack(weight: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, int, torch.Tensor]:
    """An ``nn.Linear``'s ``weight [out, in]`` packed for ``cpu_invariant.linear`` (a one-output head:
    the row of weights itself, for ``invariant_rowdot``), its out, its bias."""
    w = weight.detach().float()
    packed = w[0].contiguous() if w.shape[0] == 1 else cpu_invariant.pack(w.t(), bf16=False)
    return packed, w.shape[0], bias.detach().float().clone()


def _linear(x: torch.Tensor, layer: tuple[torch.Tensor, int, torch.Tensor]) -> torch.Tensor:
    packed, out, bias = layer
    if out == 1:
        return cpu_attention.kernel().invariant_rowdot(x, packed)[:, None] + bias
    return cpu_invariant.linear(x.contiguous(), packed, out) + bias  # one rounding per element


class InvariantNet:
    """The scorer network's serving path with one order of arithmetic per row (weights packed once)."""

    def __init__(self, net: torch.nn.Module, cfg: ScorerConfig) -> None:
        self.net = net  # its LayerNorms (row kernels) and init_state
        if cfg.kind == "mlp":
            self.first, self.last = _pack(net[0].weight, net[0].bias), _pack(net[2].weight, net[2].bias)
            return
        self.proj, self.head = _pack(net.proj.weight, net.proj.bias), _pack(net.head.weight, net.head.bias)
        gru = net.gru
        self.ih = _pack(gru.weight_ih_l0, gru.bias_ih_l0)
        self.hh = _pack(gru.weight_hh_l0, gru.bias_hh_l0)

    def mlp_logits(self, x: torch.Tensor) -> torch.Tensor:
        """``[N, d] -> [N]``."""
        return _linear(F.relu(_linear(x, self.first)), self.last).squeeze(-1)

    def gru_step(self, h: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """States ``h [N, D]`` and rows ``x [N, d]`` → new states ``[N, D]`` and logits ``[N]``."""
        net = self.net
        e = F.relu(_linear(net.in_norm(x), self.proj))
        hn = cpu_attention.kernel().invariant_gru_cell(_linear(e, self.ih), _linear(h, self.hh), h)
        return hn, _linear(net.head_norm(hn), self.head).squeeze(-1)


def sigmoid(logits: torch.Tensor) -> torch.Tensor:
    """Each element in one scalar function (ATen's tail elements round differently)."""
    return cpu_attention.kernel().invariant_sigmoid(logits.float())
