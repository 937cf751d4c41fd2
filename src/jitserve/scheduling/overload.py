"""Overload control as its own layer, applied to any policy (seed 003: detect overload,
stop pretending the request set is feasible).

At every frame, :class:`OverloadControlled` wraps a policy and applies two rules:

1. **unreachable**: a request (waiting or running) whose deadline cannot be met even if
   it ran alone at *unloaded* speed from now is given up *before* the policy plans the
   frame, so it takes no place in the policy's decisions (no EDF domino); latency
   requests included: one whose first token cannot be on time (a started stream is
   never cut). Unloaded speed is the fastest the engine has been measured at (the
   simulator's meter starts at the profile's unloaded speeds): judged at the loaded
   speed, a request looks lost because of the very queue that overload control drains;
2. **max waiting**: a request that waited in the queue longer than
   ``admission.maxWaitingSeconds`` (since it arrived, or since it was preempted) is given
   up, unless the policy plans to start it soon
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
from collections.abc import Collection
from dataclasses import replace

from jitserve.policy import OverloadAction, SLOPolicySpec
from jitserve.requests import LiveRequest
from jitserve.scheduling.base import (
    EngineView,
    FramePlan,
    Policy,
    Retirement,
    RetireReason,
)
from jitserve.scheduling.slack import out_of_reach

MIN_STEP_S = 1e-3


class OverloadControlled(Policy):
    """``inner`` with overload control. ``follow_spec``: switch the layer with
    ``scheduler.mechanisms.overloadControl`` (GMAX's ablation); otherwise always on
    (the ``-ac`` baselines)."""

    def __init__(self, inner: Policy, spec: SLOPolicySpec, follow_spec: bool = False) -> None:
        self.inner = inner
        self.name = inner.name if follow_spec else f"{inner.name}-ac"
        self.chunked_prefill = inner.chunked_prefill
        self.follow_spec = follow_spec
        self._demoted: set[LiveRequest] = set()
        self._requeued_s: dict[LiveRequest, float] = {}
        """When each preempted request came back to the queue (the max-wait clock)."""
        self._fastest = (math.inf, math.inf)
        """(prefill s per token, decode step s): the fastest measured, i.e. unloaded."""
        self.configure(spec)

    # ---- settings ----------------------------------------------------------------------
    def configure(self, spec: SLOPolicySpec) -> None:
        self.inner.configure(spec)
        self.frame_steps = self.inner.frame_steps
        self.enabled = spec.scheduler.mechanisms.overload_control or not self.follow_spec
        self.max_waiting_s = spec.admission.max_waiting_seconds
        self.demote_instead = spec.admission.overload_action is OverloadAction.DEMOTE

    # ---- the queue: the inner policy's ---------------------------------------------------
    def enqueue(self, r: LiveRequest, now_s: float) -> None:
        if r.started_s is not None:
            self._requeued_s[r] = now_s
        self.inner.enqueue(r, now_s)

    def peek_next(self, now_s: float) -> LiveRequest | None:
        return self.inner.peek_next(now_s)

    def pop_next(self, now_s: float) -> LiveRequest | None:
        r = self.inner.pop_next(now_s)
        if r is not None:
            self._requeued_s.pop(r, None)
        return r

    def remove(self, r: LiveRequest) -> None:
        self._demoted.discard(r)
        self._requeued_s.pop(r, None)
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
        self._requeued_s.pop(r, None)
        self.inner.on_finish(r, goodput_tokens, now_s)

    def describe(self) -> dict[str, float]:
        return self.inner.describe()

    # ---- the frame -----------------------------------------------------------------------
    def frame(self, view: EngineView) -> FramePlan:
        if not self.enabled:
            return self.inner.frame(view)
        now = view.now_s
        prefill_s, decode_s = self._unloaded(view)
        plan = FramePlan()
        waiting = set(self.inner.waiting_requests())
        lost = [
            r
            for r in (*view.running, *waiting)
            if r not in self._demoted and out_of_reach(r, now, prefill_s, decode_s)
        ]
        self._give_up(lost, RetireReason.UNREACHABLE, plan, waiting)
        gone = plan.retired()
        if gone:
            view = replace(view, running=[r for r in view.running if r not in gone])
        inner_plan = self.inner.frame(view)
        plan.retire.extend(x for x in inner_plan.retire if x.request not in gone)
        gone |= inner_plan.retired()
        keep = set(self.inner.planned(view))
        overdue = [
            r
            for r in self.inner.waiting_requests()
            if now - self._requeued_s.get(r, r.req.arrival_s) > self.max_waiting_s
            and r not in keep
            and r not in gone
            and r not in self._demoted
        ]
        self._give_up(overdue, RetireReason.MAX_WAITING, plan, waiting)
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
        rs: list[LiveRequest],
        reason: RetireReason,
        plan: FramePlan,
        waiting: set[LiveRequest],
    ) -> None:
        for r in rs:
            if self.demote_instead:
                self.demote(r)
                continue
            if r in waiting:  # out of the queue now, so the policy plans without it
                self.remove(r)
            plan.retire.append(Retirement(r, reason))
