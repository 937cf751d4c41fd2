"""GMAX: Grouped Margin Goodput Maximization (JITServe paper section 4.2), the policy.

At every frame (DESIGN.md "GMAX scheduler"), over all live requests:

1. score them (:mod:`~jitserve.scheduling.priorities`): goodput per unit of engine
   time, aged by ``delta`` per frame waited; with fairness weight ``f``,
   ``(1 - f) * priority + f * 2 * median * Fair(tenant)``, so the blend stays in goodput
   units (preemption compares it with a token cost) and a tenant at its entitlement
   weighs one median priority;
2. choose the group (:mod:`~jitserve.scheduling.grouping`): cutoff ``p`` and the
   input-length window;
3. sequence the waiting members: by latest start (the start that still earns the full
   gain); with ``f > 0`` blended with the tenants' fair-share order (seed 003: urgency
   is a claim on your own share), positions in each order weighted ``1 - f`` and ``f``;
   members that would start too late leave the group;
4. preempt running requests outside the group when it pays
   (:mod:`~jitserve.scheduling.preemption`).

Overload control (retiring what cannot earn goodput) is the layer GMAX runs inside,
shared with the ``-ac`` baselines (:mod:`~jitserve.scheduling.overload`); it keeps what
:meth:`GMAX.planned` names: the feasible waiting members of the group.

The queue between frames is a heap on the last computed key; arrivals get theirs when
they arrive, so admission stays O(log n). One frame costs O(N log N).
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict

import numpy as np
import numpy.typing as npt

from jitserve.policy import CutoffMode, SLOPolicySpec
from jitserve.requests import LiveRequest
from jitserve.scheduling.base import EngineView, FramePlan, QueuedPolicy
from jitserve.scheduling.cutoff import CutoffTuner
from jitserve.scheduling.grouping import admit_feasible, choose_group
from jitserve.scheduling.pacing import PrefillPacer
from jitserve.scheduling.preemption import choose_victims
from jitserve.scheduling.priorities import (
    MIN_TIME_S,
    Scores,
    Speeds,
    fair_claims,
    latency_tokens_reachable,
    normal_quantile,
    score,
)

__all__ = ["GMAX", "latency_tokens_reachable"]

OUTSIDE_GROUP = 1e13
"""Queue keys: members of the chosen group are keyed by their start order (below
``OUTSIDE_GROUP / 2``); everyone else by ``OUTSIDE_GROUP - priority``, so after them."""
FAIR_TIE = 0.01
"""Weight of the goodput priority inside the fair-share term (orders a tenant's requests)."""


class GMAX(QueuedPolicy):
    name = "gmax"
    chunked_prefill = True

    def __init__(self, spec: SLOPolicySpec | None = None, seed: int = 0) -> None:
        super().__init__()
        self._seed = seed
        self._median_priority = 1.0
        self._speeds = Speeds()
        self._earned: dict[str, float] = defaultdict(float)
        """Goodput tokens each tenant earned, decayed over ``fairness.windowSeconds``."""
        # policy-private per-request values (never written into the request)
        self._priority: dict[LiveRequest, float] = {}
        self._frames_waited: dict[LiveRequest, int] = {}
        self._demoted: set[LiveRequest] = set()
        self._planned: set[LiveRequest] = set()
        self.tuner: CutoffTuner | None = None
        self._last_frame_s: float | None = None
        self._threshold = -math.inf
        """Priority an arrival needs to join the current group (cutoff x B-th best)."""
        self._frontier = -math.inf
        """Under overload, the most valuable member the last frame displaced."""
        self._claims: dict[str, float] = {}
        self._fair_scale = 0.0
        self._sequence = _Sequence()
        self._pacer = PrefillPacer()
        self._running: set[LiveRequest] = set()
        self.spec = spec or SLOPolicySpec()
        self.configure(self.spec)

    def configure(self, spec: SLOPolicySpec) -> None:
        """Apply (new) settings; used at start and on hot reload."""
        self.spec = spec
        s = spec.scheduler
        self.frame_steps = s.frame_steps
        if self.tuner is None:
            self.tuner = CutoffTuner(
                s.cutoff.candidates, s.cutoff.value, s.cutoff.epoch_frames, self._seed
            )
        else:
            self.tuner.reconfigure(s.cutoff.candidates, s.cutoff.value, s.cutoff.epoch_frames)
        self.auto_cutoff = s.cutoff.mode is CutoffMode.AUTO
        self.cutoff = self.tuner.value if self.auto_cutoff else s.cutoff.value
        self._speeds.z_q = normal_quantile(s.length_quantile)
        mechanisms = s.mechanisms
        self.fair_weight = spec.fairness.weight if mechanisms.fairness else 0.0

    # ---- queue ------------------------------------------------------------------------
    def enqueue(self, r: LiveRequest, now_s: float) -> None:
        self._running.discard(r)  # preempted requests come back here
        scores = score(
            [r], now_s, self._speeds, self.spec, self._frames_waited, self._demoted,
            self._median_priority,
        )
        p = self._priority[r] = self._blend(
            r, float(scores.priority[0]), bool(scores.gain[0] <= 0)
        )
        latest_start = float(scores.latest_start[0])
        # joins the group if it would have made the cut and can still start in time
        late = latest_start < now_s and self.spec.scheduler.mechanisms.latest_start_sequencing
        in_group = p >= self._threshold and p > self._frontier and not late
        order = self._start_order(scores, np.array([p]))
        key = (
            self._sequence.key_of(r, float(order[0]), bool(scores.gain[0] <= 0))
            if in_group
            else 0.0
        )
        self.queue.push(r, self._key(p, key, in_group))

    def peek_next(self, now_s: float) -> LiveRequest | None:
        r = self.queue.peek()
        if r is None or not self._running or not self.spec.scheduler.mechanisms.prefill_pacing:
            return r
        return r if self._pacer.allows(now_s, r.prefill_target - r.prefilled) else None

    def pop_next(self, now_s: float) -> LiveRequest | None:
        r = self.peek_next(now_s)
        if r is not None:
            self.queue.pop()
            self._running.add(r)
            self._pacer.started(r.prefill_target - r.prefilled)
        return r

    def priority_of(self, r: LiveRequest) -> float:
        return self._priority.get(r, 0.0)

    def remove(self, r: LiveRequest) -> None:
        super().remove(r)
        self._forget(r)

    def demote(self, r: LiveRequest) -> None:
        self._demoted.add(r)

    def planned(self, view: EngineView) -> set[LiveRequest]:
        return self._planned

    def on_finish(self, r: LiveRequest, goodput_tokens: float, now_s: float) -> None:
        assert self.tuner is not None
        self.tuner.earned(goodput_tokens)
        self._earned[r.req.tenant] += goodput_tokens
        self._forget(r)

    def _forget(self, r: LiveRequest) -> None:
        self._priority.pop(r, None)
        self._frames_waited.pop(r, None)
        self._demoted.discard(r)
        self._planned.discard(r)
        self._running.discard(r)

    def describe(self) -> dict[str, float]:
        return {"cutoff": self.cutoff, "median_priority": self._median_priority}

    @staticmethod
    def _key(priority: float, start_key: float, in_group: bool) -> float:
        return min(start_key, OUTSIDE_GROUP / 2) if in_group else OUTSIDE_GROUP - priority

    def _blend(self, r: LiveRequest, priority: float, hopeless: bool) -> float:
        f = self.fair_weight
        if f <= 0:
            return priority
        claim = 0.0 if hopeless else self._claims.get(r.req.tenant, 1.0)
        return (1 - f) * priority + f * (self._fair_scale * claim + FAIR_TIE * priority)

    # ---- the frame -------------------------------------------------------------------
    def frame(self, view: EngineView) -> FramePlan:
        now = view.now_s
        speeds = self._speeds
        speeds.decode_s = max(view.decode_step_s, MIN_TIME_S)
        speeds.prefill_s = view.prefill_s_per_token
        speeds.token_s = view.token_s or view.prefill_s_per_token
        speeds.batch = view.max_running
        speeds.slots_bind = len(view.running) + self.queue.__len__() > view.max_running
        self._decay_earned(now)
        if self.auto_cutoff and self.spec.scheduler.mechanisms.cutoff:
            assert self.tuner is not None
            self.tuner.on_frame(now)
            self.cutoff = self.tuner.value
        plan = FramePlan()
        waiting = self.queue.members()
        for r in waiting:
            self._frames_waited[r] = self._frames_waited.get(r, 0) + 1
        running = list(view.running)
        self._running = set(running)
        live = running + waiting
        self._planned = set()
        if not live:
            self.queue.rebuild([])
            return plan
        scores = score(
            live, now, speeds, self.spec, self._frames_waited, self._demoted,
            self._median_priority,
        )
        self._median_priority = scores.median
        n_run = len(running)
        self._pacer.on_frame(
            now,
            scores.need_s[:n_run][scores.gain[:n_run] > 0],
            view.decode_step_s,
            speeds.token_s * n_run,
        )
        hopeless = scores.gain <= 0
        priority = self._blended(live, scores.priority, hopeless)
        for r, p in zip(live, priority, strict=True):
            self._priority[r] = float(p)
        mechanisms = self.spec.scheduler.mechanisms
        chosen, self._threshold = choose_group(
            live,
            priority,
            view.max_running,
            self.cutoff if mechanisms.cutoff else None,
            self.spec.scheduler.candidate_factor,
            mechanisms.length_window,
        )
        first = len(running)
        self._frontier = -math.inf
        start_key = self._sequence.build(
            live, first, chosen, self._start_order(scores, priority), hopeless, self._claims,
            self.fair_weight,
        )
        if mechanisms.latest_start_sequencing:
            self._frontier = admit_feasible(
                live, first, priority, start_key, scores.latest_start, scores.work_s,
                scores.due_s, chosen, now, speeds.prefill_s, speeds.decode_s, speeds.token_s,
            )
        in_group = chosen.tolist()
        keys = np.where(chosen, np.minimum(start_key, OUTSIDE_GROUP / 2), OUTSIDE_GROUP - priority)
        self._planned = {r for r, c in zip(waiting, in_group[first:], strict=True) if c}
        self.queue.rebuild(zip(keys[first:].tolist(), waiting, strict=True))
        if mechanisms.preemption and self.spec.scheduler.preemption.enabled:
            lost = {r for r, h in zip(running, hopeless[:first].tolist(), strict=True) if h}
            self._preempt(view, running, waiting, in_group, lost, plan)
        return plan

    def _start_order(
        self, scores: Scores, priority: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.float64]:
        """Start order of group members, lower first: by latest start, or (sequencing
        off) by priority."""
        if not self.spec.scheduler.mechanisms.latest_start_sequencing:
            return -priority
        return scores.latest_start

    def _blended(
        self,
        live: list[LiveRequest],
        priority: npt.NDArray[np.float64],
        hopeless: npt.NDArray[np.bool_],
    ) -> npt.NDArray[np.float64]:
        """Priority with the fair-share claims blended in (f > 0), in goodput units: a
        claim is scaled by the top priority, so at f = 1 the tenants' claims decide and
        priority only orders requests inside a tenant. A request that can earn nothing
        gets no claim: fairness shares goodput, and it has none to give."""
        f = self.fair_weight
        if f <= 0:
            self._claims = {}
            return priority
        self._claims = fair_claims([r.req.tenant for r in live], self._earned, self.spec.fairness)
        self._fair_scale = float(priority.max()) if priority.size else 0.0
        claims = np.array([self._claims[r.req.tenant] for r in live]) * ~hopeless
        return (1 - f) * priority + f * (self._fair_scale * claims + FAIR_TIE * priority)

    def _preempt(
        self,
        view: EngineView,
        running: list[LiveRequest],
        waiting: list[LiveRequest],
        in_group: list[bool],
        lost: set[LiveRequest],
        plan: FramePlan,
    ) -> None:
        """Correct scheduling errors: a running request outside the group that can no
        longer earn goodput gives its slot to a waiting group member, when it pays. A
        running request that still can is left alone: swapping it out puts its own
        deadline (and, for a compound call, its whole program's) at risk, which the
        per-frame gain does not see."""
        free = view.max_running - len(running)
        members = [r for r, c in zip(waiting, in_group[len(running) :], strict=True) if c]
        if len(members) <= max(free, 0):
            return
        challengers = sorted(members, key=lambda r: -self._priority[r])[max(free, 0) :]
        victims = sorted(
            (r for r, c in zip(running, in_group, strict=False) if not c and r in lost),
            key=lambda r: self._priority[r],
        )
        speeds = self._speeds
        plan.preempt.extend(
            choose_victims(
                challengers,
                victims,
                self._priority,
                self.spec.scheduler.preemption,
                self.frame_steps * speeds.decode_s / max(len(running), 1),
                speeds.token_s,
                max(len(running), 1) / speeds.decode_s,
            )
        )

    def _decay_earned(self, now: float) -> None:
        if self._last_frame_s is not None:
            decay = math.exp(-(now - self._last_frame_s) / self.spec.fairness.window_seconds)
            for t in self._earned:
                self._earned[t] *= decay
        self._last_frame_s = now


class _Sequence:
    """The start order of the group's waiting members (lower first), blended with the
    tenants' fair-share order when ``f > 0``; kept between frames so that an arrival gets
    a key on the same scale."""

    def __init__(self) -> None:
        self._bases: list[float] = []
        self._tenant_pos: dict[str, float] = {}
        self._f = 0.0

    def build(
        self,
        live: list[LiveRequest],
        first: int,
        chosen: npt.NDArray[np.bool_],
        base: npt.NDArray[np.float64],
        hopeless: npt.NDArray[np.bool_],
        claims: dict[str, float],
        f: float,
    ) -> npt.NDArray[np.float64]:
        self._f = f
        if f <= 0:
            return base
        members = np.flatnonzero(chosen[first:]) + first
        self._bases = sorted(float(base[i]) for i in members)
        counts: dict[str, int] = defaultdict(int)
        for i in members:
            counts[live[i].req.tenant] += 1
        total = max(len(members), 1)
        self._tenant_pos = {}
        ahead = 0
        for tenant in sorted(counts, key=lambda t: -claims.get(t, 1.0)):
            self._tenant_pos[tenant] = ahead / total
            ahead += counts[tenant]
        keys = np.array(base, dtype=np.float64)
        for i in members:
            keys[i] = self.key_of(live[i], float(base[i]), bool(hopeless[i]))
        return keys

    def key_of(self, r: LiveRequest, base: float, hopeless: bool = False) -> float:
        """The key of a request whose own start order value is ``base``; one that can earn
        nothing has no claim on its tenant's share and goes after the tenants' turns."""
        if self._f <= 0:
            return base
        pos = bisect.bisect_left(self._bases, base) / max(len(self._bases), 1)
        tenant_pos = 1.0 if hopeless else self._tenant_pos.get(r.req.tenant, 0.0)
        return (1 - self._f) * pos + self._f * tenant_pos + 1e-9 * pos
