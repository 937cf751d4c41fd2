"""GMAX's sequencer: the order in which the group's waiting members start, and which of
them can still start in time (paper section 4.2; seed 003 on urgency under overload).

The start order is by latest start (the start that still earns the full gain), or by
priority with ``mechanisms.latestStartSequencing`` off; with fairness weight ``f > 0`` it
is blended with the tenants' fair-share order (urgency is a claim on your own share),
positions in each order weighted ``1 - f`` and ``f``. With latest-start sequencing, the
members that would start too late leave the group
(:func:`~jitserve.scheduling.grouping.admit_feasible`). The blend's scale is kept between
frames so that an arrival gets a key on the same scale.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict

import numpy as np
import numpy.typing as npt

from jitserve.scheduling.grouping import admit_feasible
from jitserve.scheduling.priorities import Scores, Speeds

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]


class Sequencer:
    def __init__(self) -> None:
        self.by_latest_start = True
        self.f = 0.0
        self._bases: list[float] = []
        self._tenant_pos: dict[int, float] = {}

    def configure(self, by_latest_start: bool, fair_weight: float) -> None:
        self.by_latest_start = by_latest_start
        self.f = fair_weight

    def order(self, scores: Scores, priority: FloatArray) -> FloatArray:
        """Each request's own start order value, lower first."""
        return scores.latest_start if self.by_latest_start else -priority

    def late(self, latest_start_s: float, now_s: float) -> bool:
        """Can an arrival with this latest start no longer start in time?"""
        return self.by_latest_start and latest_start_s < now_s

    def sequence(
        self,
        first: int,
        chosen: BoolArray,
        scores: Scores,
        priority: FloatArray,
        tenant: IntArray,
        claims: FloatArray,
        prefill_left: FloatArray,
        now_s: float,
        speeds: Speeds,
    ) -> tuple[FloatArray, float]:
        """(start keys of the live requests, rows ``first..`` waiting; the most valuable
        member displaced as infeasible, -inf if none). Drops from ``chosen`` the
        members that cannot start in time. ``claims``: per tenant code."""
        hopeless = scores.gain <= 0
        base = self.order(scores, priority)
        keys = self._blend(first, chosen, base, hopeless, tenant, claims)
        frontier = -math.inf
        if self.by_latest_start:
            frontier = admit_feasible(
                prefill_left, first, priority, keys, scores.latest_start, scores.work_s,
                scores.due_s, chosen, now_s, speeds.prefill_s, speeds.decode_s, speeds.token_s,
            )  # fmt: skip
        return keys, frontier

    def _blend(
        self,
        first: int,
        chosen: BoolArray,
        base: FloatArray,
        hopeless: BoolArray,
        tenant: IntArray,
        claims: FloatArray,
    ) -> FloatArray:
        if self.f <= 0:
            return base
        members = np.flatnonzero(chosen[first:]) + first
        self._bases = sorted(base[members].tolist())
        counts: dict[int, int] = defaultdict(int)
        for t in tenant[members].tolist():
            counts[t] += 1
        total = max(members.size, 1)
        self._tenant_pos = {}
        ahead = 0
        for t in sorted(counts, key=lambda t: -claims[t] if t < claims.size else -1.0):
            self._tenant_pos[t] = ahead / total
            ahead += counts[t]
        keys = np.array(base, dtype=np.float64)
        for i in members.tolist():
            keys[i] = self.key_of(int(tenant[i]), float(base[i]), bool(hopeless[i]))
        return keys

    def key_of(self, tenant: int, base: float, hopeless: bool = False) -> float:
        """The key of a request whose own start order value is ``base``; one that can earn
        nothing has no claim on its tenant's share and goes after the tenants' turns."""
        if self.f <= 0:
            return base
        pos = bisect.bisect_left(self._bases, base) / max(len(self._bases), 1)
        tenant_pos = 1.0 if hopeless else self._tenant_pos.get(tenant, 0.0)
        return (1 - self.f) * pos + self.f * tenant_pos + 1e-9 * pos
