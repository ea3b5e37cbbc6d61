"""Native inference engine: paged KV with fork, continuous batching, hidden-state taps."""

from gambit.engine.config import EngineConfig
from gambit.engine.engine import Engine
from gambit.engine.events import BoundaryEvent, Event, EvictedEvent, FinishedEvent, TokenEvent
from gambit.engine.sequence import SamplingParams, Trace, TraceStatus

__all__ = ["BoundaryEvent", "Engine", "EngineConfig", "Event", "EvictedEvent", "FinishedEvent",
           "SamplingParams", "TokenEvent", "Trace", "TraceStatus"]
