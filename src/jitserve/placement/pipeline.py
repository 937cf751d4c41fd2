"""Placement in the shape of the Gateway API Inference Extension's endpoint picker:
filters -> weighted scorers -> a picker, each a small plugin chosen by configuration
(owner: placement; pure).

- a :class:`Filter` narrows the candidates; a *hard* filter that leaves none refuses the
  request (its :meth:`Filter.refuse`: 503 when none is ready, 429 when every one would
  shed); a *soft* one that leaves none is skipped (stickiness to a replica that is gone);
- each :class:`Scorer` gives every candidate a score in [0, 1] (higher is better); the
  pipeline sums them with their configured weights;
- the :class:`Picker` orders the candidates by the total: the first is the pick, the
  rest, then the eligible replicas a soft filter set aside, are the fallbacks a gateway
  tries if the pick fails before its first byte.

:class:`Pipeline` is a :class:`~jitserve.placement.base.Placer`; it keeps what it sent
to each replica since that replica's last report (:class:`SentSinceReport`), which the
plugins read, so requests that arrive within one report period see each other.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol

from jitserve.placement.base import Ask, Pick, Refusal, ReplicaReport
from jitserve.placement.simple import SentSinceReport, ordered


class Filter(Protocol):
    name: str
    hard: bool
    """A hard filter decides eligibility (what it removes is never a fallback either);
    a soft one only narrows the choice."""

    def filter(
        self, ask: Ask, reports: list[ReplicaReport], now_s: float, sent: SentSinceReport
    ) -> list[ReplicaReport]:
        """The candidates that pass."""
        ...

    def refuse(self, ask: Ask, reports: list[ReplicaReport]) -> Refusal | None:
        """What to answer when nothing passes (``reports``: what came in); None: a soft
        filter, skipped when it would leave nothing."""
        ...


class Scorer(Protocol):
    name: str

    def score(
        self, ask: Ask, reports: list[ReplicaReport], now_s: float, sent: SentSinceReport
    ) -> list[float]:
        """One score in [0, 1] per candidate, higher is better."""
        ...


class Picker(Protocol):
    name: str

    def pick(self, reports: list[ReplicaReport], totals: list[float]) -> list[int]:
        """Indices of ``reports``, best first."""
        ...


class MaxScore:
    """The highest total first; exact ties in a seeded random order (so equal replicas
    share the work instead of the first in the list taking it all)."""

    name = "max-score"

    def __init__(self, seed: int = 0) -> None:
        self._random = random.Random(seed)

    def pick(self, reports: list[ReplicaReport], totals: list[float]) -> list[int]:
        jitter = [self._random.random() for _ in totals]
        return sorted(range(len(totals)), key=lambda i: (-totals[i], jitter[i]))


class Pipeline(SentSinceReport):
    """A placer made of plugins: ``filters`` in order, then ``scorers`` (weight,
    scorer) summed, then ``picker``."""

    def __init__(
        self,
        name: str,
        filters: Sequence[Filter],
        scorers: Sequence[tuple[float, Scorer]],
        picker: Picker,
    ) -> None:
        super().__init__()
        self.name = name
        self.filters = list(filters)
        self.scorers = list(scorers)
        self.picker = picker

    def place(
        self, ask: Ask, reports: Sequence[ReplicaReport], now_s: float
    ) -> Pick | Refusal:
        candidates = list(reports)
        eligible = candidates
        for f in self.filters:
            kept = f.filter(ask, candidates, now_s, self)
            if kept:
                candidates = kept
                if f.hard:
                    eligible = kept
                continue
            refusal = f.refuse(ask, candidates)
            if refusal is not None:
                return refusal
        totals = [0.0] * len(candidates)
        for weight, scorer in self.scorers:
            if weight == 0:
                continue
            for i, s in enumerate(scorer.score(ask, candidates, now_s, self)):
                totals[i] += weight * s
        order = self.picker.pick(candidates, totals)
        best = [candidates[i] for i in order]
        # the other eligible replicas are fallbacks too, after the scored ones
        return ordered([*best, *(r for r in eligible if r not in best)])

    def describe(self) -> dict[str, object]:
        """The configuration (for logs and the bench's JSON)."""
        return {
            "filters": [f.name for f in self.filters],
            "scorers": {s.name: w for w, s in self.scorers},
            "picker": self.picker.name,
        }
