"""The engine API everything above uses: add, fork, abort, set_priority, step → events, kv_usage."""

from __future__ import annotations

import logging
import numbers
import time
from collections.abc import Iterable, Sequence

import torch

from gambit.cpu_info import cpu_flags
from gambit.engine import cpu_attention, cpu_sample_step, cpu_sampler
from gambit.engine.attention import SeqInput
from gambit.engine.block_manager import BlockManager, OutOfBlocks
from gambit.engine.boundary import BoundaryDetector
from gambit.engine.config import EngineConfig
from gambit.engine.events import Event, EvictedEvent, FinishedEvent, TokenEvent
from gambit.engine.kv_cache import bytes_per_block, spec_tap_bytes_per_block
from gambit.engine.linear import install_cpu_linears
from gambit.engine.model_runner import ModelRunner
from gambit.engine.sampler import CDF_BLOCK, SamplingBatch, mix64, sample, top_logprobs, uses_filter
from gambit.engine.scheduler import Scheduler
from gambit.engine.sequence import SamplingParams, Trace, TraceStatus, is_int
from gambit.engine.shared_prompt import SharedPrompts
from gambit.engine.stats import EngineStats
from gambit.engine.step_threads import StepThreads, macs_per_row
from gambit.model.llama import CausalLM
from gambit.model.tokenizer import Tokenizer

DEFAULT_CPU_KV_BYTES = 1 << 30
log = logging.getLogger(__name__)


