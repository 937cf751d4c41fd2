"""llm-d's SLO-aware KEDA rule, as published, with the HorizontalPodAutoscaler it drives:
the baseline jitserve's planner is measured against.

Source: llm-d's "SLO-Aware Autoscaling with KEDA — the control law"
(``docs/architecture/autoscaling/slo-aware-keda.md`` in llm-d/llm-d), steps 1-3:

1. every 15 s, ``s_raw = max(P90 TTFT / S_ttft, P90 TPOT / S_tpot)`` (0 with no traffic),
   clamped at ``C = 2`` and averaged over 45 s;
2. with ``n`` provisioned and ``r`` ready replicas and the in-flight credit
   ``c = r / n`` (when ``0 < r < n``, else 1): above ``θ_up = 0.55``,
   ``d = n + ceil(n (s c / θ_up - 1))``; below ``θ_dn = 0.40``,
   ``d = n - floor(n (1 - s / θ_dn))``; else ``d = n``;
3. the KEDA-generated HPA: ``d`` clipped to [min, max], its 10% tolerance, a 30 s
   scale-up stabilization window (min over it) and 180 s scale-down window (max over
   it), scale-up at most ``max(100 %, 4 pods)`` per 60 s, scale-down 1 pod per 120 s.

The P90s are of measured latencies (the guide's fallback when the EPP's predictor is off),
pool-wide, over the last minute, of the latency requests only: the guide assumes one SLO
pair for all traffic, and a deadline request's long first token (its SLO is end to end)
would read as a breach and over-scale the pool; an SRE would filter the histograms to
the requests with TTFT and TPOT targets, and so does the simulator, to give the rule its
best showing.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from jitserve.scaling.signals import Decision, PoolSignals


@dataclass(frozen=True)
class KedaSLOSettings:
    ttft_target_s: float
    tpot_target_s: float
    min_replicas: int = 1
    max_replicas: int = 8
    period_s: float = 15.0
    """The recording rules' and the HPA's evaluation interval."""
    clamp: float = 2.0
    smooth_s: float = 45.0
    up_threshold: float = 0.55
    down_threshold: float = 0.40
    tolerance: float = 0.1
    up_stabilization_s: float = 30.0
    down_stabilization_s: float = 180.0
    up_period_s: float = 60.0
    up_pods: int = 4
    up_percent: float = 100.0
    down_period_s: float = 120.0
    down_pods: int = 1


class KedaSLORule:
    name = "keda-slo"

    def __init__(self, settings: KedaSLOSettings) -> None:
        self.settings = settings
        self.period_s = settings.period_s
        self._samples: deque[tuple[float, float]] = deque()
        self._recommendations: deque[tuple[float, int]] = deque()
        self._changes: deque[tuple[float, int]] = deque()
        """(time, replicas added (> 0) or removed (< 0)) for the HPA's rate policies."""

    def saturation(self, signals: PoolSignals) -> float:
        """``s``: the clamped, smoothed worst-of-two latency ratio."""
        k = self.settings
        raw = 0.0
        if signals.p90_ttft_s is not None:
            raw = max(raw, signals.p90_ttft_s / k.ttft_target_s)
        if signals.p90_tpot_s is not None:
            raw = max(raw, signals.p90_tpot_s / k.tpot_target_s)
        if math.isnan(raw):
            raw = 0.0
        now = signals.at_s
        self._samples.append((now, min(raw, k.clamp)))
        while self._samples and self._samples[0][0] <= now - k.smooth_s:
            self._samples.popleft()
        return sum(v for _, v in self._samples) / len(self._samples)

    def formula(self, s: float, provisioned: int, ready: int) -> int:
        """The ScaledObject's ``scalingModifiers`` output ``d``."""
        k = self.settings
        n = provisioned
        if s > k.up_threshold:
            credit = ready / n if 0 < ready < n else 1.0
            return n + math.ceil(n * (s * credit / k.up_threshold - 1))
        if s < k.down_threshold:
            return n - math.floor(n * (1 - s / k.down_threshold))
        return n

    def decide(self, signals: PoolSignals) -> Decision:
        k = self.settings
        now = signals.at_s
        current = signals.provisioned
        s = self.saturation(signals)
        d = self.formula(s, current, signals.ready)
        recommendation = min(max(d, k.min_replicas), k.max_replicas)
        if current > 0 and abs(recommendation / current - 1) <= k.tolerance:
            recommendation = current
        self._recommendations.append((now, recommendation))
        horizon = max(k.up_stabilization_s, k.down_stabilization_s)
        while self._recommendations[0][0] < now - horizon:
            self._recommendations.popleft()
        up = min(r for t, r in self._recommendations if t >= now - k.up_stabilization_s)
        down = max(r for t, r in self._recommendations if t >= now - k.down_stabilization_s)
        desired = current
        if current < up:
            desired = min(up, self._up_limit(now, current))
        elif current > down:
            desired = max(down, self._down_limit(now, current))
        desired = min(max(desired, k.min_replicas), k.max_replicas)
        if desired != current:
            self._changes.append((now, desired - current))
        return Decision(desired, f"s={s:.2f} d={d} (n={current}, ready={signals.ready})")

    def _changed_within(self, now: float, seconds: float, sign: int) -> int:
        while self._changes and self._changes[0][0] <= now - max(
            self.settings.up_period_s, self.settings.down_period_s
        ):
            self._changes.popleft()
        return sum(abs(c) for t, c in self._changes if t > now - seconds and c * sign > 0)

    def _up_limit(self, now: float, current: int) -> int:
        k = self.settings
        start = current - self._changed_within(now, k.up_period_s, +1)
        return start + max(k.up_pods, math.ceil(start * k.up_percent / 100))

    def _down_limit(self, now: float, current: int) -> int:
        k = self.settings
        start = current + self._changed_within(now, k.down_period_s, -1)
        return start - k.down_pods
