"""Overload control as its own layer, applied to any policy (seed 003: detect overload,
stop pretending the request set is feasible).

At every frame, a policy's :class:`OverloadStage` runs the policy's plan between two
rules (a stage the policy holds, not a wrapper around it: :func:`with_overload_control`):

1. **unreachable**: a request (waiting or running) whose deadline cannot be met even if
   it ran alone at *unloaded* speed from now is given up *before* the policy plans the
   frame, so it takes no place in the policy's decisions (no EDF domino); latency
   requests included: one whose first token cannot be on time (a started stream is
   never cut). Unloaded speed is the fastest the engine has been measured at (the
   simulator's meter starts at the profile's unloaded speeds): judged at the loaded
   speed, a request looks lost because of the very queue that overload control drains;
2. **max waiting**: a request that waited in the queue longer than
   ``admission.maxWaitingSeconds`` (since it arrived, or since it was preempted: the
   table's ``queued`` column) is given up, unless the policy plans to start it soon
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

import math
from dataclasses import replace
from typing import TypeVar

import numpy as np

from jitserve.policy import OverloadAction, SLOPolicySpec
from jitserve.requests import LiveRequest
from jitserve.scheduling.base import (
    EngineView,
    FramePlan,
    QueuedPolicy,
    Retirement,
    RetireReason,
)
from jitserve.scheduling.slack import out_of_reach
from jitserve.scheduling.table import out_of_reach_rows

MIN_STEP_S = 1e-3


class OverloadStage:
    """Overload control, the stage a :class:`~jitserve.scheduling.base.QueuedPolicy`
    runs its frame inside. ``follow_spec``: switched by
    ``scheduler.mechanisms.overloadControl`` (GMAX's ablation); otherwise always on (the
    ``-ac`` baselines). The rules read the waiting requests' features from the policy's
    table, as arrays."""

    def __init__(self, spec: SLOPolicySpec, follow_spec: bool = False) -> None:
        self.follow_spec = follow_spec
        self._demoted: set[LiveRequest] = set()
        self._fastest = (math.inf, math.inf)
        """(prefill s per token, decode step s): the fastest measured, i.e. unloaded."""
        self.configure(spec)

    def configure(self, spec: SLOPolicySpec) -> None:
        self.enabled = spec.scheduler.mechanisms.overload_control or not self.follow_spec
        self.max_waiting_s = spec.admission.max_waiting_seconds
        self.demote_instead = spec.admission.overload_action is OverloadAction.DEMOTE

    def forget(self, r: LiveRequest) -> None:
        self._demoted.discard(r)

    # ---- the frame -----------------------------------------------------------------------
    def frame(self, policy: QueuedPolicy, view: EngineView) -> FramePlan:
        """``policy``'s plan for the frame, inside the two rules."""
        if not self.enabled:
            return policy.plan(view)
        now = view.now_s
        prefill_s, decode_s = self._unloaded(view)
        plan = FramePlan()
        queue = policy.queue
        lost = [
            r
            for r in view.running
            if r not in self._demoted and out_of_reach(r, now, prefill_s, decode_s)
        ]
        doomed = out_of_reach_rows(queue.features(), now, prefill_s, decode_s)
        lost += [
            r for r in (queue.rows[i] for i in np.flatnonzero(doomed)) if r not in self._demoted
        ]
        self._give_up(policy, lost, RetireReason.UNREACHABLE, plan)
        gone = plan.retired()
        if gone:
            view = replace(view, running=[r for r in view.running if r not in gone])
        inner_plan = policy.plan(view)
        plan.retire.extend(x for x in inner_plan.retire if x.request not in gone)
        gone |= inner_plan.retired()
        keep = set(policy.planned(view))
        waited_long = now - queue.floats("queued") > self.max_waiting_s
        overdue = [
            r
            for r in (queue.rows[i] for i in np.flatnonzero(waited_long))
            if r not in keep
            and r not in gone
            and r not in self._demoted
        ]
        self._give_up(policy, overdue, RetireReason.MAX_WAITING, plan)
        gone = plan.retired()
        plan.preempt = [r for r in inner_plan.preempt if r not in gone]
        return plan

    def _unloaded(self, view: EngineView) -> tuple[float, float]:
        prefill_s = min(self._fastest[0], view.prefill_s_per_token)
        decode_s = min(self._fastest[1], max(view.decode_step_s, MIN_STEP_S))
        self._fastest = (prefill_s, decode_s)
        return self._fastest

    def _give_up(
        self,
        policy: QueuedPolicy,
        rs: list[LiveRequest],
        reason: RetireReason,
        plan: FramePlan,
    ) -> None:
        for r in rs:
            if self.demote_instead:
                self._demoted.add(r)
                policy.demote(r)
                continue
            if r in policy.queue:  # out of the queue now, so the policy plans without it
                policy.queue.remove(r)
                policy.forget(r)
            plan.retire.append(Retirement(r, reason))


P = TypeVar("P", bound=QueuedPolicy)


def with_overload_control(policy: P, spec: SLOPolicySpec, follow_spec: bool = False) -> P:
    """``policy`` running its frames inside overload control; a baseline's name gets
    the ``-ac`` suffix (GMAX, ``follow_spec``, keeps its name)."""
    policy.overload = OverloadStage(spec, follow_spec)
    if not follow_spec:
        policy.name = f"{policy.name}-ac"
    policy.configure(spec)
    return policy
