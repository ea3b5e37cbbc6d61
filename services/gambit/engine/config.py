"""Engine configuration: one dataclass, validated on construction."""

from __future__ import annotations

import numbers
import re
from dataclasses import dataclass, field

import torch

from gambit.checks import at_least
from gambit.cpu_info import (
    check_cpu_weights,
    check_kv_dtype,
    default_min_macs_per_thread,
    default_spec_max_batch,
)
from gambit.engine.sequence import is_number

PREEMPTION_MODES = ("recompute", "evict")
DEFAULT_ADMIT_LOOKAHEAD = 16  # tokens each running trace keeps room for when one is admitted (recompute)
DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")
DECODE_GRAPH_MODES = ("off", "static", "cuda")  # EngineConfig.decode_graphs (engine/decode_graphs.py)


@dataclass
class SpecConfig:
    """Tree drafting knobs for speculative traces (``SamplingParams.decoding`` != "plain").

    ``reconsider`` (m) applies to drafters trained for Parallel Reconsideration (method ending in
    "pr"); EAGLE-3.1 drafters always draft with m = 0.

    The defaults are the fastest tree measured on the CPU with the shipped 2.7M-parameter target and
    drafters: a chain (one frontier row a step offering two children, one reconsidered row), since
    there every verified token costs real time. Against the earlier default (gamma 5, B 8, Bw = k =
    4, m 3; chosen by a batch-1 sweep of gamma 5/8/11, B 8/16/24, Bw = k 3/4) it ties at batch 1 and
    is faster from batch 4 (greedy PR over plain decoding on a 2-core AMD EPYC: 1.35x vs 1.11x at
    batch 4, 1.42x vs 1.22x at 8, 1.12x vs 0.94x at 16; T = 0.8: 1.11x vs 1.01x at 8, 1.02x vs 0.86x
    at 16; tools/spec_batch_speed.py). On a GPU, where verifying 48 tokens costs about one decode
    step, use the paper's tree: gamma=8, budget=48, grow_width=6, offer_width=6, reconsider=3.
    """

    gamma: int = 5  # draft steps per cycle after the drafter's context pass (tree depth <= gamma + 1)
    budget: int = 6  # B: draft tokens verified per cycle and trace (reconsidered ones included)
    grow_width: int = 1  # Bw: frontier rows each draft step forwards
    offer_width: int = 2  # k: children each frontier row offers
    reconsider: int = 1  # m: least-confident rows of the previous step reconsidered per step (PR)
    extra: str = "reconsider"  # what the m rows do: "reconsider" (PR) | "advance" (Table 4 control)
    self_query: bool = True  # reconsider rows take their query from the feature
    fresh: bool = True  # the corrected token is the best one the node did not already offer
    # which rows are reconsidered: "confidence" = the m least confident (lowest top-1 probability, the
    # paper's rule); "miss" = the m with the highest path probability x probability mass outside their
    # top-k offers (where a fresh corrected token can add what the tree lacks). "miss" drafts in the
    # Python tree (the C++ tree has the paper's rule only); on the shipped target it moved tau by -0.4%
    # at the paper's tree and +1.5% at k = 4 (tools/pr_oracle.py)
    select: str = "confidence"
    max_drafters: int = 2  # drafter KV caches the KV budget reserves room for (one layer each; with any, also
    # the tap buffer: 3 target hidden states per KV slot, shared by the drafters)
    # draft only in steps of at most this many traces (0: no cap); in a larger batch speculative traces
    # take plain steps (their target taps kept, so drafting resumes when the batch shrinks). With this
    # tree and draft trees in the CPU kernel, on a 2-core AMD EPYC: greedy PR / EAGLE-3.1 over plain
    # decoding 1.29-1.47x at batch 8 and 1.06-1.22x at 16 (tools/spec_batch_speed.py), sampled (T 0.8)
    # 1.11x / 1.25x at 8 and 1.02x / 1.03x at 16; one Gambit run of C = 8 with PR 0.84x the wall of
    # plain decoding, of C = 16 1.19x (gambit bench search --concurrency 1 --spec-max-batch 16). It
    # was 4 before (the earlier tree lost from batch 5-8). On an Intel Xeon the tree stops paying sooner:
    # 4 there (gambit.cpu_info.SPEC_MAX_BATCH_BY_VENDOR). On a GPU, where verifying a tree costs
    # about one decode step, raise it (or 0), as with the tree.
    max_batch: int = default_spec_max_batch()
    # sampled rows (T > 0): "match" = a child is accepted iff it is the token plain decoding samples
    # there (same seed, same position): exactly plain decoding's samples, so a search decodes the same
    # text with or without speculation; "rejection" = multi-candidate rejection sampling (the target's
    # distribution, other samples; accepts more where the target is flat; at T = 0.8 on the shipped
    # target tau was within 3% of "match")
    verify: str = "match"
    # a decoding name -> the drafter folder it drafts with, in place of the shipped drafter of that name
    # (which reads only the shipped target): how a real checkpoint gets "pr" / "eagle3.1" (parse_drafters)
    drafters: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, folder in self.drafters.items():
            if not isinstance(name, str) or not name or not isinstance(folder, str) or not folder:
                raise ValueError(f"spec.drafters maps decoding names to drafter folders, got "
                                 f"{name!r}: {folder!r}")
        for name in ("gamma", "budget", "grow_width", "offer_width"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"spec.{name} must be an integer >= 1, got {v!r}")
        if type(self.reconsider) is not int or self.reconsider < 0:  # True passed as m = 1
            raise ValueError(f"spec.reconsider must be an integer >= 0, got {self.reconsider!r}")
        if self.extra not in ("reconsider", "advance"):
            raise ValueError(f"spec.extra must be 'reconsider' or 'advance', got {self.extra!r}")
        if self.select not in ("confidence", "miss"):
            raise ValueError(f"spec.select must be 'confidence' or 'miss', got {self.select!r}")
        if self.verify not in ("rejection", "match"):
            raise ValueError(f"spec.verify must be 'rejection' or 'match', got {self.verify!r}")
        if type(self.max_drafters) is not int or self.max_drafters < 0:
            raise ValueError(f"spec.max_drafters must be an integer >= 0, got {self.max_drafters!r}")
        if not isinstance(self.max_batch, int) or isinstance(self.max_batch, bool) or self.max_batch < 0:
            raise ValueError(f"spec.max_batch must be an integer >= 0 (0: no cap), got {self.max_batch!r}")


