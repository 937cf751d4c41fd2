"""jitserve's pool planner: replicas from the arrival rate forecast one warm-up ahead,
at a utilization learned from the SLO attainment the pool measures.

Each period (``periodSeconds``):

- **Forecast**: a least-squares line through the arrival rates of the last
  ``trendSeconds`` (one per period), read now (the level; the last minute's mean if
  higher, as after a fall the line undershoots) and ``warmupSeconds`` + one period ahead
  — a replica asked for now serves from then on — never below the level, at most 25%
  above the window's highest rate, raised by 0.3 of the rates' spread around the line. The
  line, not the last rates, so that the pool is sized for the traffic's course and its
  queue absorbs the noise; but a last rate 3 standard deviations (and 30%) above the
  line through the rates before it is a step, and becomes the level at once; a step
  of half the line or more is a ramp seen part-way (a period's rate averages its start
  with what came before), and is sized as rising by as much again.
- **Size**: ``ceil(forecast / (capacity x utilization) + queued / (capacity x 60 s))``
  within [min, max]: ``capacity`` is ``replicaCapacity``, one replica's profiled rate
  (work items/s a replica sustains saturated on this traffic, as
  :func:`jitserve.bench.capacity.measure_capacity` measures it); the queue term drains a
  backlog in a minute.
- **Learn**: over the last minute of outcomes, the worst kind's attainment against its
  target (``targetAttainment``, ``targetByKind``). Below it while the ready replicas ran
  at or under the utilization all that minute (the pool was as big as the planner meant
  it to be), the utilization falls in proportion to the miss, by at most 20%, and the
  minute's evidence is spent; a miss in a minute the pool was smaller than meant (a ramp
  outran the warm-up) says nothing of the utilization, but the backlog such a lag leaves
  counts once the pool has caught up (waiting it out was measured: docs/autoscaling.md).
  At or above target while the ready replicas ran near the utilization, it rises a step.
  So the pool settles at the load the SLOs hold at on this traffic, which a fixed latency
  threshold cannot know.
- **Move**: up at once (replicas still warming count as there); down to the highest
  recommendation of the last ``scaleDownStabilizationSeconds``, and only while none is
  warming. The pool drains what it removes (no request is cut).
"""

from __future__ import annotations

import math
from collections import deque

from jitserve.policy.autoscaling import AutoscalingSettings
from jitserve.scaling.signals import Decision, PoolSignals
from jitserve.slo import SLOKind

HEADROOM_Z = 0.3
"""The forecast is raised by this many standard deviations of the rates around the line:
bursty traffic gets headroom, smooth traffic little."""
SHIFT_Z = 3.0
SHIFT_FLOOR = 0.1
"""A period's rate more than 3 standard deviations (and 30%) above the line through the
window before it is a step: sized for at once (the line would take a window to follow),
so a step's replicas serve within one period and the warm-up."""
RAMP_STEP = 0.5
"""A step of at least half the line is sized as rising by as much again: a burst's ramp
caught part-way through a period would otherwise be met in a staircase of warm-ups."""
RECENT_S = 60.0
FEEDBACK_S = 60.0
DRAIN_S = 60.0
MIN_OUTCOMES = 20
"""Fewer outcomes in the feedback window: too few to judge attainment by."""
MIN_KIND_OUTCOMES = 5
UTILIZATION_FLOOR = 0.2
UTILIZATION_CEILING = 0.95
UTILIZATION_STEP = 0.01
MISS_GAIN = 2.0
"""A miss of 0.05 below target cuts the utilization by 10%..."""
MAX_CUT = 0.8
"""... and no miss by more than 20% at once."""
MAX_GROWTH = 1.25
"""The forecast stays within 25% above the highest rate of the trend window: a ramp's
slope is not projected a warm-up past the ramp's end."""


def trend(points: deque[tuple[float, float]]) -> tuple[float, float, float, float]:
    """Least-squares line through (t, y) points: (mean t, mean y, slope, the residuals'
    standard deviation); the slope is 0 with fewer than 3 points or no time span."""
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    rise = 0.0
    if n >= 3 and var > 0:
        rise = sum((t - mean_t) * (y - mean_y) for t, y in points) / var
    spread = sum((y - mean_y - rise * (t - mean_t)) ** 2 for t, y in points) / max(n - 1, 1)
    return mean_t, mean_y, rise, math.sqrt(spread)


