"""The CONTRACTS §6 metrics through ``ray.serve.metrics`` (exported by Ray as ``ray_<name>``)."""

from __future__ import annotations

from gambit.serving.metrics import Metrics, Spec


class RayBackend:
    def __init__(self) -> None:
        from ray.serve import metrics

        self.m = metrics

    def make(self, s: Spec):
        if s.kind == "counter":
            return self.m.Counter(s.name, description=s.help, tag_keys=s.labels)
        if s.kind == "gauge":
            return self.m.Gauge(s.name, description=s.help, tag_keys=s.labels)
        return self.m.Histogram(s.name, description=s.help, boundaries=list(s.buckets), tag_keys=s.labels)

    def inc(self, m, value, labels):
        m.inc(value, tags=labels or None)

    def set(self, m, value, labels):
        m.set(value, tags=labels or None)

    def observe(self, m, value, labels):
        m.observe(value, tags=labels or None)


def ray_metrics(names: tuple[str, ...] | None = None) -> Metrics:
    return Metrics(RayBackend(), names)
