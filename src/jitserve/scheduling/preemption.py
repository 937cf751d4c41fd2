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

from collections.abc import Mapping, Sequence

from jitserve.policy import PreemptionSettings
from jitserve.requests import LiveRequest


def choose_victims(
    challengers: Sequence[LiveRequest],
    victims: Sequence[LiveRequest],
    priority: Mapping[LiveRequest, float],
    settings: PreemptionSettings,
    slot_s: float,
    token_s: float,
    token_rate: float,
) -> list[LiveRequest]:
    """Pair the best challengers with the worst victims; keep the pairs that pay off.

    ``challengers``: waiting group members that find no free slot, best first;
    ``victims``: running requests outside the group, worst first; ``slot_s``: engine
    time one batch slot holds over a frame."""
    out = []
    for challenger, victim in zip(challengers[: settings.max_per_frame], victims, strict=False):
        gain = (priority[challenger] - priority[victim]) * slot_s
        stall_s = victim.context_tokens * token_s
        if gain > settings.cost_factor * stall_s * token_rate:
            out.append(victim)
    return out


class Preemptor:
    """Correct scheduling errors: a running request outside the group that can no longer
    earn goodput gives its slot to a waiting group member, when it pays. A running
    request that still can is left alone: swapping it out puts its own deadline (and,
    for a compound call, its whole program's) at risk, which the per-frame gain does not
    see."""

    def __init__(self, settings: PreemptionSettings) -> None:
        self.settings = settings

    def victims(
        self,
        max_running: int,
        running: Sequence[LiveRequest],
        running_priority: Sequence[float],
        outside_and_lost: Sequence[bool],
        members: Sequence[LiveRequest],
        member_priority: Sequence[float],
        frame_s: float,
        token_s: float,
        decode_s: float,
    ) -> list[LiveRequest]:
        """Running requests to swap out for waiting group members ``members``.
        ``outside_and_lost``: per running request, outside the group and hopeless;
        ``frame_s``: engine time of one frame."""
        free = max(max_running - len(running), 0)
        if len(members) <= free:
            return []
        priority = dict(zip(members, member_priority, strict=True))
        priority.update(zip(running, running_priority, strict=True))
        challengers = sorted(members, key=lambda r: -priority[r])[free:]
        victims = sorted(
            (r for r, out in zip(running, outside_and_lost, strict=True) if out),
            key=lambda r: priority[r],
        )
        slots = max(len(running), 1)
        return choose_victims(
            challengers, victims, priority, self.settings, frame_s / slots, token_s,
            slots / decode_s,
        )  # fmt: skip
