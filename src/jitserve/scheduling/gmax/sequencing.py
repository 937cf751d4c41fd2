"""GMAX's sequencer (paper section 4.2; seed 003 on urgency under overload): the order
in which the group's waiting members start, by latest start (or by priority with
``mechanisms.latestStartSequencing`` off), blended with f > 0 with the tenants'
fair-share order (urgency is a claim on your own share: positions in each order weighted
``1 - f`` and ``f``, the blend's scale kept between frames for arrivals); the members
that would start too late leave the group (:func:`admit_feasible`). It writes the
waiting requests' queue keys (members by start order, everyone else after them by
priority) and names the members as what the policy keeps (``frame.keep``). With f > 0 it
keeps the waiting requests of the tenants below their share that can still earn, too: the
fair order plans to serve them, and overload control's max-wait rule retiring a compound
call outside the group ended its whole program (issue 27: at f = 1 and load 1.5 the small
tenants lost 5-6% of their programs so, docs/scheduling.md).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import Counter

import numpy as np
import numpy.typing as npt

from jitserve.policy import SLOPolicySpec
from jitserve.scheduling.frame import Frame
from jitserve.scheduling.gmax.scoring import FairShare
from jitserve.scheduling.scores import Scores

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]
VALUE_BUCKETS = 8
"""Values within a factor e^(1/8) (~13%) count as equal when choosing whom to displace;
among equals the member with more work goes (more requests then meet their SLO)."""
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
        first, chosen, priority = frame.first_waiting, frame.chosen, frame.priority
        keys = self._blend(frame, self.order(frame.scores, priority))
        self.frontier = admit_feasible(frame, keys) if self.by_latest_start else -math.inf
        queue = frame.queue
        queue.set_keys(group_key(priority, keys, chosen)[first:])
        frame.keep.update(queue.rows[i] for i in np.flatnonzero(chosen[first:]).tolist())
        if self.fair.f > 0:
            owed = self.fair.below_share(frame.live.tenant[first:]) & ~frame.hopeless[first:]
            frame.keep.update(queue.rows[i] for i in np.flatnonzero(owed).tolist())

    def admits(self, priority: float, latest_start_s: float, now_s: float) -> bool:
        """Would an arrival with ``priority`` and this latest start join the group now:
        worth more than what the last frame displaced, and not too late to start?"""
        late = self.by_latest_start and latest_start_s < now_s
        return priority > self.frontier and not late

    def order(self, scores: Scores, priority: FloatArray) -> FloatArray:
        """Each request's own start order value, lower first."""
        return scores.latest_start if self.by_latest_start else -priority

    def _blend(self, frame: Frame, base: FloatArray) -> FloatArray:
        """The members' start keys with the tenants' fair-share order blended in."""
        if self.fair.f <= 0 or frame.live is None:
            return base
        first, chosen, hopeless = frame.first_waiting, frame.chosen, frame.hopeless
        tenant, claims = frame.live.tenant, self.fair.claims
        members = np.flatnonzero(chosen[first:]) + first
        self._bases = sorted(base[members].tolist())
        counts = Counter(tenant[members].tolist())  # in order of first appearance
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


