"""SlidingServe's multi-level priority sorter (arXiv 2606.05933, §4.1) as a policy: the key
is :func:`jitserve.scheduling.budget.sorter.sorter_keys` (safeguarded requests first, then
by urgency tenths and shortest remaining prefill, requests that can no longer meet their
first-token or deadline target last), with each request's remaining prefill timed at the
observed prompt rate.

Decodes are not ranked here: they keep their place in the batch, and the budget rule
(:mod:`jitserve.scheduling.budget`, ``sliding`` for SlidingChunker) reserves their tokens
first. ``slidingserve-ac`` runs it inside GMAX's overload control, like the other ``-ac``
policies.
"""

from __future__ import annotations

import numpy as np

from jitserve.scheduling.baselines import next_token_due
from jitserve.scheduling.baselines.keyed import KeyedPolicy, KeyInput
from jitserve.scheduling.budget.sorter import sorter_keys
from jitserve.scheduling.table import FloatArray


class SlidingServe(KeyedPolicy):
    name = "slidingserve"
    rekey_every_frame = True

    def keys(self, batch: KeyInput) -> FloatArray:
        remaining = np.maximum(batch.features.prefill_left, 0.0)
        slack = next_token_due(batch.features) - batch.now_s
        return sorter_keys(remaining, slack, remaining * batch.speeds.prefill_s)
