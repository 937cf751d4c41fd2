"""The generic placement plugins (owner: placement; pure): filters on readiness,
the caller's subset and shedding; the sample of K; and load scorers. Program
stickiness is not a plugin: the gateway's and the picker's
:class:`~jitserve.gateway.routing.Router` owns it, for every placer, before any runs.
GMAX's own scorers are in :mod:`jitserve.placement.power_of_k`.
"""

from __future__ import annotations

import math
import random

from jitserve.placement.base import Ask, Refusal, ReplicaReport
from jitserve.placement.simple import SentSinceReport


class Ready:
    """Ready replicas; none: 503. How old a report may be is not the placer's to judge:
    its caller hands it the replicas it may place on (the gateway's and the picker's
    :class:`~jitserve.gateway.fleet.Fleet`, the one owner of freshness: its own clock,
    ``--report-max-age`` and the panic rule; the simulator: the last period's reports).
    A second rule here, on the sidecar's clock against the caller's and with its own
    fixed age, refused what the fleet kept (a busy gateway's reports past 1 s: 503s
    while ``/ready`` listed replicas; the simulator's past 1 s with a longer period)."""

    name = "ready"
    hard = True

    def filter(
        self, ask: Ask, reports: list[ReplicaReport], now_s: float, sent: SentSinceReport
    ) -> list[ReplicaReport]:
        return [r for r in reports if r.ready]

    def refuse(self, ask: Ask, reports: list[ReplicaReport]) -> Refusal | None:
        return Refusal(503, "no replica is ready", retry_after_s=1.0)


class Allowed:
    """Only the replicas the caller allows (``Ask.allowed``: an endpoint picker's subset
    hint); none of them among the candidates: 503."""

    name = "allowed"
    hard = True

    def filter(
        self, ask: Ask, reports: list[ReplicaReport], now_s: float, sent: SentSinceReport
    ) -> list[ReplicaReport]:
        if ask.allowed is None:
            return reports
        return [r for r in reports if r.replica in ask.allowed]

    def refuse(self, ask: Ask, reports: list[ReplicaReport]) -> Refusal | None:
        return Refusal(503, "none of the allowed replicas is ready", retry_after_s=1.0)


class NotShedding:
    """Replicas that would take new work now; every one shedding: 429 with a Retry-After
    of the shortest time one of them needs to drain its queue below the limit."""

    name = "not-shedding"
    hard = True

    def filter(
        self, ask: Ask, reports: list[ReplicaReport], now_s: float, sent: SentSinceReport
    ) -> list[ReplicaReport]:
        return [r for r in reports if not r.shedding]

    def refuse(self, ask: Ask, reports: list[ReplicaReport]) -> Refusal | None:
        return Refusal(429, "every replica would shed", retry_after_s=retry_after(reports))


def retry_after(reports: list[ReplicaReport]) -> float:
    """Whole seconds (>= 1) until the least busy replica has freed one batch slot's worth
    of its queue: its outstanding tokens over its measured throughput, per request."""
    best = math.inf
    for r in reports:
        if r.tokens_per_s > 0 and r.outstanding_requests > 0:
            per_request = r.outstanding_tokens / r.outstanding_requests / r.tokens_per_s
            best = min(best, per_request * max(r.waiting, 1) / max(r.max_running, 1))
    return float(min(max(math.ceil(best), 1), 60)) if math.isfinite(best) else 1.0


class SampleK:
    """K candidates at random (power-of-K's sample; all of them when K >= their number
    or K is None)."""

    name = "sample-k"
    hard = False

    def __init__(self, k: int | None = None, seed: int = 0) -> None:
        if k is not None and k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.k = k
        self._random = random.Random(seed)

    def filter(
        self, ask: Ask, reports: list[ReplicaReport], now_s: float, sent: SentSinceReport
    ) -> list[ReplicaReport]:
        if self.k is None or self.k >= len(reports):
            return reports
        return self._random.sample(reports, self.k)

    def refuse(self, ask: Ask, reports: list[ReplicaReport]) -> Refusal | None:
        return None


def spread(values: list[float]) -> list[float]:
    """Lower is better -> [0, 1]: 1 at the minimum, 0 at the maximum, all 1 when equal."""
    low, high = min(values), max(values)
    if high <= low:
        return [1.0] * len(values)
    return [(high - v) / (high - low) for v in values]


class LeastTokens:
    """Fewest outstanding tokens, counting those sent since the report."""

    name = "least-tokens"

    def score(
        self, ask: Ask, reports: list[ReplicaReport], now_s: float, sent: SentSinceReport
    ) -> list[float]:
        return spread(
            [float(r.outstanding_tokens + sent.tokens.get(r.replica, 0)) for r in reports]
        )


class LeastTime:
    """Least time to finish the outstanding work (tokens, counting those sent since the
    report, times the replica's decode step over its batch slots): least-tokens for
    replicas of different speeds."""

    name = "least-time"

    def score(
        self, ask: Ask, reports: list[ReplicaReport], now_s: float, sent: SentSinceReport
    ) -> list[float]:
        return spread([
            (r.outstanding_tokens + sent.tokens.get(r.replica, 0) + ask.prompt_tokens
             + ask.typical_output) * r.decode_s / max(r.max_running, 1)
            for r in reports
        ])  # fmt: skip


class FewestRequests:
    """Fewest outstanding requests per batch slot, counting those sent since the report."""

    name = "fewest-requests"

    def score(
        self, ask: Ask, reports: list[ReplicaReport], now_s: float, sent: SentSinceReport
    ) -> list[float]:
        return spread([
            (r.outstanding_requests + sent.requests.get(r.replica, 0)) / max(r.max_running, 1)
            for r in reports
        ])
