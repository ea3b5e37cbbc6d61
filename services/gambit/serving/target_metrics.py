"""A Target replica's Prometheus series: the engine's token counters (as increments since the last
export) and the gauges of its runs, batch slots and KV. ``TargetService`` says when (``METRICS_EVERY_S``:
every step cost ~0.2 ms of the engine thread under Ray's metrics API)."""

from __future__ import annotations

# EngineStats.spec_by_decoding's [drafts, draft tokens, accepted], exported with a decoding label
SPEC_BY_DECODING = ("gambit_spec_decode_num_drafts_total", "gambit_spec_decode_num_draft_tokens_total",
                    "gambit_spec_decode_num_accepted_tokens_total")


class TargetMetrics:
    """Exports of one engine's work. Each call is given the service's ``metrics`` as they are then
    (``gambit.serving.metrics.Metrics``; None: nothing; a tool may swap them: ``tools/serve_parts_ab``)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self._last: dict[str, int] = {}  # the counters' values at the last export

    def counters(self, metrics) -> None:
        if metrics is None:
            return
        s, last = self.engine.stats, self._last
        now = {"gambit_generation_tokens_total": s.generated_tokens,
               "gambit_prompt_tokens_total": s.prompt_tokens,
               "gambit_prompt_tokens_shared_total": s.shared_prompt_tokens}
        now["gambit_spec_decode_capped_steps_total"] = s.spec_capped_steps
        for k, v in now.items():
            metrics.inc(k, v - last.get(k, 0))
        for label, counts in list(s.spec_by_decoding.items()):  # tau per decoding method
            for name, v in zip(SPEC_BY_DECODING, tuple(counts), strict=True):
                key = f"{name}|{label}"
                now[key] = v
                metrics.inc(name, v - last.get(key, 0), decoding=label)
        self._last = now

    def gauges(self, m, running: int, slots: dict, traces: tuple) -> None:
        """``running``: the runs admitted; ``slots``: ``TargetService.batch_slots()``; ``traces``:
        ``DriverAdapter.gauges()`` (active, ghost, ...)."""
        if m is None:
            return
        m.set("gambit_num_requests_running", running)
        m.set("gambit_num_requests_held", slots["held"])
        m.set("gambit_batch_slots_used", slots["slots_used"])
        m.set("gambit_batch_slots_total", slots["max_num_seqs"])
        m.set("gambit_kv_cache_usage_perc", self.engine.kv_usage())
        active, ghost, _ = traces
        m.set("gambit_traces_active", active)
        m.set("gambit_traces_ghost", ghost)
        m.set("gambit_traces_resident", len(self.engine.traces))
