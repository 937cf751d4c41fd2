"""Traffic whose rate moves: the warp keeps every item and its order and puts the rate
where the shape says."""

from __future__ import annotations

import numpy as np
import pytest

from jitserve.requests import Request
from jitserve.sim.traffic import RateShape
from jitserve.sim.workload import WorkloadSpec, generate
from jitserve.slo import DeadlineSLO


def test_shapes_relative_to_their_peak() -> None:
    day = RateShape("day", 1000.0)
    assert day.relative_at(0.0) == pytest.approx(0.2)
    assert day.relative_at(500.0) == pytest.approx(1.0)
    assert day.mean == pytest.approx(0.6, abs=1e-3)
    bursts = RateShape("bursts", 3600.0)
    assert bursts.relative_at(100.0) == pytest.approx(0.4)
    assert bursts.relative_at(0.5 * 3600 + 90) == pytest.approx(1.0)
    assert 0.45 < bursts.mean < 0.55


def test_unknown_shape_and_bad_duration_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown traffic shape 'weekly'"):
        RateShape("weekly", 100.0)
    with pytest.raises(ValueError, match="duration must be positive"):
        RateShape("day", 0.0)


def test_warp_keeps_items_and_order_and_follows_the_day() -> None:
    shape = RateShape("day", 1000.0)
    items = [Request(f"r{i}", "t", DeadlineSLO(10.0), 10, i * 0.1, output_tokens=5)
             for i in range(10000)]  # a uniform 10/s over 1000 s
    warped = list(shape.warp(items))
    assert [w.request_id for w in warped] == [i.request_id for i in items]  # type: ignore[union-attr]
    times = np.array([w.arrival_s for w in warped])
    assert np.all(np.diff(times) >= 0) and times[-1] <= 1000.0
    # arrivals per 100 s: the middle decile at the peak, 5x the first at the trough
    counts = np.histogram(times, bins=10, range=(0, 1000))[0]
    expected = [shape.relative(np.linspace(a, a + 100, 101)).mean() for a in range(0, 1000, 100)]
    expected_counts = np.array(expected) / np.sum(expected) * len(items)
    assert np.allclose(counts, expected_counts, rtol=0.02, atol=3)
    assert counts[4] > 3.5 * counts[0]


def test_warp_of_a_drawn_workload_keeps_programs_whole() -> None:
    spec = WorkloadSpec(trace="azure-conv", rate_per_s=5.0, duration_s=200.0, seed=3)
    drawn = list(generate(spec))
    warped = list(RateShape("bursts", 200.0).warp(generate(spec)))
    assert len(warped) == len(drawn)
    assert [type(w) for w in warped] == [type(d) for d in drawn]
