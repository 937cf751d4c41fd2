"""The windowed attainment gauge: met / (met + missed + retired) of what ended within the
window, per kind, tenant and class; other endings and old ones are not counted."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from jitserve.sidecar.attainment import AttainmentWindow


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_the_ratio_counts_met_missed_and_retired_only() -> None:
    clock = Clock()
    window = AttainmentWindow(60, clock)
    for outcome in ("met", "met", "missed", "retired", "cancelled", "ttl_expired", "error"):
        window.record("latency", "team-a", "default", outcome)
    window.record("deadline", "team-a", "default", "met")
    assert window.values() == {("latency", "team-a", "default"): 0.5,
                               ("deadline", "team-a", "default"): 1.0}


def test_what_ended_before_the_window_leaves_it() -> None:
    clock = Clock()
    window = AttainmentWindow(60, clock)
    window.record("latency", "t", "c", "missed")
    clock.t += 30
    window.record("latency", "t", "c", "met")
    assert window.values() == {("latency", "t", "c"): 0.5}
    clock.t += 31  # the miss is 61 s old
    assert window.values() == {("latency", "t", "c"): 1.0}
    clock.t += 30
    assert window.values() == {}  # nothing counted: absent, not 0


def test_scraped_as_a_gauge_with_its_labels() -> None:
    registry = CollectorRegistry()
    window = AttainmentWindow(60, Clock())
    registry.register(window)
    window.record("latency", "team-a", "gold", "met")
    text = generate_latest(registry).decode()
    assert "# TYPE jitserve_slo_attainment gauge" in text
    assert 'jitserve_slo_attainment{kind="latency",slo_class="gold",tenant="team-a"} 1.0' in text
