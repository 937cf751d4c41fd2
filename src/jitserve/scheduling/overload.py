"""Overload control as its own layer, applied to any policy (seed 003: detect overload,
stop pretending the request set is feasible).

At every frame, :class:`OverloadControlled` wraps a policy and applies two rules:

1. **unreachable**: a request (waiting or running) whose deadline cannot be met even if
   it ran alone at full speed from now is given up *before* the policy plans the frame,
   so it takes no place in the policy's decisions (no EDF domino); with ``objective:
   requests`` also a latency request whose TTFT passed without a first token (its
   tokens count only all together);
2. **max waiting**: a request that never started and waited longer than
   ``admission.maxWaitingSeconds`` is given up, unless the policy plans to start it soon
   (:meth:`~jitserve.scheduling.base.Policy.planned`, asked *after* the policy planned
   the frame).

Giving up means ``admission.overloadAction``: ``drop`` retires the request (a
:class:`~jitserve.scheduling.base.Retirement` with its reason in the
:class:`~jitserve.scheduling.base.FramePlan`), ``demote`` keeps it as best effort
(:meth:`~jitserve.scheduling.base.Policy.demote`). GMAX runs inside this very layer
(``mechanisms.overloadControl``), and every baseline has an ``<name>-ac`` form with it,
so "the same overload control" holds by construction.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

import numpy as np

from jitserve.policy import Objective, OverloadAction, SLOPolicySpec
from jitserve.requests import LiveRequest
from jitserve.scheduling.base import (
    EngineView,
    FramePlan,
    Policy,
    QueuedPolicy,
    Retirement,
    RetireReason,
)
from jitserve.scheduling.slack import out_of_reach
from jitserve.scheduling.table import out_of_reach_rows

MIN_STEP_S = 1e-3


class OverloadControlled(Policy):
    """``inner`` with overload control. ``follow_spec``: switch the layer with
    ``scheduler.mechanisms.overloadControl`` (GMAX's ablation); otherwise always on
    (the ``-ac`` baselines). The rules read the waiting requests' features from the inner
    policy's table, as arrays."""

    def __init__(
        self, inner: QueuedPolicy, spec: SLOPolicySpec, follow_spec: bool = False
    ) -> None:
        self.inner = inner
        self.name = inner.name if follow_spec else f"{inner.name}-ac"
        self.chunked_prefill = inner.chunked_prefill
        self.follow_spec = follow_spec
        self._demoted: set[LiveRequest] = set()
        self.configure(spec)

    # ---- settings ----------------------------------------------------------------------
    def configure(self, spec: SLOPolicySpec) -> None:
        self.inner.configure(spec)
        self.frame_steps = self.inner.frame_steps
        self.enabled = spec.scheduler.mechanisms.overload_control or not self.follow_spec
        self.max_waiting_s = spec.admission.max_waiting_seconds
        self.demote_instead = spec.admission.overload_action is OverloadAction.DEMOTE
        self.whole_requests = spec.objective is Objective.REQUESTS

    # ---- the queue: the inner policy's ---------------------------------------------------
    def enqueue(self, r: LiveRequest, now_s: float) -> None:
        self.inner.enqueue(r, now_s)

    def peek_next(self, now_s: float) -> LiveRequest | None:
        return self.inner.peek_next(now_s)

    def pop_next(self, now_s: float) -> LiveRequest | None:
        return self.inner.pop_next(now_s)

    def remove(self, r: LiveRequest) -> None:
        self._demoted.discard(r)
        self.inner.remove(r)

    def waiting(self) -> int:
        return self.inner.waiting()

    def waiting_requests(self) -> list[LiveRequest]:
        return self.inner.waiting_requests()

    def planned(self, view: EngineView) -> Collection[LiveRequest]:
        return self.inner.planned(view)

    def priority_of(self, r: LiveRequest) -> float:
        return self.inner.priority_of(r)

    def demote(self, r: LiveRequest) -> None:
        self._demoted.add(r)
        self.inner.demote(r)

    def on_finish(self, r: LiveRequest, goodput_tokens: float, now_s: float) -> None:
        self._demoted.discard(r)
        self.inner.on_finish(r, goodput_tokens, now_s)

    def describe(self) -> dict[str, float]:
        return self.inner.describe()

    # ---- the frame -----------------------------------------------------------------------
    def frame(self, view: EngineView) -> FramePlan:
        if not self.enabled:
            return self.inner.frame(view)
        now = view.now_s
        decode_s = max(view.decode_step_s, MIN_STEP_S)
        plan = FramePlan()
        queue = self.inner.queue
        lost = [
            r
            for r in view.running
            if r not in self._demoted
            and out_of_reach(r, now, view.prefill_s_per_token, decode_s, self.whole_requests)
        ]
        doomed = out_of_reach_rows(
            queue.features(), now, view.prefill_s_per_token, decode_s, self.whole_requests
        )
        lost += [
            r for r in (queue.rows[i] for i in np.flatnonzero(doomed)) if r not in self._demoted
        ]
        self._give_up(lost, RetireReason.UNREACHABLE, plan)
        gone = plan.retired()
        if gone:
            view = replace(view, running=[r for r in view.running if r not in gone])
        inner_plan = self.inner.frame(view)
        plan.retire.extend(x for x in inner_plan.retire if x.request not in gone)
        gone |= inner_plan.retired()
        keep = set(self.inner.planned(view))
        queue = self.inner.queue
        waited_long = ~queue.flags("started") & (
            now - queue.floats("arrival") > self.max_waiting_s
        )
        overdue = [
            r
            for r in (queue.rows[i] for i in np.flatnonzero(waited_long))
            if r not in keep
            and r not in gone
            and r not in self._demoted
        ]
        self._give_up(overdue, RetireReason.MAX_WAITING, plan)
        gone = plan.retired()
        plan.preempt = [r for r in inner_plan.preempt if r not in gone]
        return plan

    def _give_up(
        self,
        rs: list[LiveRequest],
        reason: RetireReason,
        plan: FramePlan,
    ) -> None:
        for r in rs:
            if self.demote_instead:
                self.demote(r)
                continue
            if r in self.inner.queue:  # out of the queue now, so the policy plans without it
                self.inner.remove(r)
            plan.retire.append(Retirement(r, reason))
