"""SlidingServe's multi-level priority sorter (arXiv 2606.05933, §4.1) as a policy.

Waiting requests are ranked in three levels, lower first:

0. *SLO-safeguarded*: requests that can still meet their first-token (or deadline) target
   but are at risk: their remaining prefill at the observed prompt rate takes at least
   ``SAFEGUARD_URGENCY`` of their slack;
1. the other requests that can still meet it, by *urgency* (remaining prefill time over
   slack, in tenths: higher first), then *shortest remaining prefill*;
2. requests that can no longer meet it, shortest remaining prefill first: served after
   every request still on time, they do not block new arrivals (the failure mode the
   paper ascribes to EDF under long prompts).

Decodes are not ranked here: they keep their place in the batch, and the budget rule
(:mod:`jitserve.scheduling.budget`, ``sliding`` for SlidingChunker) reserves their tokens
first. ``slidingserve-ac`` runs it inside GMAX's overload control, like the other ``-ac``
policies.
"""

from __future__ import annotations

import math

from jitserve.requests import LiveRequest
from jitserve.scheduling.base import EngineView, FramePlan, KeyedPolicy
from jitserve.scheduling.slack import next_token_due_s

SAFEGUARD_URGENCY = 0.5
URGENCY_LEVELS = 10
_LEVEL = 1e12
_BUCKET = 1e9


class SlidingServe(KeyedPolicy):
    name = "slidingserve"
    rekey_every_frame = True

    def __init__(self) -> None:
        super().__init__()
        self._prefill_s = 1e-4

    def frame(self, view: EngineView) -> FramePlan:
        self._prefill_s = view.prefill_s_per_token
        return super().frame(view)

    def key(self, r: LiveRequest, now_s: float) -> float:
        remaining = max(0, r.prefill_target - r.prefilled)
        slack = next_token_due_s(r) - now_s
        need = remaining * self._prefill_s
        if slack <= 0 or need > slack:
            return 2 * _LEVEL + remaining
        urgency = need / slack
        level = 0 if urgency >= SAFEGUARD_URGENCY else 1
        bucket = URGENCY_LEVELS - min(URGENCY_LEVELS, math.floor(urgency * URGENCY_LEVELS))
        return level * _LEVEL + bucket * _BUCKET + remaining