def admit_feasible(frame: Frame, start_key: FloatArray) -> float:
    """Drop from ``chosen`` the waiting members that cannot meet their SLO in the start
    order ``start_key`` (seed 003: urgency must not cascade; overload is detected, then
    the scheduler turns value-based).

    Walking the waiting members in start order, member k is feasible when (1) the
    prompts queued ahead of it (running prefills first) are done by its latest start,
    and (2) the engine time of everything ahead of it plus its own is done by its due
    time (running requests count what they can decode by then, one token per step).
    When k is not, accepted members ahead of it with less value per unit of engine time
    (then: more work) are displaced while that makes k feasible (weighted
    Moore-Hodgson); otherwise k leaves the group. O(N log N).

    Returns the highest value among the displaced members (-inf if none): under overload,
    an arrival worth no more than that would be displaced too. Value is the frame's
    priority; ``chosen`` is the frame's group."""
    assert frame.live is not None and frame.scores is not None and frame.speeds is not None
    prefill_left, n_running, value = frame.live.prefill_left, frame.first_waiting, frame.priority
    scores, chosen, now_s = frame.scores, frame.chosen, frame.now_s
    latest_start, work_s, due_s = scores.latest_start, scores.work_s, scores.due_s
    prefill_s, decode_s = frame.speeds.prefill_s, frame.speeds.decode_s
    token_s = frame.speeds.token_s
    running_work = np.sort(work_s[:n_running])
    running_prefix = np.concatenate([[0.0], np.cumsum(running_work)])
    # a running request decodes one token per step: by time h it takes at most
    # h / decode_s tokens of engine time, i.e. rate x h seconds of it
    rate = token_s / max(decode_s, 1e-9)

    def running_by(h: float) -> float:
        if not math.isfinite(h):
            return float(running_prefix[-1])
        cap = rate * max(h, 0.0)
        i = int(np.searchsorted(running_work, cap))
        return float(running_prefix[i] + cap * (n_running - i))

    def rank(j: int) -> tuple[float, float]:
        return (math.floor(math.log(max(float(value[j]), 1e-30)) * VALUE_BUCKETS), -work_s[j])

    def size(j: int) -> float:
        return float(prefill_left[j]) * prefill_s

    # The members up to the first one that is late need no displacement: walk them in
    # arrays (the same sums in the same order as the loop below), the rest one by one.
    order = np.flatnonzero(chosen[n_running:]) + n_running
    order = order[np.argsort(start_key[order], kind="stable")]
    sizes = prefill_left[order] * prefill_s
    works = work_s[order]
    backlog0 = float(prefill_left[:n_running].sum()) * prefill_s
    backlog_at = np.cumsum(np.concatenate([[backlog0], sizes]))
    queued_at = np.cumsum(np.concatenate([[0.0], works]))
    due = due_s[order]
    horizon = due - now_s
    cap = rate * np.maximum(horizon, 0.0)
    at = np.searchsorted(running_work, cap)
    with np.errstate(invalid="ignore"):
        by = np.where(
            np.isfinite(horizon), running_prefix[at] + cap * (n_running - at), running_prefix[-1]
        )
    late = (now_s + backlog_at[:-1] - latest_start[order] > 0) | (
        now_s + by + queued_at[:-1] + works - due > 0
    )
    bad = np.flatnonzero(late)
    if bad.size == 0:
        return -math.inf
    k = int(bad[0])
    ahead = order[:k].tolist()
    accepted: list[tuple[float, float, int]] = [(*rank(j), j) for j in ahead]
    heapq.heapify(accepted)  # min-heap: least value, then most work
    backlog = float(backlog_at[k])
    queued_work = float(queued_at[k])
    frontier = -math.inf
    members = order[k:].tolist()

    for i in members:
        late_start = now_s + backlog - latest_start[i]
        late_finish = (
            now_s + running_by(due_s[i] - now_s) + queued_work + work_s[i] - due_s[i]
        )
        evicted: list[tuple[float, float, int]] = []
        mine = rank(i)
        while (late_start > 0 or late_finish > 0) and accepted and accepted[0][:2] < mine:
            entry = heapq.heappop(accepted)
            j = entry[2]
            evicted.append(entry)
            late_start -= size(j)
            backlog -= size(j)
            late_finish -= work_s[j]
            queued_work -= work_s[j]
        if late_start > 0 or late_finish > 0:  # cannot be made feasible: undo, drop i
            for entry in evicted:
                heapq.heappush(accepted, entry)
                backlog += size(entry[2])
                queued_work += work_s[entry[2]]
            chosen[i] = False
            continue
        for entry in evicted:
            chosen[entry[2]] = False
            frontier = max(frontier, float(value[entry[2]]))
        heapq.heappush(accepted, (*mine, i))
        backlog += size(i)
        queued_work += work_s[i]
    return frontier

