"""The placement interface: plain data in (an :class:`Ask`, :class:`ReplicaReport` s),
plain data out (a :class:`Pick` or a :class:`Refusal`), and the :class:`Placer`
protocol every placement policy implements.

A replica report is what one sidecar publishes on its admin port (``GET /v1/replica``)
and what the simulator builds from an engine's state: the same fields, so the same
placement code runs on both. Reports are at most ``max_age_s`` old when a gateway places
from them; between reports a placer keeps its own count of what it sent
(:meth:`Placer.placed`), as a stateless gateway replica can.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from jitserve.slo import SLO, SLOKind


@dataclass(frozen=True, slots=True)
class ReplicaReport:
    """What one replica says about itself (one sidecar's ``GET /v1/replica``)."""

    replica: str
    """Its address as the gateway reaches it (``host:port`` of the sidecar's API port)."""
    ready: bool
    """vLLM answers and the policy is loaded (the sidecar's ``/ready``)."""
    at_s: float
    """Wall-clock time (Unix seconds) the figures were read."""
    max_running: int
    """Batch slots B (vLLM's ``--max-num-seqs``)."""
    running: int
    """Requests in the batch now."""
    waiting: int
    """Requests queued in the sidecar."""
    waiting_by_kind: Mapping[SLOKind, int] = field(default_factory=dict)
    """The queue by SLO kind."""
    admit_priority: float = 0.0
    """The marginal priority: the lowest GMAX priority the replica would start now
    (p x the B-th best live priority while slots bind; 0 with a free slot)."""
    decode_s: float = 0.03
    """Measured time of one decode step at the current load (v_token)."""
    prefill_s: float = 1e-4
    """Measured wall time per queued prompt token."""
    tokens_per_s: float = 0.0
    """Measured output tokens per second over the last seconds."""
    kv_usage: float = 0.0
    """vLLM's KV-cache usage, 0..1."""
    outstanding_tokens: int = 0
    """Prompt tokens still to prefill plus predicted output tokens still to generate,
    over every live request."""
    programs: frozenset[str] = frozenset()
    """Keys (:func:`program_key`) of the compound programs whose book this replica holds."""
    shedding: bool = False
    """The replica would refuse new work now (its queue is at the waiting limit)."""
    token_s: float = 1e-4
    """Measured engine seconds per batched token (GMAX's marginal cost of one token)."""
    prefill_tokens: int = 0
    """Prompt tokens still to prefill over every live request (queued and running)."""

    @property
    def free_slots(self) -> int:
        return max(self.max_running - self.running, 0)

    @property
    def outstanding_requests(self) -> int:
        return self.running + self.waiting


def program_key(tenant: str, program_id: str) -> str:
    """A program's book is per (tenant, program id), as the sidecar keeps it."""
    return f"{tenant}/{program_id}"


@dataclass(frozen=True, slots=True)
class Ask:
    """What placement knows of one request before it is sent."""

    request_id: str
    tenant: str
    slo: SLO
    prompt_tokens: int
    output_bound: int
    """Upper bound on output tokens (the analyzer's q-quantile, or ``max_tokens``)."""
    typical_output: int
    """Expected output tokens (the estimator's mean)."""
    arrival_s: float
    program: str | None = None
    """:func:`program_key` of its compound program, if it is one's call."""
    allowed: frozenset[str] | None = None
    """The replicas the caller allows (an endpoint picker's subset hint); None: any."""

    @property
    def kind(self) -> SLOKind:
        return self.slo.kind


@dataclass(frozen=True, slots=True)
class Pick:
    """Send the request to ``replica``; if it fails before its first byte, to
    ``fallbacks`` in order."""

    replica: str
    fallbacks: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Refusal:
    """No replica takes it: 503 (none ready) or 429 (every one would shed)."""

    status: int
    reason: str
    retry_after_s: float = 1.0


class Placer(Protocol):
    """A placement policy (one per gateway replica, simulator cluster or picker)."""

    name: str

    def place(
        self, ask: Ask, reports: Sequence[ReplicaReport], now_s: float
    ) -> Pick | Refusal:
        """Choose among ``reports`` (the eligible replicas, possibly stale)."""
        ...

    def placed(self, ask: Ask, replica: str) -> None:
        """``ask`` was sent to ``replica``: count it until the next report shows it."""
        ...

    def reported(self, report: ReplicaReport) -> None:
        """A fresh report from ``report.replica`` arrived (drop what it now shows)."""
        ...
