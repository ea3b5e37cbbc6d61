"""The clients and the engine baseline of ``gambit bench serve``: the problems every run solves, the
embedded and the distributed wiring driven by n closed-loop clients, the bare engine at batch n·C, and
the latency quantile the table reports."""

from __future__ import annotations

import statistics
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gambit.bench.serve import BenchServeConfig


def problems(n: int) -> list[str]:
    from gambit.tasks.arithmetic import TaskConfig, generate

    return [p.prompt for p in generate("dev", n, 7, TaskConfig(3, 6))]


def run_embedded(emb, prompts, cfg: BenchServeConfig, clients: int | None = None) -> list[dict]:
    from gambit.serving.solve_config import SolveConfig

    out: list[dict] = [{} for _ in prompts]

    def one(i):
        t0 = time.perf_counter()
        sc = SolveConfig(capacity=cfg.capacity, swap=min(2, cfg.capacity), round_interval=cfg.round_interval,
                         max_tokens=cfg.max_tokens, seed=i)
        res = list(emb.solve(prompts[i], sc))[-1]
        out[i] = {"latency": time.perf_counter() - t0, "tokens": res["generated_tokens"],
                  "sync": res["scorer_s"], "total": res["total_s"], "answer": res["answer"]}

    _threads(one, len(prompts), clients)
    return out


def run_distributed(address: str, prompts, cfg: BenchServeConfig, channel=None, clients: int | None = None
                    ) -> list[dict]:
    """``channel``: an open channel to reuse, as a long-lived client would (None: one for this call)."""
    import grpc

    from gambit.serving.protos import load

    pb2, g = load("reasoning")
    out: list[dict] = [{} for _ in prompts]
    own = channel is None
    channel = grpc.insecure_channel(address) if own else channel
    stub = g.ReasoningServiceStub(channel)

    def one(i):
        t0 = time.perf_counter()
        req = pb2.SolveRequest(problem=prompts[i], capacity=cfg.capacity, swap=min(2, cfg.capacity),
                               round_interval=cfg.round_interval, max_tokens=cfg.max_tokens, seed=i)
        res = list(stub.Solve(req, metadata=(("application", "gambit"),), timeout=600))[-1].result
        out[i] = {"latency": time.perf_counter() - t0, "tokens": res.generated_tokens,
                  "sync": res.timings.scorer_s, "total": res.timings.total_s, "answer": res.answer}

    _threads(one, len(prompts), clients)
    if own:
        channel.close()
    return out


def _threads(fn, n: int, clients: int | None = None) -> None:
    """``fn(0..n-1)`` from ``clients`` threads (default n), each calling its share back to back: a closed
    loop that keeps ``clients`` runs in flight until the last share starts."""
    clients = min(n, clients or n)

    def client(c: int) -> None:
        for i in range(c, n, clients):
            fn(i)

    ts = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


class EngineBaseline:
    """Decode tokens/s of the bare engine at batch n·C (EOS ignored), measured between the service
    repetitions so that it sees the same machine load as they do. Its engine runs on the embedded
    Target's engine thread (``TargetService.call``), like every engine of that wiring: a second
    thread with OpenMP work would slow both (``gambit.engine.torch_threads``)."""

    def __init__(self, cfg: BenchServeConfig, target) -> None:
        from gambit.engine import Engine, EngineConfig, SamplingParams
        from gambit.engine.torch_threads import on_fresh_thread
        from gambit.paths import TARGET

        self.cfg, self.sp, self.target = cfg, SamplingParams, target
        model = cfg.model or str(TARGET)
        ecfg = EngineConfig(model=model, batch_invariant=cfg.batch_invariant)  # the Targets' arithmetic
        self.eng = on_fresh_thread(lambda: Engine.from_pretrained(model, ecfg))
        self.prompt = problems(1)[0]
        self.rates: dict[int, list[float]] = {n: [] for n in cfg.levels}
        warm = self.sp(max_tokens=8, ignore_eos=True)
        target.call(lambda: self.eng.generate([self.prompt] * cfg.capacity, warm)).result()

    def measure(self, n: int) -> None:
        b = n * self.cfg.capacity
        sp = [self.sp(temperature=0.8, max_tokens=self.cfg.max_tokens, ignore_eos=True, seed=i)
              for i in range(b)]

        def timed() -> float:
            t0 = time.perf_counter()
            self.eng.generate([self.prompt] * b, sp)
            return time.perf_counter() - t0

        self.rates[n].append(b * self.cfg.max_tokens / self.target.call(timed).result())

    def speedup(self) -> dict[int, float]:
        """Median rate at each batch relative to batch C."""
        rate = {n: statistics.median(r) for n, r in self.rates.items()}
        first = self.cfg.levels[0]
        return {n: rate[n] / rate[first] for n in self.cfg.levels}


def pct(xs, q: float) -> float:
    """The ``q`` quantile of ``xs``, interpolated between the two nearest ranks (numpy's default): at 0.5
    the median, of an even count the mean of the middle two. The nearest rank, rounded half to even,
    once gave p50 the lower of two values but the upper middle of four."""
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
