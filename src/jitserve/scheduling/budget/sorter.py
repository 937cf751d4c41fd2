"""SlidingServe's multi-level priority sorter (arXiv 2606.05933, §4.1): the order key (pure).

Waiting requests are ranked in three levels, lower first:

0. *SLO-safeguarded*: requests that can still meet their first-token (or deadline) target
   but are at risk: their remaining prefill takes at least ``SAFEGUARD_URGENCY`` of their
   slack;
1. the other requests that can still meet it, by *urgency* (remaining prefill time over
   slack, in tenths: higher first), then *shortest remaining prefill*;
2. requests that can no longer meet it, shortest remaining prefill first: served after
   every request still on time, they do not block new arrivals (the failure mode the
   paper ascribes to EDF under long prompts).

One key for both places the sorter runs: the ``slidingserve`` policy
(:mod:`jitserve.scheduling.baselines.slidingserve`, the simulator and the sidecar) and the
in-engine scheduler's waiting queue (:mod:`jitserve.engine.steps`).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

SAFEGUARD_URGENCY = 0.5
URGENCY_LEVELS = 10
_LEVEL = 1e12
_BUCKET = 1e9


def sorter_keys(remaining: FloatArray, slack_s: FloatArray, need_s: FloatArray) -> FloatArray:
    """Order keys (lower first) of requests with ``remaining`` prompt tokens to compute,
    ``slack_s`` until their next token is due and ``need_s`` predicted to compute them."""
    remaining = np.maximum(remaining, 0.0)
    late = (slack_s <= 0) | (need_s > slack_s)
    with np.errstate(divide="ignore", invalid="ignore"):
        urgency = np.where(late, 0.0, need_s / np.where(late, 1.0, slack_s))
    level = np.where(urgency >= SAFEGUARD_URGENCY, 0.0, 1.0)
    bucket = URGENCY_LEVELS - np.minimum(URGENCY_LEVELS, np.floor(urgency * URGENCY_LEVELS))
    on_time = level * _LEVEL + bucket * _BUCKET + remaining
    return np.asarray(np.where(late, 2 * _LEVEL + remaining, on_time), dtype=np.float64)
