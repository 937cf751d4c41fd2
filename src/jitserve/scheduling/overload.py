"""Overload control as its own layer, applied to any policy (seed 003: detect overload,
stop pretending the request set is feasible).

Two stages around a policy's own (:class:`OverloadControl` puts them there), at every
frame:

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
   (``frame.keep``, written by the policy's stages: this stage runs last); with
   ``admission.maxWaitingRetires: late``, only if it is also past its latest start at
   the engine's *current* speed (a deadline request with slack left keeps waiting: a
   fixed wait retires work that loose deadlines would still have paid for).

Giving up means ``admission.overloadAction``: ``drop`` retires the request (a
:class:`~jitserve.scheduling.base.Retirement` with its reason in the
:class:`~jitserve.scheduling.base.FramePlan`), ``demote`` keeps it as best effort
(:meth:`~jitserve.scheduling.frame.Frame.give_up`); the stages never call the policy.
GMAX runs inside these very stages (``mechanisms.overloadControl``), and every baseline
has an ``<name>-ac`` form with them, so "the same overload control" holds by
construction.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from jitserve.policy import MaxWaitingRetires, OverloadAction, SLOPolicySpec
from jitserve.scheduling.base import RetireReason
from jitserve.scheduling.frame import Frame, Stage
from jitserve.scheduling.slack import out_of_reach
from jitserve.scheduling.table import late_to_start_rows, out_of_reach_rows

MIN_STEP_S = 1e-3


class _Switch:
    """Whether overload control is on, and what giving up means, from the settings."""

    def __init__(self, follow_spec: bool) -> None:
        self.follow_spec = follow_spec
        self.enabled = True
        self.demote_instead = False

    def configure(self, spec: SLOPolicySpec) -> None:
        self.enabled = spec.scheduler.mechanisms.overload_control or not self.follow_spec
        self.demote_instead = spec.admission.overload_action is OverloadAction.DEMOTE


class GiveUpUnreachable:
    """Rule 1, the first stage: requests that cannot meet their SLO even alone at
    unloaded speed are given up before the policy's stages see them."""

    name = "unreachable"

    def __init__(self, switch: _Switch) -> None:
        self.switch = switch
        self._fastest = (math.inf, math.inf)
        """(prefill s per token, decode step s): the fastest measured, i.e. unloaded."""

    def configure(self, spec: SLOPolicySpec) -> None:
        self.switch.configure(spec)

    def run(self, frame: Frame) -> None:
        if not self.switch.enabled:
            return
        view, now, demoted = frame.view, frame.now_s, frame.kept.demoted
        prefill_s, decode_s = self._unloaded(view.prefill_s_per_token, view.decode_step_s)
        queue = frame.queue
        lost = [
            r for r in view.running
            if r not in demoted and out_of_reach(r, now, prefill_s, decode_s)
        ]  # fmt: skip
        doomed = out_of_reach_rows(queue.features(), now, prefill_s, decode_s)
        lost += [r for r in (queue.rows[i] for i in np.flatnonzero(doomed)) if r not in demoted]
        for r in lost:
            frame.give_up(r, RetireReason.UNREACHABLE, self.switch.demote_instead)
        gone = frame.plan.retired()
        if gone:
            frame.view = replace(view, running=[r for r in view.running if r not in gone])

    def _unloaded(self, prefill_s: float, decode_s: float) -> tuple[float, float]:
        self._fastest = (
            min(self._fastest[0], prefill_s),
            min(self._fastest[1], max(decode_s, MIN_STEP_S)),
        )
        return self._fastest


class GiveUpOverdue:
    """Rule 2, the last stage: requests that waited past ``admission.maxWaitingSeconds``
    (``late``: and past their latest start at the current speed) and that the policy
    does not plan to start soon are given up."""

    name = "overdue"

    def __init__(self, switch: _Switch) -> None:
        self.switch = switch
        self.max_waiting_s = math.inf
        self.only_late = False

    def configure(self, spec: SLOPolicySpec) -> None:
        self.max_waiting_s = spec.admission.max_waiting_seconds
        self.only_late = spec.admission.max_waiting_retires is MaxWaitingRetires.LATE

    def run(self, frame: Frame) -> None:
        if not self.switch.enabled:
            return
        queue, keep, demoted = frame.queue, frame.keep, frame.kept.demoted
        gone = frame.plan.retired()
        waited_long = frame.now_s - queue.floats("queued") > self.max_waiting_s
        if self.only_late and waited_long.any():
            view = frame.view
            waited_long &= late_to_start_rows(
                queue.features(), frame.now_s, view.prefill_s_per_token, view.decode_step_s
            )
        overdue = [
            r for r in (queue.rows[i] for i in np.flatnonzero(waited_long))
            if r not in keep and r not in gone and r not in demoted
        ]  # fmt: skip
        for r in overdue:
            frame.give_up(r, RetireReason.MAX_WAITING, self.switch.demote_instead)


class OverloadControl:
    """The two rules as stages around a policy's own. ``follow_spec``: switched by
    ``scheduler.mechanisms.overloadControl`` (GMAX's ablation); otherwise always on (the
    ``-ac`` baselines)."""

    def __init__(self, follow_spec: bool = False) -> None:
        switch = self.switch = _Switch(follow_spec)
        self.first = GiveUpUnreachable(switch)
        self.last = GiveUpOverdue(switch)

    @property
    def follow_spec(self) -> bool:
        return self.switch.follow_spec

    def around(self, stages: list[Stage], planner: Stage | None) -> list[Stage]:
        """``stages`` between the rules; ``planner`` (when the stages do not name what
        they plan to start) runs before the waiting limit."""
        return [self.first, *stages, *([planner] if planner else []), self.last]
