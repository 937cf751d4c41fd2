"""The door's on-time check (jitserve.serving.forecast, driven by the lifecycle): a latency
arrival whose first token is forecast past its TTFT target, with the forecast's learned
error, is retired at once; what it learns comes from the first tokens of what it let in."""

from __future__ import annotations

import math

import pytest

from jitserve.requests import Phase, Request
from jitserve.scheduling.base import RetireReason
from jitserve.scheduling.estimators import QuantileEstimator
from jitserve.scheduling.gmax import GMAX
from jitserve.serving.forecast import (
    MEMORY_S,
    MIN_SAMPLES,
    WINDOW,
    DoorView,
    FirstTokenForecast,
)
from jitserve.serving.lifecycle import Lifecycle
from jitserve.serving.speed import SpeedMeter
from jitserve.slo import DeadlineSLO, LatencySLO
from tests.scheduling.test_refined_while_waiting import NullExecutor


def test_forecast_counts_the_slots_that_must_free_first() -> None:
    door = FirstTokenForecast()
    door.held_slot(2.0)
    free = DoorView(ahead=0, running=3, max_running=4, prefill_s=0.1)
    assert door.forecast_s(free) == pytest.approx(0.1)  # a free slot: its prefill alone
    # 4 running in 4 slots, 2 more inside the engine, 5 waiting ahead: 8 slots must free,
    # one every 2.0 / 4 s
    busy = DoorView(ahead=5, running=6, max_running=4, prefill_s=0.1)
    assert door.forecast_s(busy) == pytest.approx(8 * 0.5 + 0.1)


def test_margin_is_the_quantile_of_the_observed_error() -> None:
    door = FirstTokenForecast(quantile=0.9)
    for _ in range(MIN_SAMPLES - 1):
        door.observed(1.0, 1.5, 0.0)
    assert door.margin_s() == 0.0  # too few first tokens yet: the forecast as it is
    for took in [1.0] * 50 + [1.5] * 50:
        door.observed(1.0, took, 0.0)
    assert door.margin_s() == pytest.approx(0.5)
    assert not door.late(1.45, 2.0, 0.0)  # 1.95 s
    assert door.late(1.55, 2.0, 0.0)  # 2.05 s
    assert door.refused == 1
    # a forecast of 30 ms that took 300 ms is 0.27 s late, not "10x": forecasts near the
    # target are not scaled by it
    small = FirstTokenForecast(quantile=0.9)
    for _ in range(100):
        small.observed(0.03, 0.3, 0.0)
    assert small.margin_s() == pytest.approx(0.27)
    assert not small.late(1.7, 2.0, 0.0)
    assert not FirstTokenForecast(quantile=0.0).late(100.0, 1.0, 0.0)  # no door check


def test_a_margin_learned_in_a_burst_does_not_shut_the_door_for_good() -> None:
    """Every arrival refused means no first token to correct the margin: the residuals
    age out after MEMORY_S and the forecast is trusted again (it had locked every latency
    request out of a live sidecar, run after run)."""
    door = FirstTokenForecast(quantile=0.9)
    for i in range(WINDOW):  # a burst: every first token 5 s later than forecast
        door.observed(0.1, 5.1, i * 0.01)
    assert door.margin_s() == pytest.approx(5.0)
    last = (WINDOW - 1) * 0.01
    # the engine has room again (forecast 0.1 s): still refused while the burst is recent
    assert door.late(0.1, 2.0, last + MEMORY_S / 2)
    assert door.margin_s() == pytest.approx(5.0)
    # no first token has come since: the burst ages out and the door opens
    assert not door.late(0.1, 2.0, last + MEMORY_S + 1.0)
    assert door.margin_s() == 0.0 and door.describe()["samples"] == 0
    # and it learns again from what it lets in
    for i in range(MIN_SAMPLES):
        door.observed(0.1, 0.4, last + MEMORY_S + 2.0 + i)
    assert door.margin_s() == pytest.approx(0.3)


def _lifecycle(max_running: int, quantile: float = 0.9) -> Lifecycle:
    lc = Lifecycle(GMAX(), QuantileEstimator(0.95), NullExecutor(), SpeedMeter(0.03, 1e-4, 1e-4))
    lc.max_running = max_running
    lc.door.quantile = quantile
    lc.door.held_slot(1.0)
    return lc


def _chat(i: int, at: float, ttft_s: float = 2.0) -> Request:
    return Request(f"r{i}", "t", LatencySLO(ttft_s, 0.1), 100, at, max_tokens=100)


def test_an_arrival_that_would_start_late_is_retired_at_the_door() -> None:
    lc = _lifecycle(max_running=2)
    for i in range(2):
        lc.arrive(_chat(i, 0.0), 0.0)
        lc.start_next(0.0)
    assert len(lc.running) == 2
    admitted = [lc.arrive(_chat(i, 0.0), 0.0) for i in range(2, 5)]
    assert all(r.phase is Phase.WAITING for r in admitted)  # 1, 2, 3 slots ahead: 0.5-1.5 s
    late = lc.arrive(_chat(5, 0.0), 0.0)  # 4 slots must free: 2.0 s + its prefill
    assert late.phase is Phase.RETIRED
    assert [g.reason for g in lc.refused] == [RetireReason.WOULD_START_LATE]
    assert lc.refused[0].outcome is not None and not lc.refused[0].outcome.met
    assert lc.ledger.overall.retired == 1
    loose = lc.arrive(_chat(6, 0.0, ttft_s=10.0), 0.0)  # the same queue, a looser target
    assert loose.phase is Phase.WAITING and lc.refused == []
    off = _lifecycle(max_running=2, quantile=0.0)
    for i in range(8):
        off.arrive(_chat(i, 0.0), 0.0)
    assert len(off.waiting) == 8


def test_only_the_requests_the_policy_puts_first_count_as_ahead() -> None:
    lc = _lifecycle(max_running=1)
    lc.arrive(_chat(0, 0.0), 0.0)
    lc.start_next(0.0)
    for i in range(20):  # deadline work an hour out waits behind latency requests
        lc.arrive(Request(f"d{i}", "t", DeadlineSLO(3600.0), 100, 0.0, max_tokens=100), 0.0)
    urgent = lc.arrive(_chat(99, 0.0), 0.0)
    assert urgent.phase is Phase.WAITING
    assert lc.policy.ahead_of(urgent) == 0
    assert lc.door.last_forecast_s < 2.0


def test_the_error_is_learned_from_first_tokens() -> None:
    lc = _lifecycle(max_running=1)
    r = lc.arrive(_chat(0, 0.0), 0.0)
    forecast = lc.door.last_forecast_s
    assert math.isfinite(forecast) and forecast > 0
    lc.start_next(0.0)
    lc.delivered(r, 3 * forecast, 0)
    assert lc.door.describe()["samples"] == 1
    assert lc.door.describe()["residual_p50_s"] == pytest.approx(2 * forecast)


@pytest.mark.parametrize("preemption", [True, False])
def test_running_work_the_policy_would_preempt_does_not_hold_a_slot(preemption: bool) -> None:
    lc = _lifecycle(max_running=2)
    lc.door.others_yield = preemption
    lc.door.slot_s = 10.0  # slots free slowly: a wait for one is past a 2 s TTFT
    for i in range(2):
        lc.arrive(Request(f"d{i}", "t", DeadlineSLO(3600.0), 100, 0.0, max_tokens=100), 0.0)
        lc.start_next(0.0)
    urgent = lc.arrive(_chat(0, 0.0), 0.0)
    assert (urgent.phase is Phase.WAITING) == preemption
