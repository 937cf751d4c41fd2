"""GMAX's preemption test (paper section 4.2, "Preemption to Correct Scheduling Errors").

A running request outside the group is swapped out for a waiting group member only at a
frame boundary, and only when the goodput gained over one frame beats the goodput the
swap costs. Priorities are goodput tokens per second of *engine* time, and over a frame
one batch slot holds ``frame_s / running`` of it, so the gain is
``(priority(challenger) - priority(victim)) * frame_s / running``; the cost is
``stall_s * token_rate`` (the victim's context recomputed at the measured per-token
time while the batch's decoders wait), scaled by ``preemption.costFactor``.

:class:`Preemptor` is the stage: it picks the challengers and victims from the group.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from jitserve.policy import PreemptionSettings, SLOPolicySpec
from jitserve.requests import LiveRequest
from jitserve.scheduling.frame import Frame


@dataclass(frozen=True, slots=True)
class SwapPrice:
    """What a swap gains and costs over one frame: ``slot_s``, the engine time one batch
    slot holds; ``token_s``, the measured time per token of recomputed context;
    ``token_rate``, the batch's tokens per second that stall meanwhile; ``cost_factor``,
    ``preemption.costFactor``."""

    slot_s: float
    token_s: float
    token_rate: float
    cost_factor: float


def choose_victims(
    pairs: Iterable[tuple[LiveRequest, LiveRequest]],
    priority: Mapping[LiveRequest, float],
    price: SwapPrice,
) -> list[LiveRequest]:
    """The victims of the (challenger, victim) ``pairs`` whose swap pays off: the best
    challengers (waiting group members that find no free slot) paired with the worst
    victims (running requests outside the group)."""
    out = []
    for challenger, victim in pairs:
        gain = (priority[challenger] - priority[victim]) * price.slot_s
        stall_s = victim.context_tokens * price.token_s
        if gain > price.cost_factor * stall_s * price.token_rate:
            out.append(victim)
    return out


class Preemptor:
    """Correct scheduling errors: a running request outside the group that can no longer
    earn goodput gives its slot to a waiting group member, when it pays. A running
    request that still can is left alone: swapping it out puts its own deadline (and,
    for a compound call, its whole program's) at risk, which the per-frame gain does not
    see."""

    name = "preempt"

    def __init__(self) -> None:
        self.settings = PreemptionSettings()
        self.frame_steps = 50

    def configure(self, spec: SLOPolicySpec) -> None:
        self.settings = spec.scheduler.preemption
        self.frame_steps = spec.scheduler.frame_steps

    def run(self, frame: Frame) -> None:
        """Running requests outside the group and hopeless, swapped out for the waiting
        members that find no free slot, best first, when the swap pays over one frame."""
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
        frame_s = self.frame_steps * speeds.decode_s
        price = SwapPrice(frame_s / slots, speeds.token_s, slots / speeds.decode_s,
                          self.settings.cost_factor)
        pairs = zip(challengers[: self.settings.max_per_frame], victims, strict=False)
        frame.plan.preempt.extend(choose_victims(pairs, priority, price))
