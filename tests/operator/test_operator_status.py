"""Status from child state and the sidecar metrics contract (pure)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

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
    sample = st.parse_metrics(sidecar_metrics(met=3, missed=1, retired=1, tokens=100, p=0.8))
    assert sample.goodput_tokens == 100
    assert sample.effective_cutoff == 0.8
    att = st.attainment([sample])
    assert att is not None
    assert att.latency == 0.75
    assert att.deadline == 0.5
    assert att.compound is None
    assert att.overall == round(4 / 6, 4)


def test_attainment_sums_over_sidecars() -> None:
    a = st.parse_metrics(sidecar_metrics(met=1, missed=1, retired=0, tokens=0, p=1.0))
    b = st.parse_metrics(sidecar_metrics(met=3, missed=0, retired=0, tokens=0, p=0.5))
    att = st.attainment([a, b])
    assert att is not None and att.latency == 0.8
    assert st.attainment([]) is None


def test_goodput_rate_between_scrapes_and_counter_resets() -> None:
    assert st.goodput_rate({}, {"x": (10.0, 100.0)}) is None
    assert st.goodput_rate({"x": (10.0, 100.0)}, {"x": (12.0, 300.0)}) == 100.0
    # Pod restarted: counter went down, count from zero.
    assert st.goodput_rate({"x": (10.0, 100.0)}, {"x": (12.0, 40.0)}) == 20.0


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


def test_conditions_progressing_then_ready() -> None:
    now = "2026-01-01T00:00:00Z"
    rolling = _by_type(
        st.conditions(
            generation=1,
            problems=[],
            errors=[],
            rollout=st.rollout_state(deployment(2, 1)),
            now=now,
        )
    )
    assert rolling["Ready"].status == "False" and rolling["Progressing"].status == "True"
    assert rolling["Degraded"].status == "False"
    done = _by_type(
        st.conditions(
            generation=1,
            problems=[],
            errors=[],
            rollout=st.rollout_state(deployment(2, 2)),
            now=now,
        )
    )
    assert done["Ready"].status == "True" and done["Progressing"].status == "False"
    stale = _by_type(
        st.conditions(
            generation=1,
            problems=[],
            errors=[],
            rollout=st.rollout_state(deployment(2, 2, generation=2, observed=1)),
            now=now,
        )
    )
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
