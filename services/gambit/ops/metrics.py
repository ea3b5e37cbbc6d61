"""Metric names the dashboards and alerts query (CONTRACTS.md §6), with the exporter's prefix.

Under Ray Serve the services' metrics appear as ``ray_<name>``; the embedded wiring and the Scorer's
own server export the bare names. Everything here takes the prefix as an argument so the same
definitions serve both, and the dashboards expose it as a template variable.
"""

from __future__ import annotations

DEFAULT_PREFIX = "ray_"

COUNTERS = (
    "gambit_traces_started_total",
    "gambit_traces_finished_total",
    "gambit_generation_tokens_total",
    "gambit_prompt_tokens_total",
    "gambit_prompt_tokens_shared_total",
    "gambit_rounds_total",
    "gambit_prunes_total",
    "gambit_branches_total",
    "gambit_evictions_total",
    "gambit_spec_decode_num_drafts_total",
    "gambit_spec_decode_num_draft_tokens_total",
    "gambit_spec_decode_num_accepted_tokens_total",
    "gambit_spec_decode_capped_steps_total",
    "gambit_scorer_fallback_total",
    "gambit_scorer_bad_rows_total",
    "gambit_scorer_evictions_total",
    "gambit_request_errors_total",
)
GAUGES = (
    "gambit_kv_cache_usage_perc",
    "gambit_num_requests_running",
    "gambit_num_requests_waiting",
    "gambit_num_requests_held",
    "gambit_batch_slots_used",
    "gambit_batch_slots_total",
    "gambit_traces_active",
    "gambit_traces_ghost",
    "gambit_traces_resident",
)
HISTOGRAMS = (
    "gambit_scorer_latency_seconds",
    "gambit_scorer_batch_size",
    "gambit_guidance_sync_seconds",
    "gambit_time_to_first_token_seconds",
    "gambit_e2e_request_latency_seconds",
)
ALL = COUNTERS + GAUGES + HISTOGRAMS


def metric(name: str, prefix: str = DEFAULT_PREFIX) -> str:
    """Exported name of a contract metric (``gambit_...``), or ValueError for a name not in the contract."""
    base = name.split("{")[0]
    for h in HISTOGRAMS:
        if base in (h, h + "_bucket", h + "_sum", h + "_count"):
            break
    else:
        if base not in ALL:
            raise ValueError(f"metric {name!r} is not in the metrics contract (CONTRACTS.md §6)")
    return prefix + name
