"""What a pool autoscaler sees each period, and what it answers (plain data).

The simulator builds :class:`PoolSignals` from its replicas; the operator will build them
from the sidecars' metrics. :class:`Scaler` is what every sizing rule implements:
jitserve's planner, the llm-d KEDA rule, a static count.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from jitserve.slo import SLOKind


@dataclass(frozen=True, slots=True)
class PoolSignals:
    at_s: float
    period_s: float
    """Seconds since the previous signals (what ``arrived`` and ``finished`` count over)."""
    ready: int
    """Replicas serving (warm, not draining)."""
    warming: int
    """Replicas created and not yet serving."""
    arrived: int
    """Work items (requests and programs) that arrived in the period."""
    finished: Mapping[SLOKind, int] = field(default_factory=dict)
    """Work items that ended in the period, by kind (retired ones included)."""
    met: Mapping[SLOKind, int] = field(default_factory=dict)
    """Of those, the ones that met their SLO."""
    queued: int = 0
    """Work items waiting on the ready replicas now."""
    p90_ttft_s: float | None = None
    """P90 time to first token of the latency requests finished over the last minute (None:
    none)."""
    p90_tpot_s: float | None = None
    """P90 time per output token of the same requests."""

    @property
    def provisioned(self) -> int:
        return self.ready + self.warming


@dataclass(frozen=True, slots=True)
class Decision:
    desired: int
    """Replicas wanted (ready + warming); the pool adds or drains the difference."""
    reason: str


class Scaler(Protocol):
    name: str
    period_s: float
    """Seconds between decisions."""

    def decide(self, signals: PoolSignals) -> Decision:
        """The replica count for ``signals`` (called once per period, in time order)."""
        ...


class Static:
    """A fixed deployment."""

    def __init__(self, replicas: int, name: str = "static", period_s: float = 15.0) -> None:
        self.replicas = replicas
        self.name = name
        self.period_s = period_s

    def decide(self, signals: PoolSignals) -> Decision:
        return Decision(self.replicas, "static")
