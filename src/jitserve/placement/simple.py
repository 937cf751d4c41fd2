"""The placements users run today, for comparison (vllm-router's policies): round-robin,
least outstanding tokens, and power-of-two choices by outstanding requests.

Each keeps, between reports, a count of what it sent to every replica
(:class:`SentSinceReport`), so two requests arriving within one report period do not
both see the same stale figure.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

from jitserve.placement.base import Ask, Pick, Refusal, ReplicaReport


class SentSinceReport:
    """Requests and tokens sent to each replica since its last report."""

    def __init__(self) -> None:
        self.requests: dict[str, int] = {}
        self.tokens: dict[str, int] = {}
        self.prompts: dict[str, int] = {}
        """Prompt tokens sent (still to prefill, as far as the last report knows)."""

    def placed(self, ask: Ask, replica: str) -> None:
        self.requests[replica] = self.requests.get(replica, 0) + 1
        self.tokens[replica] = (
            self.tokens.get(replica, 0) + ask.prompt_tokens + ask.typical_output
        )
        self.prompts[replica] = self.prompts.get(replica, 0) + ask.prompt_tokens

    def reported(self, report: ReplicaReport) -> None:
        self.requests.pop(report.replica, None)
        self.tokens.pop(report.replica, None)
        self.prompts.pop(report.replica, None)


def no_replica() -> Refusal:
    return Refusal(503, "no replica is ready", retry_after_s=1.0)


def ordered(best_first: Sequence[ReplicaReport]) -> Pick:
    return Pick(best_first[0].replica, tuple(r.replica for r in best_first[1:]))


class RoundRobin(SentSinceReport):
    name = "round-robin"

    def __init__(self) -> None:
        super().__init__()
        self._turn = itertools.count()

    def place(self, ask: Ask, reports: Sequence[ReplicaReport], now_s: float) -> Pick | Refusal:
        if not reports:
            return no_replica()
        start = next(self._turn) % len(reports)
        return ordered([*reports[start:], *reports[:start]])


class LeastLoaded(SentSinceReport):
    """The fewest outstanding tokens (prompt left plus predicted output left)."""

    name = "least-loaded"

    def place(self, ask: Ask, reports: Sequence[ReplicaReport], now_s: float) -> Pick | Refusal:
        if not reports:
            return no_replica()
        return ordered(sorted(
            reports, key=lambda r: r.outstanding_tokens + self.tokens.get(r.replica, 0)
        ))


class PowerOfTwo(SentSinceReport):
    """Two replicas at random, the one with fewer outstanding requests (vllm-router's
    ``power_of_two``)."""

    name = "power-of-two"

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self._random = random.Random(seed)

    def place(self, ask: Ask, reports: Sequence[ReplicaReport], now_s: float) -> Pick | Refusal:
        if not reports:
            return no_replica()
        two = self._random.sample(list(reports), min(2, len(reports)))
        best = sorted(
            two, key=lambda r: r.outstanding_requests + self.requests.get(r.replica, 0)
        )
        rest = [r for r in reports if r not in best]
        return ordered([*best, *rest])
