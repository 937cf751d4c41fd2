"""What one simulated replica did: counters the bench reports (owner: sim)."""

from __future__ import annotations

from dataclasses import dataclass, field

from jitserve.goodput import LogHistogram


@dataclass
class EngineStats:
    iterations: int = 0
    decode_steps: int = 0
    preemptions: int = 0
    kv_preemptions: int = 0
    retired: int = 0
    output_tokens: int = 0
    prefill_tokens: int = 0
    frames: int = 0
    frame_seconds: LogHistogram = field(default_factory=LogHistogram)
    busy_s: float = 0.0
    budget_cuts: int = 0
    """Iterations the budget rule ran below the engine's maximum token budget."""
    constructed: int = 0
    """Iterations the BatchConstructor ran a prefill subset instead of the full batch."""

    def merge(self, other: EngineStats) -> None:
        for name in (
            "iterations",
            "decode_steps",
            "preemptions",
            "kv_preemptions",
            "retired",
            "output_tokens",
            "prefill_tokens",
            "frames",
            "busy_s",
            "budget_cuts",
            "constructed",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.frame_seconds.merge(other.frame_seconds)