@dataclass
class EngineConfig:
    """How the engine runs a model.

    KV memory: ``kv_memory_bytes`` is what the engine is given (on CUDA, None means the free device
    memory after loading weights); ``kv_fraction`` (r) of it becomes KV blocks. ``num_blocks`` set
    explicitly overrides both (tests use it to create memory pressure).
    """

    model: str = ""
    device: str = "auto"  # "auto" | "cpu" | "cuda" | "cuda:N"
    dtype: str = "auto"  # "auto": float32 on CPU, bfloat16 on CUDA
    # the KV cache's element type: "auto" is the model's dtype; "bfloat16" halves what attention reads per
    # cached token (on the CPU the kernels widen each key and value to fp32 as they read it: fp32 math on
    # keys and values rounded once, when written) and holds twice the tokens in the same memory
    kv_dtype: str = "auto"  # KV cache elements: "auto" (the model's dtype) | "float32" | "bfloat16"
    block_size: int = 16
    kv_memory_bytes: int | None = None
    kv_fraction: float = 0.9
    num_blocks: int | None = None
    max_num_seqs: int = 256  # traces running at once (a step's batch); more from add, add_samples, fork wait
    max_num_batched_tokens: int = 8192
    preemption: str = "recompute"  # what to do under KV pressure: "recompute" or "evict"
    # a waiting trace is admitted beside running ones only while the free blocks let each of them grow
    # this many more tokens (engine/scheduler.py): else, in a tight cache, it was admitted into the last
    # blocks and preempted a token later, re-prefilling its prefix again and again. 0: admit into the
    # last blocks. None: 16 with preemption "recompute", 0 with "evict" (the search's engines: their
    # driver evicts by its own KV ratio and ranks, and an engine eviction drops a trace for good)
    admit_lookahead: int | None = None
    seed: int = 0
    eagle_taps: bool = False  # also return hidden states entering layers (2, L//2, L-3)
    cpu_kernel: bool = True  # CPU fp32 decode attention reads KV blocks in place (compiled once)
    cpu_linear: str = "transposed"  # CPU fp32 linears: "transposed" | "packed" | "plain" (engine/linear.py)
    cpu_layers: bool = True  # kernel-served CPU forwards run the layer loop in C++, same floats (cpu_decoder)
    cpu_stream: bool = True  # one-row products of weights >= 2^18 elements stream through cpu_gemv
    # "bfloat16" rounds every linear weight to bfloat16 and multiplies on oneDNN's bfloat16 GEMM (AMX /
    # AVX512-BF16) and the streamed one-row kernel: half the bytes a step reads; activations, norms and KV
    # stay fp32 (needs such a CPU, cpu_linear="transposed" and an fp32 model: dtype float32 or auto)
    cpu_weights: str = "float32"  # CPU linears' weight precision: "float32" | "bfloat16" (engine/linear.py)
    # every row's floats independent of the rows beside it: all products on cpu_invariant's tiles, all
    # attention in the one-row order (trees and long prefill chunks too), every RMSNorm one row at a time.
    # A trace then decodes the same tokens alone or in any batch, chunked any way, plainly or
    # speculatively, also with bfloat16 weights or KV (CPU, fp32 model, the compiled kernels). None: on
    # where it holds (``invariant_holds``; the serving surfaces' default), off elsewhere (a GPU, ...)
    batch_invariant: bool | None = False  # one order of arithmetic a row, any batch (engine/cpu_invariant.py)
    # CPU: a plain step runs on as many threads as give each at least this many multiply-adds (rows x
    # the model's weights per row / threads; at least 1, at most torch's setting): small steps lose more
    # to thread sync than they gain (engine/step_threads.py). The shipped target: 1 thread below 12
    # rows; SmolLM2-135M: all from 1 row. 0: every step on all threads. Measured per vendor: on an Intel
    # Xeon two threads win at every batch, so 1,000,000 there (gambit.cpu_info)
    min_macs_per_thread: int = default_min_macs_per_thread()
    # plain decode steps over static buffers (engine/decode_graphs.py): "cuda" replays them as CUDA
    # graphs, one launch a step where eager takes ~200 (not yet run on a GPU); "static" runs the same
    # step eagerly on any device (tests)
    decode_graphs: str = "off"  # "off" | "cuda" (CUDA graphs for plain decode steps) | "static" (tests)
    graph_max_batch: int = 256  # plain decode steps of at most this many traces take the graph path
    spec: SpecConfig = field(default_factory=SpecConfig)  # tree drafting for speculative traces

    def __post_init__(self) -> None:
        # each field's type before its range: a str or float here failed later as a bare TypeError
        if not is_int(self.block_size) or self.block_size <= 0 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a positive power of two, got {self.block_size!r}")
        if not (is_number(self.kv_fraction) and 0 < self.kv_fraction <= 1):
            raise ValueError(f"kv_fraction must be a number in (0, 1], got {self.kv_fraction!r}")
        if self.num_blocks is not None and (not is_int(self.num_blocks) or self.num_blocks <= 0):
            raise ValueError(f"num_blocks must be a positive integer (or None), got {self.num_blocks!r}")
        kv = self.kv_memory_bytes  # -5 passed here and failed at Engine creation ("KV budget -5 B ...")
        if kv is not None and (not is_int(kv) or kv <= 0):
            raise ValueError(f"kv_memory_bytes must be a positive integer (or None), got {kv!r}")
        la = self.admit_lookahead
        if la is not None and (not is_int(la) or la < 0):
            raise ValueError(f"admit_lookahead must be an integer >= 0 (or None), got {la!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            if not is_int(getattr(self, name)):
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        at_least(1, max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens)
        if not is_int(self.seed):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        for name in ("eagle_taps", "cpu_kernel", "cpu_layers", "cpu_stream"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        check_device(self.device)
        if isinstance(self.spec, dict):
            self.spec = SpecConfig(**self.spec)
        if not isinstance(self.spec, SpecConfig):
            raise ValueError("spec must be a SpecConfig")
        if not is_int(self.min_macs_per_thread) or self.min_macs_per_thread < 0:
            raise ValueError(f"min_macs_per_thread must be an integer >= 0, got {self.min_macs_per_thread!r}")
        if self.cpu_linear not in ("transposed", "packed", "plain"):
            raise ValueError(f"cpu_linear must be transposed, packed or plain, got {self.cpu_linear!r}")
        check_cpu_weights(self.cpu_weights)
        check_kv_dtype(self.kv_dtype)
        if self.cpu_weights == "bfloat16" and self.cpu_linear != "transposed":
            raise ValueError(f"cpu_weights=bfloat16 needs cpu_linear=transposed, got {self.cpu_linear!r}")
        if self.batch_invariant not in (True, False, None):
            raise ValueError(f"batch_invariant must be true, false or null (on where it holds), "
                             f"got {self.batch_invariant!r}")
        if self.batch_invariant and (self.cpu_linear != "transposed" or not self.cpu_kernel
                                     or self.decode_graphs != "off"):
            raise ValueError("batch_invariant needs cpu_linear=transposed, cpu_kernel and decode_graphs=off")
        if self.decode_graphs not in DECODE_GRAPH_MODES:
            raise ValueError(f"decode_graphs must be one of {DECODE_GRAPH_MODES}, got {self.decode_graphs!r}")
        if not is_int(self.graph_max_batch) or self.graph_max_batch < 1:
            raise ValueError(f"graph_max_batch must be an integer >= 1, got {self.graph_max_batch!r}")
        if self.preemption not in PREEMPTION_MODES:
            raise ValueError(f"preemption must be one of {PREEMPTION_MODES}, got {self.preemption!r}")

    def lookahead(self) -> int:
        """``admit_lookahead`` resolved: None is 16 tokens under "recompute", 0 under "evict"."""
        if self.admit_lookahead is not None:
            return int(self.admit_lookahead)
        return DEFAULT_ADMIT_LOOKAHEAD if self.preemption == "recompute" else 0

    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def torch_dtype(self) -> torch.dtype:
        from gambit.model.loader import resolve_dtype

        if self.dtype == "auto":
            return torch.bfloat16 if self.torch_device().type == "cuda" else torch.float32
        return resolve_dtype(self.dtype)

    def torch_kv_dtype(self) -> torch.dtype:
        """The KV cache's element type (``kv_dtype``; "auto": the model's)."""
        from gambit.model.loader import resolve_dtype

        return self.torch_dtype() if self.kv_dtype == "auto" else resolve_dtype(self.kv_dtype)


def is_int(v) -> bool:
    """An integer (numpy's too, as these fields always took) that is not a bool."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def check_device(device) -> None:
    """``device`` one the engine runs on here: auto | cpu | cuda | cuda:N, and for cuda a GPU this torch
    sees (else the model's ``.to()`` failed deep in torch: "Torch not compiled with CUDA enabled")."""
    if not isinstance(device, str) or not DEVICE.fullmatch(device):
        raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {device!r}")
    if device.startswith("cuda"):
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if int(device.partition(":")[2] or 0) >= n:
            where = "this torch has no CUDA" if not n and not torch.backends.cuda.is_built() else \
                f"this host has {n} CUDA device{'' if n == 1 else 's'}"
            raise ValueError(f"device={device!r} but {where} (torch {torch.__version__}); "
                             "use 'cpu' or 'auto'")
