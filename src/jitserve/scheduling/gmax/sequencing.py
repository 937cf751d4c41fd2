"""GMAX's sequencer: the order in which the group's waiting members start, and which of
them can still start in time (paper section 4.2; seed 003 on urgency under overload).

The start order is by latest start (the start that still earns the full gain), or by
priority with ``mechanisms.latestStartSequencing`` off; with fairness weight ``f > 0`` it
is blended with the tenants' fair-share order (urgency is a claim on your own share),
positions in each order weighted ``1 - f`` and ``f``. With latest-start sequencing, the
members that would start too late leave the group
(:func:`~jitserve.scheduling.gmax.grouping.admit_feasible`). The blend's scale is kept between
frames so that an arrival gets a key on the same scale.

The stage writes the waiting requests' keys into the table (the group's members by start
order, everyone else after them by priority) and names the members as what the policy
plans to start (``frame.keep``).
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict

import numpy as np
import numpy.typing as npt

from jitserve.policy import SLOPolicySpec
from jitserve.scheduling.frame import Frame
from jitserve.scheduling.gmax.grouping import admit_feasible
from jitserve.scheduling.gmax.scoring import FairShare
from jitserve.scheduling.scores import Scores

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]
OUTSIDE_GROUP = 1e13
"""Queue keys: members of the chosen group are keyed by their start order (below
``OUTSIDE_GROUP / 2``); everyone else by ``OUTSIDE_GROUP - priority``, so after them."""


class Sequencer:
    name = "sequence"

    def __init__(self, fair: FairShare) -> None:
        self.fair = fair
        self.by_latest_start = True
        self.frontier = -math.inf
        """Under overload, the most valuable member the last frame displaced: an arrival
        worth no more would be displaced too."""
        self._bases: list[float] = []
        self._tenant_pos: dict[int, float] = {}

    def configure(self, spec: SLOPolicySpec) -> None:
        self.by_latest_start = spec.scheduler.mechanisms.latest_start_sequencing

    def run(self, frame: Frame) -> None:
        if frame.live is None or frame.scores is None or frame.speeds is None:
            return
        first, scores, speeds, live = frame.first_waiting, frame.scores, frame.speeds, frame.live
        chosen, priority = frame.chosen, frame.priority
        keys = self._blend(first, chosen, self.order(scores, priority), frame.hopeless,
                           live.tenant)
        self.frontier = -math.inf
        if self.by_latest_start:
            self.frontier = admit_feasible(
                live.prefill_left, first, priority, keys, scores.latest_start, scores.work_s,
                scores.due_s, chosen, frame.now_s, speeds.prefill_s, speeds.decode_s,
                speeds.token_s,
            )  # fmt: skip
        queue = frame.queue
        queue.set_keys(group_key(priority, keys, chosen)[first:])
        frame.keep.update(queue.rows[i] for i in np.flatnonzero(chosen[first:]).tolist())

    def admits(self, priority: float, latest_start_s: float, now_s: float) -> bool:
        """Would an arrival with ``priority`` and this latest start join the group now:
        worth more than what the last frame displaced, and not too late to start?"""
        return priority > self.frontier and not self.late(latest_start_s, now_s)

    def order(self, scores: Scores, priority: FloatArray) -> FloatArray:
        """Each request's own start order value, lower first."""
        return scores.latest_start if self.by_latest_start else -priority

    def late(self, latest_start_s: float, now_s: float) -> bool:
        """Can an arrival with this latest start no longer start in time?"""
        return self.by_latest_start and latest_start_s < now_s

    def _blend(
        self,
        first: int,
        chosen: BoolArray,
        base: FloatArray,
        hopeless: BoolArray,
        tenant: IntArray,
    ) -> FloatArray:
        if self.fair.f <= 0:
            return base
        claims = self.fair.claims
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
        f = self.fair.f
        if f <= 0:
            return base
        pos = bisect.bisect_left(self._bases, base) / max(len(self._bases), 1)
        tenant_pos = 1.0 if hopeless else self._tenant_pos.get(tenant, 0.0)
        return (1 - f) * pos + f * tenant_pos + 1e-9 * pos


def group_key(priority: FloatArray, start_key: FloatArray, chosen: BoolArray) -> FloatArray:
    """Queue keys: a member by its start order, everyone else after all members."""
    return np.where(chosen, np.minimum(start_key, OUTSIDE_GROUP / 2), OUTSIDE_GROUP - priority)
