"""GMAX's scorer stage: every live request's priority, with the tenants' fair-share
claims blended in (paper section 4.2; DESIGN.md "GMAX scheduler").

:class:`Score` reads the measured speeds off the frame's engine view, scores the running
requests and the waiting table's rows in one array pass
(:func:`~jitserve.scheduling.gmax.priorities.score_features`: goodput per unit of engine
time, aged by ``delta`` per frame waited) and writes the priorities back: into the
table's ``priority`` column for the waiting, into :class:`~jitserve.scheduling.frame.Kept`
for the running. With fairness weight ``f``, :class:`FairShare` (the one owner of ``f``)
blends ``(1 - f) * priority + f * 2 * median * Fair(tenant)``, so the blend stays in
goodput units (preemption compares it with a token cost) and a tenant at its
entitlement weighs one median priority.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from jitserve.fairshare import DecayedBooks
from jitserve.policy import FairnessSettings, SLOPolicySpec
from jitserve.scheduling.estimators.remaining import normal_quantile
from jitserve.scheduling.frame import Frame
from jitserve.scheduling.gmax.priorities import MIN_TIME_S, ScoreAt, score_features
from jitserve.scheduling.scores import Scores, Speeds
from jitserve.scheduling.table import Features, TenantCodes, features_of

FloatArray = npt.NDArray[np.float64]
FAIR_TIE = 0.01
"""Weight of the goodput priority inside the fair-share term (orders a tenant's requests)."""


AT_SHARE = 0.5
"""A tenant's claim at exactly its fair share (:func:`jitserve.fairshare.fair_claims`)."""


class FairShare:
    """The scorer's fairness blend: each tenant's claim on its max-min share of the
    (decayed) service, scaled by twice the median live priority."""

    def __init__(self) -> None:
        self.f = 0.0
        """The fairness weight in effect (0 with ``mechanisms.fairness`` off)."""
        self.settings = FairnessSettings()
        self.books = DecayedBooks()
        """Each tenant's demand and the service it was given (credited at its requests'
        starts), decayed over ``fairness.windowSeconds``."""
        self.claims: FloatArray = np.zeros(0)
        """Per tenant code, from the last frame (1 for a tenant not seen then)."""
        self.scale = 0.0

    def configure(self, spec: SLOPolicySpec) -> None:
        on = spec.scheduler.mechanisms.fairness
        self.f, self.settings = (spec.fairness.weight if on else 0.0), spec.fairness

    def decay(self, now_s: float) -> None:
        self.books.decay(now_s, self.settings.window_seconds)

    def update(self, tenant: npt.NDArray[np.int64], codes: TenantCodes, median: float) -> None:
        """New claims for the tenants of the live requests (``tenant``: their codes)."""
        if self.f <= 0:
            self.claims = np.zeros(0)
            return
        live = [codes.names[c] for c in np.unique(tenant).tolist()]
        weights = {t: self.settings.weight_of(t) for t in live}
        by_name = self.books.claims(live, weights)
        self.claims = np.array([by_name.get(name, 1.0) for name in codes.names])
        self.scale = 2.0 * median

    def claim_of(self, tenant: npt.NDArray[np.int64]) -> FloatArray:
        claims = self.claims
        if claims.size < int(tenant.max(initial=-1)) + 1:
            claims = np.concatenate([claims, np.ones(int(tenant.max()) + 1 - claims.size)])
            self.claims = claims
        return claims[tenant]

    def below_share(self, tenant: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Per request (``tenant``: their codes): is its tenant below its fair share (a
        claim above one half)? Read with f > 0: at f = 0 there are no claims."""
        return self.claim_of(tenant) > AT_SHARE

    def above_share(self, tenant: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Per request: is its tenant above its fair share (a claim below one half)?"""
        return self.claim_of(tenant) < AT_SHARE

    def blend(
        self,
        priority: FloatArray,
        tenant: npt.NDArray[np.int64],
        hopeless: npt.NDArray[np.bool_],
    ) -> FloatArray:
        """Priority with the claims blended in (f > 0). A request that can earn nothing
        gets no claim: fairness shares goodput, and it has none to give."""
        f = self.f
        if f <= 0 or priority.size == 0:
            return priority
        claims = self.claim_of(tenant) * ~hopeless
        return (1 - f) * priority + f * (self.scale * claims + FAIR_TIE * priority)


class Score:
    """The first of GMAX's stages: speeds, scores and (fair) priorities of the live
    requests."""

    name = "score"

    def __init__(self, fair: FairShare) -> None:
        self.fair = fair
        self.speeds = Speeds()
        self.median_priority = 1.0
        """The median live priority at the last frame: the scale of aging and fairness."""
        self.spec = SLOPolicySpec()

    def configure(self, spec: SLOPolicySpec) -> None:
        self.spec = spec
        self.speeds.z_q = normal_quantile(spec.scheduler.length_quantile)
        self.fair.configure(spec)

    def score(self, features: Features, now_s: float) -> Scores:
        """Scores of requests given by their features at the last frame's speeds (an
        arrival is scored alone: admission stays cheap)."""
        return score_features(
            features, ScoreAt(now_s, self.speeds, self.spec, self.median_priority)
        )

    def run(self, frame: Frame) -> None:
        view, queue, kept = frame.view, frame.queue, frame.kept
        now = view.now_s
        speeds = self.speeds
        speeds.decode_s = max(view.decode_step_s, MIN_TIME_S)
        speeds.prefill_s = view.prefill_s_per_token
        speeds.token_s = view.token_s or view.prefill_s_per_token
        speeds.batch = view.max_running
        speeds.slots_bind = len(view.running) + len(queue) > view.max_running
        frame.speeds = speeds
        self.fair.decay(now)
        queue.ints("waited")[:] += 1
        running = view.running
        first = len(running)
        if first + len(queue) == 0:
            return
        live = Features.concat(
            [features_of(running, kept.demoted, kept.waited, queue.tenants), queue.features()]
        )
        scores = self.score(live, now)
        self.median_priority = scores.median
        hopeless = scores.gain <= 0
        self.fair.update(live.tenant, queue.tenants, scores.median)
        priority = self.fair.blend(scores.priority, live.tenant, hopeless)
        for r, p in zip(running, priority[:first].tolist(), strict=True):
            kept.priority[r] = p
        queue.floats("priority")[:] = priority[first:]
        frame.live, frame.scores = live, scores
        frame.priority, frame.hopeless = priority, hopeless
