"""Status from child state and the sidecar metrics contract (pure)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from jitserve.operator import sidecar_metrics as sm
from jitserve.operator import status as st


def sidecar_metrics(met: int, missed: int, retired: int, tokens: float, p: float) -> str:
    """A real prometheus_client registry with the sidecar contract's families."""
    registry = CollectorRegistry()
    requests = Counter(
        "jitserve_requests",
        "Requests by outcome.",
        ["tenant", "kind", "slo_class", "outcome"],
        registry=registry,
    )
    goodput = Counter(
        "jitserve_goodput_tokens",
        "Goodput tokens.",
        ["tenant", "kind", "slo_class"],
        registry=registry,
    )
    cutoff = Gauge("jitserve_effective_cutoff", "Effective p.", registry=registry)
    requests.labels("a", "latency", "default", "met").inc(met)
    requests.labels("a", "latency", "default", "missed").inc(missed)
    requests.labels("b", "deadline", "batch", "retired").inc(retired)
    requests.labels("b", "deadline", "batch", "met").inc(1)
    requests.labels("b", "deadline", "batch", "cancelled").inc(50)  # not counted
    goodput.labels("a", "latency", "default").inc(tokens)
    cutoff.set(p)
    return generate_latest(registry).decode()


def test_parse_and_attainment_per_kind() -> None:
    sample = sm.parse_metrics(sidecar_metrics(met=3, missed=1, retired=1, tokens=100, p=0.8))
    assert sample.goodput_tokens == 100
    assert sample.effective_cutoff == 0.8
    att = st.attainment([sample])
    assert att is not None
    assert att.latency == 0.75
    assert att.deadline == 0.5
    assert att.compound is None
    assert att.overall == round(4 / 6, 4)


def test_attainment_sums_over_sidecars() -> None:
    a = sm.parse_metrics(sidecar_metrics(met=1, missed=1, retired=0, tokens=0, p=1.0))
    b = sm.parse_metrics(sidecar_metrics(met=3, missed=0, retired=0, tokens=0, p=0.5))
    att = st.attainment([a, b])
    assert att is not None and att.latency == 0.8
    assert st.attainment([]) is None


def test_goodput_rate_between_scrapes_and_counter_resets() -> None:
    assert sm.goodput_rate({}, {"x": (10.0, 100.0)}) is None
    assert sm.goodput_rate({"x": (10.0, 100.0)}, {"x": (12.0, 300.0)}) == 100.0
    # Pod restarted: counter went down, count from zero.
    assert sm.goodput_rate({"x": (10.0, 100.0)}, {"x": (12.0, 40.0)}) == 20.0


def _by_type(conds: list[st.Condition]) -> dict[str, st.Condition]:
    return {c.type.value: c for c in conds}


def deployment(
    replicas: int, ready: int, generation: int = 1, observed: int = 1
) -> dict[str, object]:
    return {
        "metadata": {"generation": generation},
        "spec": {"replicas": replicas},
        "status": {
            "observedGeneration": observed,
            "readyReplicas": ready,
            "updatedReplicas": ready,
            "availableReplicas": ready,
        },
    }


def _rollout_conditions(deploy: dict[str, object]) -> dict[str, st.Condition]:
    return _by_type(st.conditions(generation=1, problems=[], errors=[],
                                  rollout=st.rollout_state(deploy), now="2026-01-01T00:00:00Z"))


def test_conditions_progressing_then_ready() -> None:
    rolling = _rollout_conditions(deployment(2, 1))
    assert rolling["Ready"].status == "False" and rolling["Progressing"].status == "True"
    assert rolling["Degraded"].status == "False"
    done = _rollout_conditions(deployment(2, 2))
    assert done["Ready"].status == "True" and done["Progressing"].status == "False"
    stale = _rollout_conditions(deployment(2, 2, generation=2, observed=1))
    assert stale["Ready"].status == "False"


def test_invalid_spec_is_degraded_with_the_field_named() -> None:
    conds = _by_type(
        st.conditions(
            generation=3,
            problems=["spec.ingress.tlsSecret: TLS needs ingress.host"],
            errors=[],
            rollout=None,
            now="t",
        )
    )
    assert conds["Degraded"].status == "True"
    assert conds["Degraded"].reason == "InvalidSpec"
    assert "spec.ingress.tlsSecret" in conds["Degraded"].message


def test_transition_time_kept_while_status_unchanged() -> None:
    old = [{"type": "Ready", "status": "False", "lastTransitionTime": "earlier"}]
    new = st.conditions(generation=1, problems=[], errors=[], rollout=None, now="later")
    merged = _by_type(st.merge_conditions(old, new))
    assert merged["Ready"].last_transition_time == "earlier"
    assert merged["Progressing"].last_transition_time == "later"


def test_status_patch_is_none_when_nothing_changed() -> None:
    status = {"a": 1, "b": {"c": 2}}
    assert st.status_patch(status, dict(status)) is None
    assert st.status_patch(status, {"a": 1, "b": {"c": 3}}) == {"b": {"c": 3}}
    assert st.status_patch(status, {"a": 1}) == {"b": None}


def _outcomes(met: float, missed: float) -> dict[tuple[str, str], float]:
    return {("latency", "met"): met, ("latency", "missed"): missed}


