"""llm-d's SLO-aware KEDA rule as published: the saturation signal, the credited formula
and the HorizontalPodAutoscaler's tolerance, windows and rate limits."""

from __future__ import annotations

import itertools

import pytest

from jitserve.scaling.keda import KedaSLORule, KedaSLOSettings
from jitserve.scaling.signals import PoolSignals


def rule(**overrides: float) -> KedaSLORule:
    return KedaSLORule(KedaSLOSettings(ttft_target_s=2.0, tpot_target_s=0.1, min_replicas=1,
                                       max_replicas=40, **overrides))  # type: ignore[arg-type]


def signals(at: float, ready: int, warming: int = 0, ttft: float | None = None,
            tpot: float | None = None) -> PoolSignals:
    return PoolSignals(at_s=at, period_s=15.0, ready=ready, warming=warming, arrived=0,
                       p90_ttft_s=ttft, p90_tpot_s=tpot)


def test_the_signal_is_the_worse_ratio_clamped_and_averaged_over_45_s() -> None:
    r = rule()
    assert r.saturation(signals(15, 4, ttft=1.0, tpot=0.08)) == pytest.approx(0.8)
    # 90x the SLO in one sample counts as the clamp, 2.0
    assert r.saturation(signals(30, 4, ttft=180.0)) == pytest.approx((0.8 + 2.0) / 2)
    assert r.saturation(signals(45, 4)) == pytest.approx((0.8 + 2.0 + 0.0) / 3)
    # 45 s later the first two samples have left the window
    assert r.saturation(signals(75, 4)) == pytest.approx(0.0)


def test_formula_up_with_credit_down_without_and_a_band_between() -> None:
    r = rule()
    # s = 1.1: twice the up threshold -> double
    assert r.formula(1.1, provisioned=4, ready=4) == 8
    # half the pool still warming: the credit r/n halves the ask
    assert r.formula(1.1, provisioned=8, ready=4) == 8
    assert r.formula(0.5, provisioned=4, ready=4) == 4  # hysteresis band
    # s = 0.2: half the down threshold -> drop floor(4 x 0.5) = 2
    assert r.formula(0.2, provisioned=4, ready=1) == 2
    assert r.formula(0.0, provisioned=4, ready=4) == 0


def test_hpa_scales_up_at_most_max_4_pods_or_100_percent_per_minute() -> None:
    r = rule(up_stabilization_s=0.0)
    # saturated: d = 2 + ceil(2 x (2/0.55 - 1)) = 8, but the HPA adds max(4, 2) = 4
    assert r.decide(signals(15, 2, ttft=10.0)).desired == 6
    # within the same minute, no more
    assert r.decide(signals(30, 2, warming=4, ttft=10.0)).desired == 6
    # a minute on, the next burst
    assert r.decide(signals(76, 6, ttft=10.0)).desired > 6


def test_hpa_scales_down_one_pod_per_two_minutes_after_its_window() -> None:
    r = rule()
    desired = [r.decide(signals(15 * i, 6)).desired for i in range(1, 30)]
    # the 180 s window holds the first low recommendation back only while a higher one is
    # in it; from then on one pod per 120 s
    drops = [i for i in range(1, len(desired)) if desired[i] < desired[i - 1]]
    assert drops, desired
    assert all(desired[i - 1] - desired[i] == 1 for i in drops)
    assert all(b - a >= 8 for a, b in itertools.pairwise(drops))  # >= 120 s apart


def test_hpa_ignores_a_change_within_its_10_percent_tolerance() -> None:
    r = rule(up_stabilization_s=0.0)
    # s = 0.56 on 20 replicas: d = 20 + ceil(20 x 0.018) = 21, 5% above: ignored
    assert r.decide(signals(15, 20, ttft=1.12)).desired == 20
    # s = 0.8: d = 20 + ceil(20 x 0.4545) = 30, beyond the tolerance
    assert r.decide(signals(30, 20, ttft=1.6)).desired > 20


def test_bounds_clip_the_desired_count() -> None:
    r = KedaSLORule(KedaSLOSettings(2.0, 0.1, min_replicas=2, max_replicas=5,
                                    up_stabilization_s=0.0))
    assert r.decide(signals(15, 4, ttft=10.0)).desired == 5
