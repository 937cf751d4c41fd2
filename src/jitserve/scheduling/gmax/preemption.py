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

With fairness weight f > 0 a second rule serves the max-min order (issue 27): when a running
request of a tenant below its fair share can still earn but needs its tokens faster than a
decode-only step gives (a per-token need under the step time of the batch as it is, which
prefill pacing cannot fix), the running requests of the tenants above their share give way,
the largest context first (it makes the step slowest and holds the most KV), at most
``ceil(f x FAIR_PER_FRAME)`` per frame. Without it, at f = 1 and load 2.0 the small tenants'
requests that the fair order started still missed their pace behind the large tenant's
running ones (f = 1 closed 72% / 74% / 69% of the tenants' gaps to their max-min shares
on the validation seeds, 85% / 82% / 87% with it; docs/scheduling.md).
"""

from __future__ import annotations

import math

import numpy as np

from jitserve.policy import PreemptionSettings, SLOPolicySpec
from jitserve.requests import LiveRequest
from jitserve.scheduling.frame import Frame
from jitserve.scheduling.gmax.scoring import FairShare

FAIR_PER_FRAME = 2
"""At f = 1, the over-share requests preempted per frame for an under-share one's pace."""


class Preemptor:
    name = "preempt"

    def __init__(self, fair: FairShare | None = None) -> None:
        self.fair = fair
        """The fairness weight and claims' owner (None: f = 0)."""
        self.settings = PreemptionSettings()
        self.frame_steps = 50

    def configure(self, spec: SLOPolicySpec) -> None:
        self.settings = spec.scheduler.preemption
        self.frame_steps = spec.scheduler.frame_steps

    def run(self, frame: Frame) -> None:
        """The victims of both rules go into the plan."""
        self.goodput_victims(frame)
        frame.plan.preempt.extend(self.fair_victims(frame))

    def goodput_victims(self, frame: Frame) -> None:
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

    def fair_victims(self, frame: Frame) -> list[LiveRequest]:
        """Running requests of over-share tenants that give way to an under-share tenant's
        request a decode-only step is too slow for (empty at f = 0)."""
        fair, first = self.fair, frame.first_waiting
        if fair is None or fair.f <= 0 or first == 0 or frame.live is None:
            return []
        if frame.scores is None or frame.speeds is None:
            return []
        tenant = frame.live.tenant[:first]
        too_fast = frame.scores.need_s[:first] < frame.speeds.decode_only_s(first)
        starved = fair.below_share(tenant) & (frame.scores.gain[:first] > 0) & too_fast
        if not starved.any():
            return []
        planned = set(frame.plan.preempt)
        over = [r for r, above in zip(frame.running, fair.above_share(tenant).tolist(),
                                      strict=True)
                if above and r.req.preemptible and r not in planned]
        over.sort(key=lambda r: -r.context_tokens)
        room = max(self.settings.max_per_frame - len(planned), 0)
        return over[: min(math.ceil(fair.f * FAIR_PER_FRAME), room)]
