"""GMAX's preemption test (paper section 4.2, "Preemption to Correct Scheduling Errors").

A running request outside the group is swapped out for a waiting group member only at a
frame boundary, and only when the goodput gained over one frame beats the goodput the
swap costs. Priorities are goodput tokens per second of *engine* time, and over a frame
one batch slot holds ``frame_s / running`` of it, so the gain is
``(priority(challenger) - priority(victim)) * frame_s / running``; the cost is
``stall_s * token_rate`` (the victim's context recomputed at the measured per-token
time while the batch's decoders wait), scaled by ``preemption.costFactor``.
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