class SLOPlanner:
    name = "jitserve"

    def __init__(self, settings: AutoscalingSettings) -> None:
        if settings.replica_capacity is None:
            raise ValueError("the planner needs autoscaling.replicaCapacity")
        self.settings = settings
        self.capacity_per_s = settings.replica_capacity
        self.period_s = settings.period_seconds
        self.utilization = settings.utilization
        self._rates: deque[tuple[float, float]] = deque()
        self._outcomes: deque[tuple[float, dict[SLOKind, int], dict[SLOKind, int], bool]] = (
            deque()
        )
        """(time, ended by kind, met by kind, the pool as big as planned) per period."""
        self._recommendations: deque[tuple[float, int]] = deque()

    def forecast(self, now: float) -> tuple[float, float]:
        """(level, forecast) of the arrival rate, work items/s: the trend line's value now
        (or the last minute's mean, if higher: after a fall the line undershoots) and one
        warm-up and period ahead (never below the level, at most 25% above the window's
        highest rate, but after a ramp's step at least the step again above it)."""
        mean_t, mean_y, rise, spread = trend(self._rates)
        recent = [r for t, r in self._rates if t > now - RECENT_S]
        level = max(mean_y + rise * (now - mean_t), sum(recent) / len(recent))
        ahead = mean_y + rise * (now + self.settings.warmup_seconds + self.period_s - mean_t)
        ceiling = MAX_GROWTH * max(r for _, r in self._rates)
        jump, last = self._step(now), self._rates[-1][1]
        if jump > 0:
            level = max(level, last)
        forecast = max(level, min(ahead, ceiling))
        if jump > 0 and jump >= RAMP_STEP * (last - jump):
            forecast = max(forecast, last + jump)
        return level, forecast + HEADROOM_Z * spread

    def _step(self, now: float) -> float:
        """How far the last period's rate is above the line through the ones before it,
        where that is a step (beyond SHIFT_Z of their spread, and at least SHIFT_FLOOR of
        the line): a burst the line would take a window to follow; else 0."""
        before: deque[tuple[float, float]] = deque(list(self._rates)[:-1])
        if len(before) < 3:
            return 0.0
        mean_t, mean_y, rise, spread = trend(before)
        expected = mean_y + rise * (now - mean_t)
        threshold = SHIFT_Z * max(spread, SHIFT_FLOOR * max(expected, 0.0))
        jump = self._rates[-1][1] - expected
        return jump if jump > threshold else 0.0

    def decide(self, signals: PoolSignals) -> Decision:
        k = self.settings
        now = signals.at_s
        rate = signals.arrived / signals.period_s if signals.period_s > 0 else 0.0
        self._rates.append((now, rate))
        while self._rates[0][0] <= now - k.trend_seconds:
            self._rates.popleft()
        level, forecast = self.forecast(now)
        worst = self._learn(signals, level)
        need = forecast / (self.capacity_per_s * self.utilization) + signals.queued / (
            self.capacity_per_s * DRAIN_S
        )
        raw = min(max(math.ceil(need - 1e-9), k.min_replicas), k.max_replicas)
        self._recommendations.append((now, raw))
        while self._recommendations[0][0] <= now - k.scale_down_stabilization_seconds:
            self._recommendations.popleft()
        current = signals.provisioned
        desired = current
        if raw > current:
            desired = raw
        elif signals.warming == 0 and current > k.min_replicas:
            desired = min(current, max(r for _, r in self._recommendations))
        if current < k.min_replicas:
            desired = max(desired, k.min_replicas)
        attained = "-" if worst is None else f"{worst:+.3f}"
        return Decision(
            desired,
            f"forecast {forecast:.2f}/s (level {level:.2f}/s) at utilization "
            f"{self.utilization:.2f} of {self.capacity_per_s:.2f}/s per replica, "
            f"{signals.queued} queued; worst kind vs target {attained}",
        )

    def _learn(self, signals: PoolSignals, level: float) -> float | None:
        """Adjust the utilization from the last minute's attainment; the worst kind's
        margin over its target (None: too few outcomes to judge)."""
        now = signals.at_s
        load = level / (max(signals.ready, 1) * self.capacity_per_s)
        planned = load <= self.utilization
        self._outcomes.append((now, dict(signals.finished), dict(signals.met), planned))
        while self._outcomes[0][0] <= now - FEEDBACK_S:
            self._outcomes.popleft()
        finished: dict[SLOKind, int] = {}
        met: dict[SLOKind, int] = {}
        for _, f, m, _ in self._outcomes:
            for kind, count in f.items():
                finished[kind] = finished.get(kind, 0) + count
                met[kind] = met.get(kind, 0) + m.get(kind, 0)
        if sum(finished.values()) < MIN_OUTCOMES:
            return None
        margins = [
            met[kind] / count - self.settings.target(kind)
            for kind, count in finished.items()
            if count >= MIN_KIND_OUTCOMES
        ]
        if not margins:
            return None
        worst = min(margins)
        if worst < 0 and all(p for *_, p in self._outcomes):
            cut = max(MAX_CUT, 1 + MISS_GAIN * worst)
            self.utilization = max(UTILIZATION_FLOOR, self.utilization * cut)
            self._outcomes.clear()
        elif worst >= 0 and load >= 0.9 * self.utilization:
            self.utilization = min(UTILIZATION_CEILING, self.utilization + UTILIZATION_STEP)
        return worst