def test_recent_window_counts_only_the_last_seconds() -> None:
    """Lifetime counters of two pods; the window sees what happened in the last 10 s."""
    history = sm.OutcomeHistory()
    history.add(0.0, {"pod-a": _outcomes(100, 0)}, window_s=10)
    assert history.recent() == ({}, 0.0)  # one scrape: nothing to difference yet
    history.add(5.0, {"pod-a": _outcomes(110, 0)}, window_s=10)
    history.add(10.0, {"pod-a": _outcomes(120, 0)}, window_s=10)
    # p was tuned at t=10: from then on, every other request misses.
    history.add(15.0, {"pod-a": _outcomes(125, 5)}, window_s=10)
    history.add(20.0, {"pod-a": _outcomes(130, 10)}, window_s=10)
    totals, span = history.recent()
    assert span == 10.0
    assert totals == _outcomes(10, 10)
    recent = st.attainment_of(totals)
    assert recent is not None and recent.overall == 0.5 and recent.latency == 0.5
    lifetime = st.attainment([sm.SidecarSample(outcomes=_outcomes(130, 10))])
    assert lifetime is not None and lifetime.overall == round(130 / 140, 4)
    # Only the baseline (the newest scrape at least 10 s old) and later ones are kept.
    assert [t for t, _ in history.snapshots] == [10.0, 15.0, 20.0]


def test_recent_window_new_pod_and_restarted_pod() -> None:
    history = sm.OutcomeHistory()
    history.add(0.0, {"a": _outcomes(50, 0)}, window_s=30)
    history.add(5.0, {"a": _outcomes(60, 0), "b": _outcomes(3, 1)}, window_s=30)
    # "b" is counted from its first scrape; "a" restarted (its counters went down).
    history.add(10.0, {"a": _outcomes(2, 2), "b": _outcomes(5, 1)}, window_s=30)
    totals, span = history.recent()
    assert span == 10.0
    assert totals == _outcomes(2 + 2, 2 + 0)
    assert st.counted_requests(totals) == 6


def test_status_carries_recent_beside_lifetime_attainment() -> None:
    sample = sm.SidecarSample(outcomes=_outcomes(90, 10))
    def build(old: dict[str, Any], now: str, recent: tuple[Any, float]) -> dict[str, Any]:
        return st.build_status(old_status=old, generation=1, problems=[], errors=[],
                               deployment=None, selector="x=y", samples=[sample],
                               goodput_per_s=None, now=now, recent=recent)

    status = build({}, "2025-01-01T00:00:00Z", (_outcomes(1, 3), 299.6))
    assert status["attainment"]["overall"] == 0.9
    assert status["recentAttainment"] == {"latency": 0.25, "overall": 0.25}
    assert status["recentWindowSeconds"] == 300 and status["recentRequests"] == 4
    # No request finished in the window: no recent figure (an empty column, not a stale one).
    quiet = build(status, "2025-01-01T00:00:15Z", ({}, 300.0))
    assert "recentAttainment" not in quiet and quiet["recentRequests"] == 0
    patch = st.status_patch(status, quiet)
    assert patch is not None and patch["recentAttainment"] is None


def test_operator_metrics_mirror_the_status_and_forget_deleted_policies() -> None:
    from jitserve.operator.metrics import OperatorMetrics

    m = OperatorMetrics()
    status = {
        "conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "Degraded", "status": "False"},
        ],
        "attainment": {"overall": 0.9},
        "recentAttainment": {"overall": 0.5},
    }
    m.observe_status("team-a", "chat", status)
    text = generate_latest(m.registry).decode()
    assert 'jitserve_operator_policy_ready{namespace="team-a",policy="chat"} 1.0' in text
    assert 'jitserve_operator_policy_degraded{namespace="team-a",policy="chat"} 0.0' in text
    assert (
        'jitserve_operator_policy_attainment{namespace="team-a",policy="chat",window="recent"} 0.5'
        in text
    )
    m.observe_status("team-a", "chat", {**status, "recentAttainment": None})
    assert 'window="recent"' not in generate_latest(m.registry).decode()
    m.forget("team-a", "chat")
    assert 'policy="chat"' not in generate_latest(m.registry).decode()


def test_the_scheduler_in_effect_from_the_sidecars_own_metrics() -> None:
    """The status names what the pods run (the sidecar's real metrics families): one
    name when they agree, each with its count when an auto tuner switched some."""
    from jitserve.sidecar.metrics import SidecarMetrics

    def pod(runs: list[tuple[str, float]]) -> sm.SidecarSample:
        m = SidecarMetrics()
        for name, since in runs:  # a switch replaces the series
            m.in_effect(name, since)
        return sm.parse_metrics(m.render().decode())

    def build(samples: list[sm.SidecarSample] | None, old: dict[str, Any]) -> dict[str, Any]:
        return st.build_status(old_status=old, generation=1, problems=[], errors=[],
                               deployment=None, selector="x=y", samples=samples,
                               goodput_per_s=None, now="2026-12-06T00:00:00Z")

    a = pod([("gmax", 1_700_000_000.0)])
    b = pod([("gmax", 1_700_000_000.0), ("edf-ac", 1_700_000_060.0)])
    assert b.policy_in_effect == "edf-ac" and b.policy_since_s == 1_700_000_060.0
    same = build([a, a], {})
    assert same["policyInEffect"] == "gmax"
    assert same["policyInEffectSince"] == "2023-11-14T22:13:20Z"
    mixed = build([a, b, a], {})
    assert mixed["policyInEffect"] == "gmax 2, edf-ac 1"
    assert mixed["policyInEffectSince"] == "2023-11-14T22:14:20Z"  # the latest change
    kept = build(None, mixed)  # no scrape this time: the last figures stay
    assert kept["policyInEffect"] == "gmax 2, edf-ac 1"
    assert "policyInEffect" not in build([sm.SidecarSample()], {})  # an older sidecar
