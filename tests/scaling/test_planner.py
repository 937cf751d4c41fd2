"""jitserve's pool planner: it sizes from the forecast rate, adds replicas one warm-up
ahead of a ramp, learns its utilization from attainment, and removes replicas only after
its stabilization window."""

from __future__ import annotations

import pytest

from jitserve.policy.autoscaling import AutoscalingSettings
from jitserve.scaling import planner as planner_module
from jitserve.scaling.planner import SLOPlanner, trend
from jitserve.scaling.signals import PoolSignals
from jitserve.slo import SLOKind

PERIOD = 15.0


@pytest.fixture
def no_headroom(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forecasts without the noise headroom, for exact figures."""
    monkeypatch.setattr(planner_module, "HEADROOM_Z", 0.0)


def planner(**fields: object) -> SLOPlanner:
    settings = AutoscalingSettings.model_validate(
        {"enabled": True, "maxReplicas": 50, "utilization": 0.5, "replicaCapacity": 2.0,
         **fields}
    )
    return SLOPlanner(settings)


def period(at: float, rate: float, ready: int, warming: int = 0, finished: int = 0,
           met: int = 0, queued: int = 0) -> PoolSignals:
    return PoolSignals(
        at_s=at, period_s=PERIOD, ready=ready, warming=warming, arrived=round(rate * PERIOD),
        finished={SLOKind.LATENCY: finished} if finished else {},
        met={SLOKind.LATENCY: met} if finished else {}, queued=queued,
    )


def test_trend_of_a_line_and_of_too_few_points() -> None:
    from collections import deque

    assert trend(deque([(0.0, 1.0), (10.0, 3.0), (20.0, 5.0)])) == pytest.approx((10, 3, 0.2, 0))
    assert trend(deque([(0.0, 1.0), (10.0, 3.0)]))[2] == 0.0


def test_a_steady_rate_is_sized_at_the_utilization() -> None:
    p = planner()
    for i in range(1, 10):
        decision = p.decide(period(i * PERIOD, rate=4.0, ready=4))
    # 4/s over 2/s per replica at utilization 0.5: 4 replicas
    assert decision.desired == 4


@pytest.mark.usefixtures("no_headroom")
def test_a_ramp_is_met_one_warm_up_ahead() -> None:
    p = planner(warmupSeconds=60)
    rates = [2.0 + 0.01 * i * PERIOD for i in range(1, 10)]  # +0.01/s every second
    for i, rate in enumerate(rates, start=1):
        decision = p.decide(period(i * PERIOD, rate=rate, ready=2))
    level, forecast = p.forecast(9 * PERIOD)
    assert forecast == pytest.approx(level + 0.01 * (60 + PERIOD), rel=0.02)
    # sized for the forecast, not the level
    assert decision.desired == -(-forecast // (2.0 * 0.5))
    assert decision.desired > -(-level // (2.0 * 0.5))


@pytest.mark.usefixtures("no_headroom")
def test_a_burst_is_not_projected_past_a_quarter_above_its_peak() -> None:
    p = planner(warmupSeconds=60)
    for i, rate in enumerate([2.0, 2.0, 6.0, 10.0], start=1):
        p.decide(period(i * PERIOD, rate=rate, ready=2))
    _, forecast = p.forecast(4 * PERIOD)
    assert forecast == pytest.approx(12.5)


@pytest.mark.usefixtures("no_headroom")
def test_a_big_step_is_sized_as_a_ramp_going_on_and_a_small_one_at_its_level() -> None:
    """A step of half the line or more (a burst's ramp caught part-way through a period)
    is sized as rising by as much again; a smaller step from its own level."""
    big, small = planner(warmupSeconds=60), planner(warmupSeconds=60)
    for i in range(1, 6):
        big.decide(period(i * PERIOD, rate=4.0, ready=4))
        small.decide(period(i * PERIOD, rate=4.0, ready=4))
    decision = big.decide(period(6 * PERIOD, rate=8.0, ready=4))
    assert big.forecast(6 * PERIOD) == pytest.approx((8.0, 12.0))
    assert decision.desired == 12  # 12/s over 2/s per replica at utilization 0.5, at once
    small.decide(period(6 * PERIOD, rate=5.6, ready=4))  # a step (> 30%), not half the line
    level, forecast = small.forecast(6 * PERIOD)
    assert level == pytest.approx(5.6)
    assert forecast < 5.6 + 1.6


def test_noisy_traffic_gets_headroom_and_steady_traffic_none() -> None:
    steady, noisy = planner(), planner()
    for i in range(1, 9):
        steady.decide(period(i * PERIOD, rate=6.0, ready=6))
        noisy.decide(period(i * PERIOD, rate=3.0 if i % 2 else 9.0, ready=6))
    assert steady.forecast(8 * PERIOD)[1] == pytest.approx(6.0)
    assert noisy.forecast(8 * PERIOD)[1] > 6.0 + 0.5 * planner_module.HEADROOM_Z * 3.0


def test_a_miss_while_the_pool_lagged_its_plan_leaves_the_utilization() -> None:
    p = planner()
    # 8/s on 4 replicas of 2/s: load 1.0, above the planned 0.5 (a ramp outran warm-up)
    p.decide(period(PERIOD, rate=8.0, ready=4, finished=100, met=60))
    assert p.utilization == pytest.approx(0.5)


def test_a_miss_cuts_the_utilization_and_spends_the_evidence() -> None:
    p = planner()
    p.decide(period(PERIOD, rate=4.0, ready=4, finished=100, met=90))
    # 0.90 against 0.95 at the planned load: a miss of 0.05 cuts the utilization by 10%
    assert p.utilization == pytest.approx(0.45)
    p.decide(period(2 * PERIOD, rate=4.0, ready=5, finished=100, met=50))
    # a miss of 0.45 (now on 5 replicas, still at the planned load) cuts by at most 20%
    assert p.utilization == pytest.approx(0.36)
    # the same minute's misses are not counted twice
    p.decide(period(3 * PERIOD, rate=4.0, ready=6, finished=5, met=5))
    assert p.utilization == pytest.approx(0.36)


def test_utilization_rises_only_while_loaded_and_on_target() -> None:
    idle = planner()
    for i in range(1, 4):  # a quarter loaded: no evidence that more would hold
        idle.decide(period(i * PERIOD, rate=2.0, ready=4, finished=50, met=50))
    assert idle.utilization == pytest.approx(0.5)
    loaded = planner()
    for i in range(1, 4):  # at its utilization, on target
        loaded.decide(period(i * PERIOD, rate=4.0, ready=4, finished=50, met=50))
    assert loaded.utilization == pytest.approx(0.53)


@pytest.mark.usefixtures("no_headroom")
def test_scale_down_waits_for_its_window_and_never_while_warming() -> None:
    p = planner(scaleDownStabilizationSeconds=60)
    for i in range(1, 5):
        p.decide(period(i * PERIOD, rate=8.0, ready=8))
    downs = [p.decide(period(i * PERIOD, rate=2.0, ready=8)).desired for i in range(5, 12)]
    assert downs[0] == 8  # the window still holds the 8
    assert downs[-1] == 2
    p2 = planner()
    p2.decide(period(PERIOD, rate=8.0, ready=8))
    assert p2.decide(period(2 * PERIOD, rate=0.5, ready=4, warming=4)).desired == 8


def test_bounds_and_a_queue_backlog() -> None:
    p = planner(minReplicas=2, maxReplicas=6)
    assert p.decide(period(PERIOD, rate=0.0, ready=2)).desired == 2
    assert p.decide(period(2 * PERIOD, rate=100.0, ready=2)).desired == 6
    q = planner()
    quiet = q.decide(period(PERIOD, rate=2.0, ready=2)).desired
    # 240 queued items drain in a minute on two more replicas' capacity
    assert q.decide(period(2 * PERIOD, rate=2.0, ready=2, queued=240)).desired == quiet + 2


def test_settings_refuse_min_above_max_and_a_planner_without_capacity() -> None:
    with pytest.raises(ValueError, match="minReplicas"):
        AutoscalingSettings.model_validate({"minReplicas": 5, "maxReplicas": 2})
    with pytest.raises(ValueError, match="replicaCapacity: required"):
        AutoscalingSettings.model_validate({"enabled": True})
    with pytest.raises(ValueError, match=r"needs autoscaling\.replicaCapacity"):
        SLOPlanner(AutoscalingSettings())
