"""GMAX's preemptor (paper section 4.2, "Preemption to Correct Scheduling Errors").

A running request outside the group that can no longer earn goodput gives its slot to a
waiting group member at a frame boundary, when the goodput gained over one frame beats
what the swap costs. (A running request that still can is left alone: swapping it out
puts its own deadline, and a compound call's whole program, at risk, which the per-frame
gain does not see.) Priorities are goodput tokens per second of *engine* time and over a
frame one batch slot holds ``frame_s / running`` of it, so the gain is
``(priority(challenger) - priority(victim)) * frame_s / running``; the cost is
``stall_s * token_rate`` (the victim's context recomputed at the measured per-token
time while the batch's decoders wait), scaled by ``preemption.costFactor``.
"""

from __future__ import annotations

import numpy as np

from jitserve.policy import PreemptionSettings, SLOPolicySpec
from jitserve.scheduling.frame import Frame


class Preemptor:
    name = "preempt"

    def __init__(self) -> None:
        self.settings = PreemptionSettings()
        self.frame_steps = 50

    def configure(self, spec: SLOPolicySpec) -> None:
        self.settings = spec.scheduler.preemption
        self.frame_steps = spec.scheduler.frame_steps

    def run(self, frame: Frame) -> None:
        """The best challengers (waiting members that find no free slot) paired with the
        worst victims (running, outside the group, hopeless); the victims of the pairs
        whose swap pays go into the plan."""
        if frame.live is None or frame.speeds is None:
            return
        running, first, queue = frame.running, frame.first_waiting, frame.queue
        members = np.flatnonzero(frame.chosen[first:])
        free = max(frame.view.max_running - first, 0)
        if members.size <= free:
            return
        priority = dict(zip(running, frame.priority[:first].tolist(), strict=True))
        member_rows = [queue.rows[i] for i in members.tolist()]
        priority.update(zip(member_rows, frame.priority[first:][members].tolist(), strict=True))
        challengers = sorted(member_rows, key=lambda r: -priority[r])[free:]
        lost = (~frame.chosen[:first] & frame.hopeless[:first]).tolist()
        victims = sorted((r for r, out in zip(running, lost, strict=True) if out),
                         key=lambda r: priority[r])
        slots = max(first, 1)
        speeds = frame.speeds
        slot_s = self.frame_steps * speeds.decode_s / slots
        token_rate = slots / speeds.decode_s
        pairs = zip(challengers[: self.settings.max_per_frame], victims, strict=False)
        for challenger, victim in pairs:
            gain = (priority[challenger] - priority[victim]) * slot_s
            stall_s = victim.context_tokens * speeds.token_s
            if gain > self.settings.cost_factor * stall_s * token_rate:
                frame.plan.preempt.append(victim)