def invariant_holds(config: EngineConfig, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``batch_invariant=None`` turns it on: an fp32 model on the CPU with the compiled kernels,
    transposed linears and no decode graphs, on a CPU with AVX-512 (the tile kernel's vector path; on
    others its plain code keeps the floats, not measured for speed, so it stays opt-in there)."""
    return (device.type == "cpu" and dtype == torch.float32 and config.cpu_linear == "transposed"
            and config.cpu_kernel and config.decode_graphs == "off" and "avx512f" in cpu_flags()
            and cpu_attention.kernel() is not None)


def check_priority(priority) -> float:
    """A finite float, or ValueError (NaN would make the scheduler's order undefined; True and "2"
    passed as 1.0 and 2.0)."""
    if isinstance(priority, (bool, str, bytes)):
        raise ValueError(f"priority must be a number, got {priority!r}")
    try:
        value = float(priority)
    except (TypeError, ValueError):
        raise ValueError(f"priority must be a number, got {priority!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"priority must be finite, got {priority!r}")
    return value


_M64 = (1 << 64) - 1
_C1U, _C2U = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def derive_seed(*parts: int) -> int:
    """A non-negative 63-bit seed from integers (engine seed, trace id, ...).

    ``mix64`` (splitmix64) on plain Python ints, bit for bit the tensor version (a fork derives a
    seed per child, and four tiny tensor ops per part cost more than the fork itself).
    """
    x = 0
    for p in parts:
        x = (x + int(p)) & _M64
        x ^= x >> 30
        x = (x * _C1U) & _M64
        x ^= x >> 27
        x = (x * _C2U) & _M64
        x ^= x >> 31
    return x & ((1 << 63) - 1)


def _derive_seed_tensor(*parts: int) -> int:
    """The tensor reference of ``derive_seed`` (tests check they agree)."""
    x = torch.tensor(0, dtype=torch.long)
    for p in parts:
        x = mix64(x + int(p))
    return int(x) & ((1 << 63) - 1)


class Engine:
    def __init__(self, model: CausalLM, tokenizer: Tokenizer, config: EngineConfig | None = None) -> None:
        self.config = config = config or EngineConfig()
        self.device = config.torch_device()
        self.dtype = config.torch_dtype()
        self.kv_dtype = config.torch_kv_dtype()
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        self.model.rope.cos, self.model.rope.sin = self.model.rope.cos.float(), self.model.rope.sin.float()
        self.model.fuse_projections()  # (re)fuse: a .to() above may have unshared earlier fusion
        if config.cpu_weights != "float32" and (self.device.type != "cpu" or self.dtype != torch.float32):
            raise ValueError(f"cpu_weights={config.cpu_weights} is for an fp32 model on the CPU; this one is "
                             f"{self.dtype} on {self.device.type}")
        self.batch_invariant = invariant_holds(config, self.device, self.dtype) \
            if config.batch_invariant is None else config.batch_invariant
        if self.batch_invariant and (self.device.type != "cpu" or self.dtype != torch.float32
                                     or cpu_attention.kernel() is None):
            raise ValueError(f"batch_invariant is for an fp32 model on the CPU with the compiled kernels; "
                             f"this one is {self.dtype} on {self.device.type}"
                             + ("" if cpu_attention.kernel() is not None else " without them"))
        self.cpu_linear = install_cpu_linears(self.model, config.cpu_linear,  # CPU fp32 (or full bf16)
                                              stream=config.cpu_stream and config.cpu_kernel,
                                              weights=config.cpu_weights, invariant=self.batch_invariant)
        self.tokenizer = tokenizer
        mc = model.config
        self.max_model_len = mc.max_position_embeddings
        self.num_blocks = config.num_blocks or self._blocks_from_budget()
        self.blocks = BlockManager(self.num_blocks, config.block_size)
        self.scheduler = Scheduler(self.blocks, config.max_num_seqs, config.max_num_batched_tokens,
                                   config.preemption, config.lookahead())
        self.runner = ModelRunner(self.model, self.num_blocks, config.block_size, self.device, self.dtype,
                                  config.cpu_kernel, config.cpu_layers, config.decode_graphs,
                                  config.graph_max_batch, kv_dtype=self.kv_dtype,
                                  batch_invariant=self.batch_invariant)
        self.traces: dict[int, Trace] = {}
        self.stats = EngineStats()
        self._next_id = 0
        self._pending: list[Event] = []
        self.eos_ids = set(tokenizer.eos_ids) | set(mc.eos_ids)
        self.boundary = BoundaryDetector(tokenizer, mc.vocab_size, self.device)  # also "\n" + "\n"
        self.taps = tuple(model.eagle_taps) if config.eagle_taps else ()
        self.last_taps: dict[int, torch.Tensor] = {}
        self._spec = None  # gambit.speculative.decoder.SpecDecoder, made when a trace first asks
        self.threads = StepThreads(macs_per_row(mc), config.min_macs_per_thread,
                                   enabled=self.device.type == "cpu")
        self.shared = SharedPrompts(self)  # ``add_samples``: followers waiting on a leader's prefill
        # the sampler's ATen calls in one C++ call on the CPU (the same tokens; engine/cpu_sampler.py)
        self._draw = cpu_sampler.sample if config.cpu_kernel and cpu_sampler.available(self.device) \
            else sample
        # and where every row samples without top-k / top-p, the whole step in plain loops (the same
        # tokens and log-probabilities, no sampler tensors built)
        self._step_draw = (cpu_sample_step.step_kernel(self.device, mc.vocab_size) if config.cpu_kernel
                           else None)
        self._told: set[str] = set()  # the once-per-engine notes already logged (``_tell_once``)

    @classmethod
    def from_pretrained(cls, folder: str, config: EngineConfig | None = None) -> Engine:
        from gambit.model.loader import load_model

        config = config or EngineConfig(model=folder)
        model, tok = load_model(folder, device=config.torch_device(), dtype=config.torch_dtype())
        return cls(model, tok, config)

    def _blocks_from_budget(self) -> int:
        given = self.config.kv_memory_bytes
        if given is None:
            if self.device.type == "cuda":
                given = torch.cuda.mem_get_info(self.device)[0]
            else:
                given = DEFAULT_CPU_KV_BYTES
        mc, bs = self.model.config, self.config.block_size
        per = bytes_per_block(mc, bs, self.kv_dtype)  # drafters' one-layer caches stay in the model's dtype
        per += bytes_per_block(mc, bs, self.dtype) * self.config.spec.max_drafters // mc.num_hidden_layers
        if self.config.spec.max_drafters:  # the target's raw taps by KV slot (drafters share one buffer)
            per += spec_tap_bytes_per_block(mc, bs, self.dtype)
        n = int(given * self.config.kv_fraction) // per
        if n < 1:
            raise ValueError(f"KV budget {given} B x {self.config.kv_fraction} holds no {per}-byte block")
        return n

    # -- API --------------------------------------------------------------------------------
    def speculator(self):
        """The speculative decoder (drafters and their KV caches): the one place the engine reaches up."""
        if self._spec is None:
            from gambit.speculative.decoder import SpecDecoder

            self._spec = SpecDecoder(self)
        return self._spec

    def register_drafter(self, name: str, drafter) -> None:
        """Make ``SamplingParams(decoding=name)`` draft with ``drafter`` (tests, benchmarks)."""
        self.speculator().register(name, drafter)

    def add(self, prompt: str | Sequence[int], params: SamplingParams | None = None,
            priority: float = 0.0) -> int:
        """Queue a new trace; returns its id. Invalid input raises ValueError and changes nothing."""
        params = params or SamplingParams()
        ids, priority = self._check_new(prompt, [params], priority)
        return self._queue(ids, params, priority).id

    def add_samples(self, prompt: str | Sequence[int], params: Sequence[SamplingParams],
                    priority: float = 0.0) -> list[int]:
        """One trace per ``params`` entry, all of one prompt, which is prefilled once: the others take
        its KV (full blocks shared) and sample their own first token from its last logits, each with
        its own seed (``gambit.engine.shared_prompt``). Returns their ids; the same tokens as
        ``add`` for each. Invalid input raises ValueError and changes nothing."""
        params = list(params)
        if not params:
            raise ValueError("params is empty: need one SamplingParams per trace")
        ids, priority = self._check_new(prompt, params, priority)
        if len({p.decoding for p in params}) > 1:
            raise ValueError("every trace of add_samples must use the same decoding")
        traces = [self._queue(ids, p, priority, schedule=i == 0) for i, p in enumerate(params)]
        if len(traces) > 1:
            self.shared.wait_on(traces[0], traces[1:])
        return [t.id for t in traces]

    def _check_new(self, prompt, params: list[SamplingParams], priority) -> tuple[list[int], float]:
        if not all(isinstance(p, SamplingParams) for p in params):
            raise ValueError("params must be a SamplingParams")
        priority = check_priority(priority)
        if isinstance(prompt, (bytes, bytearray)) or not isinstance(prompt, str | Iterable):
            # bytes passed as their byte values' token ids; 5 or None raised a bare TypeError
            raise ValueError(f"prompt must be a string or a sequence of token ids, "
                             f"got {type(prompt).__name__}")
        if isinstance(prompt, str):
            ids = self.tokenizer.encode_checked(prompt)
        else:  # a numpy array or torch tensor of ids: its Python ints (its elements were refused)
            ids = prompt.tolist() if hasattr(prompt, "tolist") else list(prompt)
            if not isinstance(ids, list):
                raise ValueError(f"prompt must be a sequence of token ids, got {prompt!r}")
        if not ids or (isinstance(prompt, str) and not prompt):
            raise ValueError("prompt is empty")
        vocab = self.model.config.vocab_size
        if any(not is_int(t) or not 0 <= t < vocab for t in ids):  # True passed as token 1
            # numpy's integers in a list, as ints ("must be integers" named them wrongly)
            ids = [int(t) if isinstance(t, numbers.Integral) and not isinstance(t, bool) else t for t in ids]
            if any(not is_int(t) or not 0 <= t < vocab for t in ids):
                raise ValueError(f"prompt token ids must be integers in [0, {vocab})")
        for d in {p.decoding for p in params} - {"plain"}:
            self.speculator().prepare(d)  # ValueError for an unknown drafter
        if len(ids) >= self.max_model_len:
            raise ValueError(f"prompt has {len(ids)} tokens; the context holds {self.max_model_len} "
                             "including at least one generated token")
        if self.blocks.blocks_for(len(ids) + 1) > self.num_blocks:
            bs = self.config.block_size  # the knob named: `gambit run`'s 120 blocks hold 1,920 tokens
            raise ValueError(f"prompt of {len(ids)} tokens needs more KV blocks than the cache has "
                             f"({self.num_blocks} of {bs} tokens: {self.num_blocks * bs}); raise the "
                             "engine's KV blocks (`gambit run --kv-blocks`, num_blocks elsewhere)")
        return ids, priority

    def _queue(self, ids: list[int], params: SamplingParams, priority: float, schedule: bool = True
               ) -> Trace:
        tid = self._new_id()
        seed = params.seed if params.seed is not None else derive_seed(self.config.seed, tid)
        trace = Trace(tid, list(ids), len(ids), params, seed, priority, arrival=tid)
        self.traces[tid] = trace
        if schedule:
            self.scheduler.add(trace)
        return trace

    def fork(self, trace_id: int, n: int = 1, seeds: Sequence[int] | None = None,
             temperatures: Sequence[float] | None = None, priority: float | None = None) -> list[int]:
        """``n`` children continuing ``trace_id``; each inherits the parent's KV (full blocks shared).

        Each child gets its own seed (given or derived) and optionally its own temperature. A child
        whose partial block cannot be allocated, or that would run beyond ``EngineConfig.max_num_seqs``
        traces, waits and is re-prefilled instead (as a follower of ``add_samples`` does): the cap
        bounds every step's batch, forks included.
        """
        parent = self._live(trace_id)
        if not is_int(n) or n < 1:  # True passed as n = 1
            raise ValueError(f"n must be an integer >= 1, got {n!r}")
        priority = parent.priority if priority is None else check_priority(priority)
        for name, vals in (("seeds", seeds), ("temperatures", temperatures)):
            if vals is None:
                continue
            if isinstance(vals, str | bytes) or not hasattr(vals, "__len__"):  # seeds=7: a bare TypeError
                raise ValueError(f"{name} must be a list of {n} values, got {type(vals).__name__}")
            if len(vals) != n:
                raise ValueError(f"{name} has {len(vals)} values for {n} children")
        params = [parent.params.child(None if seeds is None else seeds[i],
                                      parent.params.temperature if temperatures is None
                                      else temperatures[i]) for i in range(n)]  # validates
        out = []
        for i in range(n):
            cid = self._new_id()
            seed = params[i].seed if params[i].seed is not None else derive_seed(parent.seed, cid)
            child = Trace(cid, list(parent.token_ids), parent.prompt_len, params[i], seed,
                          priority, arrival=cid, parent=parent.id, logprobs=list(parent.logprobs))
            self.traces[cid] = child
            copied, pair = False, None
            if parent.status is TraceStatus.RUNNING and parent.num_cached \
                    and len(self.scheduler.running) < self.config.max_num_seqs:
                try:
                    pair = self.blocks.fork(parent, child)
                    if pair:
                        self.runner.cache.copy_blocks([pair], parent.num_cached % self.blocks.block_size)
                    copied = True
                except OutOfBlocks:
                    pass
            if self._spec is not None:
                self._spec.on_fork(parent, child, pair, copied)
            if copied:
                self.scheduler.add_running(child)
            else:
                self.scheduler.add(child)
            out.append(cid)
        self.stats.forks += n
        return out

    def abort(self, trace_id: int) -> None:
        """Stop a trace now and free its blocks; a FinishedEvent('abort') follows on the next step."""
        t = self._live(trace_id)
        self._finish(t, "abort")
        self.stats.aborts += 1

    def set_priority(self, trace_id: int, priority: float) -> None:
        """Higher runs first and is evicted last."""
        trace = self._live(trace_id)
        trace.priority = check_priority(priority)

    def kv_usage(self) -> float:
        return self.blocks.usage()

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work() or bool(self._pending)

    def get(self, trace_id: int) -> Trace:
        return self._live(trace_id)

    # -- stepping ---------------------------------------------------------------------------
    def step(self, token_events: bool | str = True) -> list[Event]:
        """One engine iteration; returns its events. ``token_events=False``: no TokenEvent for the
        tokens sampled plainly (a caller that reads them from the traces, as the search driver does,
        saves building ~one object per trace a step); every other event still comes. ``"drafted"``:
        those TokenEvents only in a step that verified a draft tree (the search driver's Δ clock of
        speculative runs reads them there; a capped step, all plain, then builds none)."""
        if token_events not in (True, False, "drafted"):
            raise ValueError(f"token_events must be True, False or 'drafted', got {token_events!r}")
        events, self._pending = self._pending, []
        batch = self.scheduler.schedule()
        for t in batch.evicted:
            events.append(EvictedEvent(t.id, tuple(t.output_ids)))
            self.traces.pop(t.id, None)
            if self.shared:
                self.shared.release(t)
        self.stats.evictions += len(batch.evicted)
        self.stats.preemptions += len(batch.preempted)
        if not batch:
            self.stats.kv_usage = self.kv_usage()
            return events
        spec = self._spec
        if spec is not None and all(t.params.decoding == "plain" for t in batch.traces):
            spec = None
        self.threads.apply(sum(batch.num_new) if spec is None else None)  # drafting + trees: all
        trees = spec.draft(batch.traces, batch.num_new) if spec is not None else {}
        if spec is not None and not trees and "spec_cap" not in self._told and self.stats.spec_capped_steps:
            self._tell_once("spec_cap", "a step of %d traces, speculative ones among them, decoded plainly: "
                            "trees are drafted only in steps of at most spec.max_batch = %d traces "
                            "(SpecConfig.max_batch; 0: no cap); stats.spec_capped_steps counts such steps",
                            len(batch.traces), self.config.spec.max_batch)
        items, sample_rows, samplers, row = [], [], [], 0
        offsets, tree_rows = [], []  # first flat row per trace (-1: tree); flat rows of tree items
        for t, n in zip(batch.traces, batch.num_new, strict=True):
            start = t.num_cached
            if t.id in trees:  # root + draft tree: one item with the tree mask
                plan, i = trees[t.id]
                items.append(plan.items[i])
                tree_rows.append(list(range(row, row + plan.items[i].q)))
                offsets.append(-1)
                row += plan.items[i].q
                continue
            items.append(SeqInput(t.token_ids[start:start + n], list(range(start, start + n)), start,
                                  t.block_table))
            offsets.append(row)
            row += n
            if start + n == len(t.token_ids):
                sample_rows.append(row - 1)
                samplers.append(t)
            if start < t.prompt_len:
                self.stats.prompt_tokens += min(n, t.prompt_len - start)
        t0 = time.perf_counter()
        taps = self.taps
        if spec is not None:  # the drafters' taps (with the engine's own, when it keeps some)
            taps = tuple(sorted(set(taps) | set(spec.taps()))) if taps else spec.taps()
        out = self.runner.forward(items, sample_rows + [r for rows in tree_rows for r in rows], taps)
        if spec is not None:
            spec.store(batch.traces, batch.num_new, offsets, out.taps, out.slots)
        for t, n in zip(batch.traces, batch.num_new, strict=True):
            if t.id not in trees:
                t.num_cached += n
        if trees:  # boundary states of plain rows and of each tree's root (its nodes: at acceptance)
            events.extend(self.boundary.tree_events(batch, offsets, tree_rows, trees, out))
        else:
            events.extend(self.boundary.events(batch.traces, batch.num_new, out.tokens, out.positions,
                                               out.hidden))
        if self.taps:
            self.last_taps = out.taps
        if samplers:
            logits = out.logits[:len(sample_rows)]
            if self.shared:  # followers of a leader whose prefill completed: its logits row
                samplers, rows = self.shared.attach(samplers)
                if len(rows) > len(sample_rows):
                    logits = logits[torch.tensor(rows, device=logits.device)]
            emit = token_events is True or bool(trees and token_events)  # "drafted": with trees only
            events.extend(self._sample(samplers, logits, emit))
        if trees:
            events.extend(self._verify(trees, tree_rows, batch.traces, out, len(sample_rows)))
        self.stats.forward_seconds += time.perf_counter() - t0
        self.stats.steps += 1
        self.stats.batched_traces += len(batch.traces)
        self.stats.last_batch_size = len(batch.traces)
        self.stats.max_batch_size = max(self.stats.max_batch_size, len(batch.traces))
        self.stats.kv_usage = self.kv_usage()
        return events

    def _verify(self, trees, tree_rows, traces, out, first_logit: int) -> list[Event]:
        """Accept every tree's path (grouped by drafter); tree logits follow the plain ones."""
        spec_traces = [t for t in traces if t.id in trees]
        rows_of = {t.id: rows for t, rows in zip(spec_traces, tree_rows, strict=True)}
        index, at = {}, first_logit
        for t in spec_traces:
            index[t.id] = list(range(at, at + len(rows_of[t.id])))
            at += len(rows_of[t.id])
        events: list[Event] = []
        for plan in {id(p): p for p, _ in trees.values()}.values():
            lrows = torch.tensor([index[t.id] for t in plan.traces], device=self.device)
            frows = torch.tensor([rows_of[t.id] for t in plan.traces], device=self.device)
            events.extend(self._spec.verify(plan, out.logits, out.hidden, out.taps, lrows, frows))
        events.extend(self._pending)
        self._pending = []
        return events

    def draw_rows(self, logits: torch.Tensor, temps: list[float], top_ks: list[int], top_ps: list[float],
                  seeds: list[int], counters: list[int], want: int = 0, top: int = 0) -> tuple:
        """The engine's sampler on logits rows [N, V], one setting per row (``counters``: the position
        each row's token takes). Returns the tokens and, when ``want``, (chosen, top values, top ids)
        log-probabilities as lists (the top ones when ``top``, else None). Where every row samples, the
        plain-loop step (the same tokens and log-probabilities)."""
        if self._step_draw is not None and logits.dtype == torch.float32:
            filtered = uses_filter(top_ks, top_ps)
            tokens, chosen, vals, ids = self._step_draw(logits, temps, seeds, counters, want,
                                                        top if want else 0, CDF_BLOCK,
                                                        list(top_ks) if filtered else [],
                                                        list(top_ps) if filtered else [])
            if tokens:  # every row is served (greedy ones too); only an empty batch goes below
                if not want:
                    return tokens, None
                return tokens, (chosen, vals.tolist(), ids.tolist()) if top else (chosen, None, None)
        sb = SamplingBatch.build(temps, top_ks, top_ps, seeds, counters, self.device)
        tokens = self._draw(logits, sb)
        lp = top_logprobs(logits, tokens, want) if want else None
        return tokens.tolist(), None if lp is None else tuple(x.tolist() for x in lp)

    def _sample(self, traces: list[Trace], logits: torch.Tensor, token_events: bool = True) -> list[Event]:
        # the batch's largest ``logprobs``: each trace keeps the first k (top_entries' order is the row's own)
        want, p = max(t.params.logprobs for t in traces), [t.params for t in traces]
        token_list, lp = self.draw_rows(logits, [x.temperature for x in p], [x.top_k for x in p],
                                        [x.top_p for x in p], [t.seed for t in traces],
                                        [len(t.token_ids) for t in traces], want, want if token_events else 0)
        if lp is not None:
            chosen, vals, ids = lp
        events: list[Event] = []
        # per trace and step, so written for speed (at 96 traces it was ~2.9 us a trace, 5% of a
        # search step): locals, the top-1 pair without zip, and ``_stop_reason`` only for a trace
        # that may stop (an EOS, stop strings, or at a length limit)
        eos, cap = self.eos_ids, min(self.max_model_len, self.num_blocks * self.config.block_size) - 1
        append = events.append
        if len(token_list) != len(traces):
            raise AssertionError(f"{len(token_list)} tokens drawn for {len(traces)} traces")
        for i, t in enumerate(traces):
            tok, prm, seq = token_list[i], t.params, t.token_ids
            pos = len(seq)
            seq.append(tok)
            k = prm.logprobs if lp is not None else 0
            if k:
                c = chosen[i]
                t.logprobs.append(c)
                if token_events:
                    top = ((ids[i][0], vals[i][0]),) if k == 1 else tuple(zip(ids[i][:k], vals[i][:k],
                                                                              strict=True))
                    append(TokenEvent(t.id, tok, pos, c, top))
            elif token_events:
                append(TokenEvent(t.id, tok, pos))
            if tok in eos or prm.stop or pos >= cap or pos + 1 - t.prompt_len >= prm.max_tokens:
                reason = self._stop_reason(t, tok)
                if reason:
                    self._finish(t, reason)
        self.stats.generated_tokens += len(traces)
        events.extend(self._pending)
        self._pending = []
        return events

    def _stop_reason(self, t: Trace, tok: int) -> str | None:
        if tok in self.eos_ids and not t.params.ignore_eos:
            return "eos"
        if t.params.stop:
            # enough tokens for the longest stop string (a character may take up to 4 byte tokens):
            # 64 tokens missed a longer one (a char tokenizer never stopped on 80 characters)
            n = max(64, 4 * max(map(len, t.params.stop)) + 4)
            tail = self.tokenizer.decode(t.token_ids[max(t.prompt_len, len(t.token_ids) - n):])
            if any(s in tail for s in t.params.stop):
                return "stop"
        if t.num_generated >= t.params.max_tokens or len(t.token_ids) >= self.max_model_len:
            return "length"
        if len(t.token_ids) >= self.num_blocks * self.config.block_size:  # outgrew the whole cache
            if "kv_cache" not in self._told:  # "length" too (events.FinishedEvent says why); told once
                bs = self.config.block_size
                self._tell_once("kv_cache", "trace %d ended (reason 'length') at %d tokens, all the KV "
                                "cache holds (%d blocks of %d tokens), before its max_tokens %d or the "
                                "context %d: give the engine more KV blocks (num_blocks, kv_memory_bytes)",
                                t.id, len(t.token_ids), self.num_blocks, bs, t.params.max_tokens,
                                self.max_model_len)
            return "length"
        return None

    def _tell_once(self, key: str, message: str, *args) -> None:
        """Log a warning the first time ``key`` happens in this engine (a condition a caller should
        know of but that recurs every step: one line, not one a step)."""
        self._told.add(key)
        log.warning(message, *args)

    def tell_once(self, key: str, message: str, *args) -> None:
        """``_tell_once`` unless ``key`` was told already: for the engine's parts outside this class
        (the speculative decoder), which read the private ``_told`` set before."""
        if key not in self._told:
            self._tell_once(key, message, *args)

    def _finish(self, t: Trace, reason: str) -> None:
        if self.shared:
            self.shared.release(t)
            self.shared.drop(t)
        self.scheduler.remove(t)
        self.blocks.free(t)
        t.status = TraceStatus.FINISHED
        t.finish_reason = reason
        self.traces.pop(t.id, None)
        self.stats.finished += 1
        self._pending.append(FinishedEvent(t.id, reason, tuple(t.output_ids)))

    def _live(self, trace_id: int) -> Trace:
        t = self.traces.get(trace_id)
        if t is None or t.is_done:
            raise ValueError(f"no live trace {trace_id}")
        return t

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    # -- convenience ------------------------------------------------------------------------
    def generate(self, prompts: Iterable[str | Sequence[int]],
                 params: SamplingParams | Sequence[SamplingParams], progress=None) -> list[list[int]]:
        """Run prompts to completion; output token ids per prompt (evicted traces: what they had).

        Events of other live traces (a caller streaming with ``add`` + ``step``) are not consumed:
        the caller's next ``step()`` returns them first, in order."""
        prompts = list(prompts)
        plist = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
        if len(plist) != len(prompts):  # checked first: zip's strict check came after adding the pairs
            raise ValueError(f"{len(plist)} SamplingParams for {len(prompts)} prompts")
        # every prompt checked before any is queued: a bad one left the ones before it running
        checked = [self._check_new(p, [sp], 0.0)[0] for p, sp in zip(prompts, plist, strict=True)]
        ids = [self._queue(x, sp, 0.0).id for x, sp in zip(checked, plist, strict=True)]
        index = {tid: i for i, tid in enumerate(ids)}
        outputs: list[list[int]] = [[] for _ in ids]
        remaining, others = len(ids), []
        while remaining:
            for ev in self.step():
                if ev.trace_id not in index:
                    others.append(ev)
                elif isinstance(ev, FinishedEvent | EvictedEvent):
                    outputs[index[ev.trace_id]] = list(ev.output_ids)
                    remaining -= 1
                    if progress is not None:
                        progress.update(1)
        self._pending[:0] = others  # before anything queued since (an abort between steps)
        return outputs
