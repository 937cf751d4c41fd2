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

import numpy as np

from jitserve.scheduling.baselines import next_token_due
from jitserve.scheduling.baselines.keyed import KeyedPolicy, KeyInput
from jitserve.scheduling.table import FloatArray

SAFEGUARD_URGENCY = 0.5
URGENCY_LEVELS = 10
_LEVEL = 1e12
_BUCKET = 1e9


class SlidingServe(KeyedPolicy):
    name = "slidingserve"
    rekey_every_frame = True

    def keys(self, batch: KeyInput) -> FloatArray:
        remaining = np.maximum(batch.features.prefill_left, 0.0)
        slack = next_token_due(batch.features) - batch.now_s
        need = remaining * batch.speeds.prefill_s
        late = (slack <= 0) | (need > slack)
        with np.errstate(divide="ignore", invalid="ignore"):
            urgency = np.where(late, 0.0, need / np.where(late, 1.0, slack))
        level = np.where(urgency >= SAFEGUARD_URGENCY, 0.0, 1.0)
        bucket = URGENCY_LEVELS - np.minimum(URGENCY_LEVELS, np.floor(urgency * URGENCY_LEVELS))
        on_time = level * _LEVEL + bucket * _BUCKET + remaining
        return np.where(late, 2 * _LEVEL + remaining, on_time)
