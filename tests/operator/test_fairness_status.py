"""``status.fairness``: the tenants' goodput against their max-min fair shares, fleet-wide
over the recent window, from the sidecars' real metrics (issue 27)."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from jitserve.operator import sidecar_metrics as sm
from jitserve.operator.fairness_status import fairness_status
from jitserve.policy import load_policy
from jitserve.sidecar.metrics import SidecarMetrics


def sidecar_text(metrics: SidecarMetrics) -> str:
    return generate_latest(metrics.registry).decode()


def serve(metrics: SidecarMetrics, tenant: str, asked: float, earned: float) -> None:
    """What the sidecar counts for ``tenant``: its admitted requests' demand, its goodput."""
    metrics.fairness.asked(tenant, asked)
    metrics.goodput_tokens.labels(tenant, "latency", "default").inc(earned)


def test_demand_3_1_1_over_two_pods_against_max_min_shares() -> None:
    """Demand 300:100:100 over two pods, 200 goodput tokens earned: every tenant asked for
    more than a third of 200, so max-min gives each a third; a got 150, b 30, c 20."""
    pods = [SidecarMetrics(), SidecarMetrics()]
    history = sm.OutcomeHistory()
    history.add(0.0, {f"pod{i}": sm.parse_metrics(sidecar_text(m)).tenants
                      for i, m in enumerate(pods)}, 60.0)
    serve(pods[0], "a", 200, 100)
    serve(pods[1], "a", 100, 50)
    serve(pods[0], "b", 100, 30)
    serve(pods[1], "c", 100, 20)
    samples = [sm.parse_metrics(sidecar_text(m)) for m in pods]
    history.add(10.0, {f"pod{i}": s.tenants for i, s in enumerate(samples)}, 60.0)
    totals, span = history.recent()
    assert span == 10.0
    weights = [s.fairness_weight for s in samples if s.fairness_weight is not None]
    got = fairness_status(totals, load_policy({}).fairness, weights)
    assert got is not None
    by_name = {t.name: t for t in got.tenants}
    assert [t.name for t in got.tenants] == ["a", "b", "c"]
    assert by_name["a"].demand_tokens == 300 and by_name["a"].goodput_tokens == 150
    assert [by_name[t].max_min_share for t in "abc"] == pytest.approx([1 / 3] * 3, abs=1e-4)
    assert [by_name[t].goodput_share for t in "abc"] == [0.75, 0.15, 0.1]
    # Jain over received / fair = 2.25, 0.45, 0.3
    assert got.jain_index == pytest.approx(3.0**2 / (3 * (2.25**2 + 0.45**2 + 0.3**2)), abs=1e-4)
    assert got.weight_in_effect == 0.0  # the gauge: no scheduler set it, 0


def test_a_tenant_asking_little_gets_all_it_asked_as_its_share() -> None:
    """b asks 20 of 200 earned: max-min gives it 20 (0.1) and a the rest (0.9); both got
    exactly that: Jain 1. Weights count: c weighs 3 where it competes."""
    totals = {("a", "demand"): 500.0, ("a", "goodput"): 180.0,
              ("b", "demand"): 20.0, ("b", "goodput"): 20.0}
    got = fairness_status(totals, load_policy({}).fairness, [0.5, 0.5])
    assert got is not None
    assert [(t.max_min_share, t.goodput_share) for t in got.tenants] == [(0.9, 0.9), (0.1, 0.1)]
    assert got.jain_index == 1.0 and got.weight_in_effect == 0.5
    weighted = load_policy({"fairness": {"tenants": [{"name": "c", "weight": 3}]}}).fairness
    totals = {("a", "demand"): 500.0, ("a", "goodput"): 100.0,
              ("c", "demand"): 500.0, ("c", "goodput"): 100.0}
    got = fairness_status(totals, weighted, [])
    assert got is not None and got.weight_in_effect is None
    assert [t.max_min_share for t in got.tenants] == [0.25, 0.75]
    assert got.jain_index < 1.0


def test_no_goodput_in_the_window_no_fairness_figures() -> None:
    assert fairness_status({("a", "demand"): 100.0}, load_policy({}).fairness, []) is None
    assert fairness_status({}, load_policy({}).fairness, []) is None


def test_a_restarted_pod_counts_from_zero() -> None:
    """A pod whose counters went down restarted: its new totals are the window's."""
    history = sm.OutcomeHistory()
    history.add(0.0, {"pod": {("a", "demand"): 1000.0, ("a", "goodput"): 900.0}}, 60.0)
    history.add(5.0, {"pod": {("a", "demand"): 50.0, ("a", "goodput"): 40.0}}, 60.0)
    totals, _ = history.recent()
    assert totals == {("a", "demand"): 50.0, ("a", "goodput"): 40.0}
