"""The metric names of CONTRACTS §6 behind one small facade, with two back-ends.

``prometheus``: prometheus-client in its own registry (embedded wiring, the Scorer's own server).
Under Ray Serve, ``gambit.deployments.ray_metrics.RayBackend`` builds the same names with
``ray.serve.metrics`` (exported as ``ray_<name>``). Labels are bounded: method, decoding, code,
reason, rpc — never run ids.
"""

from __future__ import annotations

from dataclasses import dataclass

# up to 20 minutes: the 120 s alert's threshold must lie below the top bucket (histogram_quantile never
# reads above it, so at 120 the alert could not fire), and runs of 10-60 s get buckets of their own
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0,
                   90.0, 120.0, 180.0, 300.0, 600.0, 1200.0)
# past 1 s: a Score call's latency counts its wait in the Scorer's queue, and a Target gives up at 2 s
SCORER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5, 5.0)
# up to ScorerServerConfig.max_rows (4096 rows in one request): a full request had only +Inf
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


@dataclass(frozen=True)
class Spec:
    name: str
    kind: str  # counter | gauge | histogram
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()


SPECS = [
    Spec("gambit_traces_started_total", "counter", "Traces started (including branches)"),
    Spec("gambit_traces_finished_total", "counter", "Traces ended, by reason", ("reason",)),
    Spec("gambit_generation_tokens_total", "counter", "Tokens generated"),
    Spec("gambit_prompt_tokens_total", "counter", "Prompt tokens prefilled"),
    Spec("gambit_prompt_tokens_shared_total", "counter",
         "Prompt tokens not prefilled: KV taken from another trace's prefill of the same prompt"),
    Spec("gambit_kv_cache_usage_perc", "gauge", "KV blocks used / total, 0..1"),
    Spec("gambit_num_requests_running", "gauge", "Runs in flight (held ones included)"),
    Spec("gambit_num_requests_waiting", "gauge", "Runs queued"),
    Spec("gambit_num_requests_held", "gauge",
         "Runs a Target admitted and holds until their C fits its engine batch (queued for batch slots)"),
    Spec("gambit_batch_slots_used", "gauge",
         "Engine batch slots held by the launched runs' pools (min(C, max_num_seqs) each)"),
    Spec("gambit_batch_slots_total", "gauge", "Engine batch slots (max_num_seqs)"),
    Spec("gambit_traces_active", "gauge", "Traces active in the tree view"),
    Spec("gambit_traces_ghost", "gauge", "Ghost traces (evicted, still counted toward C)"),
    Spec("gambit_traces_resident", "gauge", "Traces holding KV in the engine (scheduler view)"),
    Spec("gambit_rounds_total", "counter", "Search rounds", ("method",)),
    Spec("gambit_prunes_total", "counter", "Traces pruned", ("method",)),
    Spec("gambit_branches_total", "counter", "Traces branched", ("method",)),
    Spec("gambit_evictions_total", "counter", "Traces evicted by the engine under KV pressure"),
    Spec("gambit_spec_decode_num_drafts_total", "counter", "Speculative verification forwards, by decoding",
         ("decoding",)),
    Spec("gambit_spec_decode_num_draft_tokens_total", "counter", "Drafted tokens verified, by decoding",
         ("decoding",)),
    Spec("gambit_spec_decode_num_accepted_tokens_total", "counter", "Accepted draft tokens, by decoding",
         ("decoding",)),
    Spec("gambit_spec_decode_capped_steps_total", "counter",
         "Steps whose speculative traces decoded plainly (batch above spec.max_batch)"),
    Spec("gambit_scorer_latency_seconds", "histogram",
         "One Score call in the Scorer: its wait in queue and micro-batch, then the forward", (),
         SCORER_BUCKETS),
    Spec("gambit_scorer_batch_size", "histogram", "States (rows) per Score call", (), BATCH_BUCKETS),
    Spec("gambit_guidance_sync_seconds", "histogram",
         "One Score call as the Target waits for it: states to the scorer and back", (), SCORER_BUCKETS),
    Spec("gambit_scorer_fallback_total", "counter",
         "Score calls answered by the fallback (scorer unreachable)"),
    Spec("gambit_scorer_bad_rows_total", "counter",
         "Rows left out of Score calls for non-finite or out-of-range values, each scored its trace's "
         "running mean"),
    Spec("gambit_scorer_evictions_total", "counter",
         "Trace histories a sequence scorer forgot, least recently used, beyond its max_keys"),
    Spec("gambit_time_to_first_token_seconds", "histogram", "Request to first stream event", ("method",),
         LATENCY_BUCKETS),
    Spec("gambit_e2e_request_latency_seconds", "histogram", "Request to result", ("method",),
         LATENCY_BUCKETS),
    Spec("gambit_request_errors_total", "counter",
         "RPCs ended with a non-OK status (INTERNAL: also a failed run), by code and RPC", ("code", "rpc")),
]
BY_NAME = {s.name: s for s in SPECS}


class Metrics:
    """``inc``/``set``/``observe`` by name; ``backend(spec)`` makes one metric object."""

    def __init__(self, backend=None, names: tuple[str, ...] | None = None) -> None:
        self.backend = backend if backend is not None else PrometheusBackend()
        self._m = {s.name: self.backend.make(s) for s in SPECS if names is None or s.name in names}

    def inc(self, name: str, value: float = 1.0, **labels) -> None:
        m = self._m.get(name)
        if m is not None and value:
            self.backend.inc(m, value, labels)

    def set(self, name: str, value: float, **labels) -> None:
        m = self._m.get(name)
        if m is not None:
            self.backend.set(m, value, labels)

    def observe(self, name: str, value: float, **labels) -> None:
        m = self._m.get(name)
        if m is not None:
            self.backend.observe(m, value, labels)


class PrometheusBackend:
    def __init__(self, registry=None) -> None:
        import prometheus_client as pc

        self.pc = pc
        pc.disable_created_metrics()  # no *_created series next to each counter
        self.registry = registry if registry is not None else pc.CollectorRegistry()

    def make(self, s: Spec):
        pc = self.pc
        if s.kind == "counter":
            return pc.Counter(s.name, s.help, s.labels, registry=self.registry)
        if s.kind == "gauge":
            return pc.Gauge(s.name, s.help, s.labels, registry=self.registry)
        return pc.Histogram(s.name, s.help, s.labels, buckets=s.buckets, registry=self.registry)

    @staticmethod
    def _child(m, labels):
        return m.labels(**labels) if labels else m

    def inc(self, m, value, labels):
        self._child(m, labels).inc(value)

    def set(self, m, value, labels):
        self._child(m, labels).set(value)

    def observe(self, m, value, labels):
        self._child(m, labels).observe(value)

    def exposition(self) -> bytes:
        return self.pc.generate_latest(self.registry)

    def serve_http(self, port: int, addr: str = "127.0.0.1"):
        """Expose ``/metrics`` on its own HTTP port; returns (server, thread)."""
        return self.pc.start_http_server(port, addr=addr, registry=self.registry)
