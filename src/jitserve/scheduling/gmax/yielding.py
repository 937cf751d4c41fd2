"""The fair yield (issue 27): with fairness weight f > 0, while decoding the running batch
alone takes longer per step than the running requests of the tenants at or below their
fair share need, the tenants above their share start nothing new.

Why: the fair order decides whose requests start, and the pacer and the fair preemption
keep them on pace, yet at load 1.5 the small tenants still lost a tenth of their
goodput: deadline requests that ran past their deadline, programs whose calls fell
behind. Every step carries the whole batch, and the large tenant's started work is most
of it, so its new starts keep the steps slow even though the small tenants' requests
came first. When the batch is too big for them the large tenant waits for its running
work to drain instead; once it is small enough it starts as before. It is the fair
preemption's test (:mod:`~jitserve.scheduling.gmax.preemption`: a decode-only step,
``token_s`` per running request, against the need) applied to starts: that rule makes
the over-share tenants' running work give way, this one keeps them from refilling the
batch. At f = 1 the need protected is the tightest, with smaller f a low quantile of the
needs, as the pacer's (:mod:`~jitserve.scheduling.gmax.pacing`). Measured on validation windows
1-64 at f = 1 (docs/scheduling.md, "f against max-min fair shares"): the gap to the
tenants' max-min shares closed at load 1.5 went from 72-76% to 80-83% (the mean of two
sets of 32 windows), at 2.0 from 90-93% to 97-105%.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from jitserve.policy import SLOPolicySpec
from jitserve.scheduling.frame import Frame
from jitserve.scheduling.gmax.pacing import protected_need
from jitserve.scheduling.gmax.scoring import FairShare


class FairYield:
    name = "yield"

    def __init__(self, fair: FairShare) -> None:
        self.fair = fair
        self.batch = math.inf
        """The running requests whose decode-only step meets the need protected at the
        last frame (inf: none): at or beyond it the tenants above their share wait."""

    def configure(self, spec: SLOPolicySpec) -> None:
        pass

    def run(self, frame: Frame) -> None:
        self.batch = math.inf
        f = self.fair.f
        if f <= 0 or frame.scores is None or frame.live is None or frame.speeds is None:
            return
        first = frame.first_waiting
        owed = ~self.fair.above_share(frame.live.tenant[:first]) & (frame.scores.gain[:first] > 0)
        needs = frame.scores.need_s[:first][owed]
        needs = needs[np.isfinite(needs) & (needs > 0)]
        if needs.size == 0:
            return
        self.batch = protected_need(needs, f) / max(frame.speeds.token_s, 1e-9)

    def may_start(
        self, tenant: npt.NDArray[np.int64], running: int
    ) -> npt.NDArray[np.bool_] | None:
        """Which waiting requests (``tenant``: their tenants' codes) may start beside
        ``running`` requests; None: all of them."""
        if self.fair.f <= 0 or running < self.batch:  # f may have been reloaded to 0
            return None
        return ~self.fair.above_share(tenant)
