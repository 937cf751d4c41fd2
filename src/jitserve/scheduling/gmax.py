"""GMAX: Grouped Margin Goodput Maximization (JITServe paper section 4.2), the policy.

GMAX is a pipeline of small stages over the waiting table (the queue, with every waiting
request's features in columns) and the running set; at every frame (DESIGN.md "GMAX
scheduler"):

1. **scorer** (:mod:`~jitserve.scheduling.priorities`): goodput per unit of engine
   time, aged by ``delta`` per frame waited; with fairness weight ``f``,
   ``(1 - f) * priority + f * 2 * median * Fair(tenant)`` (:class:`FairShare`), so the
   blend stays in goodput units (preemption compares it with a token cost) and a tenant
   at its entitlement weighs one median priority;
2. **group filter** (:class:`~jitserve.scheduling.grouping.GroupFilter`, the one owner
   of the cutoff ``p``): the cutoff and the input-length window;
3. **sequencer** (:class:`~jitserve.scheduling.sequencing.Sequencer`): the waiting
   members' start order; members that would start too late leave the group;
4. **preemptor** (:class:`~jitserve.scheduling.preemption.Preemptor`): running requests
   outside the group swapped out when it pays;
5. **pacer** (:class:`~jitserve.scheduling.pacing.PrefillPacer`): between frames, which
   waiting request may start now.

``MechanismSettings`` selects the stages (an ablation leaves one out or swaps it for its
plain form). Overload control (retiring what cannot earn goodput) is the layer GMAX runs
inside, shared with the ``-ac`` baselines (:mod:`~jitserve.scheduling.overload`); it
keeps what :meth:`GMAX.planned` names: the feasible waiting members of the group.

Between frames the queue is ordered by the last computed key; an arrival is scored alone
when it arrives, so admission stays cheap. A frame is array operations over the table
plus Python over the running set and the group (at most B each).
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import numpy.typing as npt

from jitserve.policy import FairnessSettings, SLOPolicySpec
from jitserve.requests import LiveRequest
from jitserve.scheduling.base import EngineView, FramePlan, QueuedPolicy
from jitserve.scheduling.grouping import GroupFilter
from jitserve.scheduling.pacing import PrefillPacer
from jitserve.scheduling.preemption import Preemptor
from jitserve.scheduling.priorities import (
    MIN_TIME_S,
    Speeds,
    fair_claims,
    latency_tokens_reachable,
    normal_quantile,
    score_features,
)
from jitserve.scheduling.sequencing import Sequencer
from jitserve.scheduling.table import Features, TenantCodes, features_of

__all__ = ["GMAX", "latency_tokens_reachable"]

FloatArray = npt.NDArray[np.float64]
OUTSIDE_GROUP = 1e13
"""Queue keys: members of the chosen group are keyed by their start order (below
``OUTSIDE_GROUP / 2``); everyone else by ``OUTSIDE_GROUP - priority``, so after them."""
FAIR_TIE = 0.01
"""Weight of the goodput priority inside the fair-share term (orders a tenant's requests)."""


class FairShare:
    """The scorer's fairness blend: each tenant's claim on its weighted share of the
    (decayed) goodput, scaled by twice the median live priority."""

    def __init__(self) -> None:
        self.f = 0.0
        self.settings = FairnessSettings()
        self.earned: dict[str, float] = defaultdict(float)
        """Goodput tokens each tenant earned, decayed over ``fairness.windowSeconds``."""
        self.claims: FloatArray = np.zeros(0)
        """Per tenant code, from the last frame (1 for a tenant not seen then)."""
        self.scale = 0.0
        self._last_s: float | None = None

    def configure(self, f: float, settings: FairnessSettings) -> None:
        self.f, self.settings = f, settings

    def decay(self, now_s: float) -> None:
        if self._last_s is not None:
            d = math.exp(-(now_s - self._last_s) / self.settings.window_seconds)
            for t in self.earned:
                self.earned[t] *= d
        self._last_s = now_s

    def update(self, tenant: npt.NDArray[np.int64], codes: TenantCodes, median: float) -> None:
        """New claims for the tenants of the live requests (``tenant``: their codes)."""
        if self.f <= 0:
            self.claims = np.zeros(0)
            return
        live = [codes.names[c] for c in np.unique(tenant).tolist()]
        by_name = fair_claims(live, self.earned, self.settings)
        self.claims = np.array([by_name.get(name, 1.0) for name in codes.names])
        self.scale = 2.0 * median

    def claim_of(self, tenant: npt.NDArray[np.int64]) -> FloatArray:
        claims = self.claims
        if claims.size < int(tenant.max(initial=-1)) + 1:
            claims = np.concatenate([claims, np.ones(int(tenant.max()) + 1 - claims.size)])
            self.claims = claims
        return claims[tenant]

    def blend(
        self,
        priority: FloatArray,
        tenant: npt.NDArray[np.int64],
        hopeless: npt.NDArray[np.bool_],
    ) -> FloatArray:
        """Priority with the claims blended in (f > 0). A request that can earn nothing
        gets no claim: fairness shares goodput, and it has none to give."""
        f = self.f
        if f <= 0 or priority.size == 0:
            return priority
        claims = self.claim_of(tenant) * ~hopeless
        return (1 - f) * priority + f * (self.scale * claims + FAIR_TIE * priority)


class GMAX(QueuedPolicy):
    name = "gmax"
    chunked_prefill = True

    def __init__(self, spec: SLOPolicySpec | None = None, seed: int = 0) -> None:
        super().__init__()
        self.speeds = Speeds()
        self.median_priority = 1.0
        self.fair = FairShare()
        self.group = GroupFilter(seed)
        self.sequencer = Sequencer()
        self.pacer: PrefillPacer | None = None
        self.preemptor: Preemptor | None = None
        # what GMAX keeps about requests outside the table (running): priority, frames
        # waited, demotion; waiting requests keep theirs in the table's columns
        self._priority: dict[LiveRequest, float] = {}
        self._waited: dict[LiveRequest, int] = {}
        self._demoted: set[LiveRequest] = set()
        self._planned: set[LiveRequest] = set()
        self._running: set[LiveRequest] = set()
        self.spec = spec or SLOPolicySpec()
        self.configure(self.spec)

    def configure(self, spec: SLOPolicySpec) -> None:
        """Apply (new) settings; used at start and on hot reload. The stages follow
        ``scheduler.mechanisms``."""
        super().configure(spec)
        self.spec = spec
        s = spec.scheduler
        m = s.mechanisms
        self.speeds.z_q = normal_quantile(s.length_quantile)
        self.fair.configure(spec.fairness.weight if m.fairness else 0.0, spec.fairness)
        self.group.configure(s)
        self.sequencer.configure(m.latest_start_sequencing, self.fair.f)
        if not m.prefill_pacing:
            self.pacer = None
        elif self.pacer is None:
            self.pacer = PrefillPacer()
        enabled = m.preemption and s.preemption.enabled
        self.preemptor = Preemptor(s.preemption) if enabled else None

    # ---- queue ------------------------------------------------------------------------
    def enqueue(self, r: LiveRequest, now_s: float) -> None:
        self._running.discard(r)  # preempted requests come back here
        queue = self.queue
        fresh = r not in queue  # else: its bounds were refined while it waited
        queue.push(r, 0.0, now_s)
        row = queue.row_of(r)
        assert row is not None
        if fresh:
            queue.ints("waited")[row] = self._waited.pop(r, 0)
            queue.flags("demoted")[row] = r in self._demoted
            self._demoted.discard(r)
            self._priority.pop(r, None)
        one = _rows(queue.features(), row)
        scores = score_features(one, now_s, self.speeds, self.spec, self.median_priority)
        hopeless = scores.gain <= 0
        p = float(self.fair.blend(scores.priority, one.tenant, hopeless)[0])
        queue.floats("priority")[row] = p
        # joins the group if it would have made the cut and can still start in time
        latest_start = float(scores.latest_start[0])
        in_group = self.group.admits(p) and not self.sequencer.late(latest_start, now_s)
        order = float(self.sequencer.order(scores, np.array([p]))[0])
        key = self.sequencer.key_of(int(one.tenant[0]), order, bool(hopeless[0]))
        queue.floats("key")[row] = _key(p, key, in_group)

    def peek_next(self, now_s: float) -> LiveRequest | None:
        """The queue head; when the pacer holds it back, the first request in queue order
        whose prompt fits what the pacer allows now (None if none does)."""
        queue = self.queue
        head = queue.best_row()
        if head is None or self.pacer is None or not self._running:
            return None if head is None else queue.rows[head]
        prompts = queue.floats("prefill_left")
        budget = self.pacer.budget(now_s, int(prompts[head]))
        if prompts[head] <= budget:
            return queue.rows[head]
        row = queue.best_row(prompts <= budget)
        return None if row is None else queue.rows[row]

    def pop_next(self, now_s: float) -> LiveRequest | None:
        r = self.peek_next(now_s)
        if r is None:
            return None
        row = self.queue.row_of(r)
        assert row is not None
        self._priority[r] = float(self.queue.floats("priority")[row])
        self._waited[r] = int(self.queue.ints("waited")[row])
        if self.queue.flags("demoted")[row]:
            self._demoted.add(r)
        self.queue.remove(r)
        self._running.add(r)
        if self.pacer is not None:
            self.pacer.started(r.prefill_target - r.prefilled)
        return r

    def priority_of(self, r: LiveRequest) -> float:
        row = self.queue.row_of(r)
        if row is not None:
            return float(self.queue.floats("priority")[row])
        return self._priority.get(r, 0.0)

    def demote(self, r: LiveRequest) -> None:
        row = self.queue.row_of(r)
        if row is not None:
            self.queue.flags("demoted")[row] = True
        else:
            self._demoted.add(r)

    def planned(self, view: EngineView) -> set[LiveRequest]:
        return self._planned

    def earned(self, r: LiveRequest, goodput_tokens: float, now_s: float) -> None:
        self.group.earned(goodput_tokens)
        self.fair.earned[r.req.tenant] += goodput_tokens

    def forget(self, r: LiveRequest) -> None:
        self._priority.pop(r, None)
        self._waited.pop(r, None)
        self._demoted.discard(r)
        self._planned.discard(r)
        self._running.discard(r)

    def admit_priority(self) -> float:
        """The group's bar: p x the B-th best live priority at the last frame (0 when the
        live requests fit the batch), or, under overload, what the frame displaced."""
        bar = max(self.group.threshold, self.group.frontier)
        return bar if math.isfinite(bar) and bar > 0 else 0.0

    def describe(self) -> dict[str, float]:
        return {"cutoff": self.group.cutoff, "median_priority": self.median_priority,
                "fairness_weight": self.fair.f}

    # ---- the frame -------------------------------------------------------------------
    def plan(self, view: EngineView) -> FramePlan:
        now = view.now_s
        queue = self.queue
        speeds = self.speeds
        speeds.decode_s = max(view.decode_step_s, MIN_TIME_S)
        speeds.prefill_s = view.prefill_s_per_token
        speeds.token_s = view.token_s or view.prefill_s_per_token
        speeds.batch = view.max_running
        speeds.slots_bind = len(view.running) + len(queue) > view.max_running
        self.fair.decay(now)
        self.group.tick(now)
        plan = FramePlan()
        queue.ints("waited")[:] += 1
        running = list(view.running)
        self._running = set(running)
        self._planned = set()
        first = len(running)
        if first + len(queue) == 0:
            return plan
        live = Features.concat(
            [features_of(running, self._demoted, self._waited, queue.tenants), queue.features()]
        )
        scores = score_features(live, now, speeds, self.spec, self.median_priority)
        self.median_priority = scores.median
        if self.pacer is not None:
            ok = scores.gain[:first] > 0
            self.pacer.on_frame(
                now, scores.need_s[:first][ok], view.decode_step_s, speeds.token_s * first
            )
        hopeless = scores.gain <= 0
        self.fair.update(live.tenant, queue.tenants, scores.median)
        priority = self.fair.blend(scores.priority, live.tenant, hopeless)
        for r, p in zip(running, priority[:first].tolist(), strict=True):
            self._priority[r] = p
        queue.floats("priority")[:] = priority[first:]
        chosen = self.group.choose(live.prompt + live.generated, priority, view.max_running)
        start_key, self.group.frontier = self.sequencer.sequence(
            first, chosen, scores, priority, live.tenant, self.fair.claims, live.prefill_left,
            now, speeds,
        )  # fmt: skip
        keys = np.where(chosen, np.minimum(start_key, OUTSIDE_GROUP / 2), OUTSIDE_GROUP - priority)
        queue.set_keys(keys[first:])
        members = (np.flatnonzero(chosen[first:])).tolist()
        self._planned = {queue.rows[i] for i in members}
        if self.preemptor is not None:
            plan.preempt.extend(self._victims(view, running, priority, chosen, hopeless, members))
        return plan

    def _victims(
        self,
        view: EngineView,
        running: list[LiveRequest],
        priority: FloatArray,
        chosen: npt.NDArray[np.bool_],
        hopeless: npt.NDArray[np.bool_],
        members: list[int],
    ) -> list[LiveRequest]:
        assert self.preemptor is not None
        first = len(running)
        return self.preemptor.victims(
            view.max_running,
            running,
            priority[:first].tolist(),
            (~chosen[:first] & hopeless[:first]).tolist(),
            [self.queue.rows[i] for i in members],
            priority[first:][members].tolist(),
            self.frame_steps * self.speeds.decode_s,
            self.speeds.token_s,
            self.speeds.decode_s,
        )


def _key(priority: float, start_key: float, in_group: bool) -> float:
    return min(start_key, OUTSIDE_GROUP / 2) if in_group else OUTSIDE_GROUP - priority


def _rows(features: Features, row: int) -> Features:
    """The features of one row (copies)."""
    return Features(*(getattr(features, name)[row : row + 1].copy() for name in Features.__slots__))

