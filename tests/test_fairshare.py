"""Max-min fair shares (water-filling by weight) and Jain's index (issue 27)."""

from __future__ import annotations

import pytest

from jitserve.fairshare import jain_index, max_min_shares
from jitserve.policy import load_policy
from jitserve.sidecar.fairness_window import FairnessWindow


def test_capacity_beyond_demand_serves_every_tenant_its_demand() -> None:
    assert max_min_shares({"a": 30, "b": 10}, {}, 100) == {"a": 30, "b": 10}


def test_water_filling_gives_the_small_tenant_its_demand_and_splits_the_rest() -> None:
    # demand 3:1:1 over capacity 3: b and c ask 1 each (under the level 1), a gets 1
    shares = max_min_shares({"a": 3.0, "b": 1.0, "c": 1.0}, {}, 3.0)
    assert shares == pytest.approx({"a": 1.0, "b": 1.0, "c": 1.0})
    # capacity 4: b and c satisfied, a takes the 2 they leave
    shares = max_min_shares({"a": 3.0, "b": 1.0, "c": 1.0}, {}, 4.0)
    assert shares == pytest.approx({"a": 2.0, "b": 1.0, "c": 1.0})
    # a small tenant under the level keeps its demand; two big ones split the rest evenly
    shares = max_min_shares({"a": 10.0, "b": 10.0, "c": 0.5}, {}, 6.0)
    assert shares == pytest.approx({"a": 2.75, "b": 2.75, "c": 0.5})
    assert sum(shares.values()) == pytest.approx(6.0)


def test_weights_scale_the_level() -> None:
    shares = max_min_shares({"a": 10.0, "b": 10.0}, {"a": 3.0, "b": 1.0}, 4.0)
    assert shares == pytest.approx({"a": 3.0, "b": 1.0})
    # a weighted tenant that asks for less gives the rest to the other
    shares = max_min_shares({"a": 1.0, "b": 10.0}, {"a": 3.0, "b": 1.0}, 4.0)
    assert shares == pytest.approx({"a": 1.0, "b": 3.0})


def test_jain_index_bounds() -> None:
    assert jain_index([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0, 0.0]) == pytest.approx(1 / 3)
    assert jain_index([]) == 1.0 and jain_index([0.0, 0.0]) == 1.0
    assert 1 / 3 < jain_index([1.0, 0.5, 0.2]) < 1.0


def test_the_sidecars_window_measures_goodput_against_max_min_shares() -> None:
    now = [0.0]
    window = FairnessWindow(lambda t: t, clock=lambda: now[0])
    window.settings = load_policy({"fairness": {"windowSeconds": 60}}).fairness
    assert window.shares() is None  # no goodput yet: nothing to say
    # demand 3:1:1 in tokens asked; 300 goodput tokens earned, a got them all
    for tenant, asked in (("a", 300.0), ("b", 100.0), ("c", 100.0)):
        window.asked(tenant, asked)
    window.earned("a", 300.0)
    figures = window.shares()
    assert figures is not None
    fair, got, jain = figures
    assert fair == pytest.approx({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3})
    assert got == pytest.approx({"a": 1.0, "b": 0.0, "c": 0.0})
    assert jain == pytest.approx(1 / 3)
    window.earned("b", 100.0)
    window.earned("c", 100.0)
    window.earned("a", -0.0)
    fair, got, jain = window.shares() or ({}, {}, 0.0)
    assert jain == pytest.approx(jain_index([300 / 300, 100 / 100, 100 / 100]))
    now[0] = 61.0  # everything left the window
    assert window.shares() is None
