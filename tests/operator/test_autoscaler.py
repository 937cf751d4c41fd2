"""The operator's autoscaler: sidecar counters become the planner's period signals, its
count goes to spec.replicas (with an Event and status.autoscaling), and nothing moves
with autoscaling off."""

from __future__ import annotations

from typing import Any

import pytest

from jitserve.operator import builders as b
from jitserve.operator import constants as c
from jitserve.operator.autoscaler import (
    DELETION_COST,
    Autoscaler,
    mark_deletion_costs,
    pod_readiness,
)
from jitserve.operator.reconcile import Scraper, reconcile
from jitserve.operator.sidecar_metrics import SidecarSample, parse_metrics
from jitserve.policy.autoscaling import AutoscalingSettings
from jitserve.slo import SLOKind
from tests.support.kube_fake import FakeKube, serving

NS = "team-a"
SETTINGS = b.OperatorSettings()
ON = AutoscalingSettings(enabled=True, replica_capacity=2.0, max_replicas=10,
                         period_seconds=15.0, utilization=0.5)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def pod(name: str, ready: bool | None, terminating: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS, "labels": b.selector_labels("chat")}
    if terminating:
        meta["deletionTimestamp"] = "2026-12-06T00:00:00Z"
    status: dict[str, Any] = {"phase": "Running", "podIP": f"10.0.0.{len(name)}"}
    if ready is not None:
        status["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "status": status}


def metrics(arrivals: int, met: int, missed: int = 0, queue: int = 0) -> str:
    return (
        f'jitserve_arrivals_total{{kind="latency"}} {arrivals}\n'
        f'jitserve_requests_total{{tenant="a",kind="latency",slo_class="x",outcome="met"}} {met}\n'
        f'jitserve_requests_total{{tenant="a",kind="latency",slo_class="x",outcome="missed"}} '
        f"{missed}\n"
        'jitserve_requests_total{tenant="a",kind="latency",slo_class="x",outcome="cancelled"} 7\n'
        f"jitserve_queue_depth {queue}\n"
    )


def test_pods_count_as_ready_or_warming_and_terminating_ones_not_at_all() -> None:
    pods = [pod("a", True), pod("b", False), pod("c", None), pod("d", True, terminating=True)]
    assert pod_readiness(pods) == (1, 2)


def test_sidecar_counters_become_one_period_of_signals() -> None:
    clock = Clock()
    scaler = Autoscaler(clock)

    def step(arrivals: int, met: int, missed: int, at: float) -> Any:
        clock.now = at
        sample = parse_metrics(metrics(arrivals, met, missed, queue=3))
        return scaler.step("ns/p", ON, [pod("a", True)], {"http://a/metrics": sample})

    assert step(1000, 900, 0, 0.0) is None  # the first scrape is a baseline
    assert step(1060, 950, 2, 10.0) is None  # a period has not passed
    decision = step(1150, 1000, 10, 15.0)
    assert decision is not None
    # 150 arrivals in 15 s = 10/s on 2/s replicas at utilization 0.5 -> 10, plus the queue
    assert decision.desired == 10
    assert "10.00/s" in decision.reason
    planner = scaler._policies["ns/p"].planner
    outcomes = planner._outcomes[-1]
    assert outcomes[1] == {SLOKind.LATENCY: 110} and outcomes[2] == {SLOKind.LATENCY: 100}


def test_a_restarted_sidecar_counts_from_zero_and_a_new_one_from_its_first_scrape() -> None:
    clock = Clock()
    scaler = Autoscaler(clock)
    one = {"http://a/metrics": parse_metrics(metrics(500, 0))}
    scaler.step("ns/p", ON, [pod("a", True)], one)
    clock.now = 15.0
    both = {"http://a/metrics": parse_metrics(metrics(30, 0)),  # restarted: 30 since
            "http://b/metrics": parse_metrics(metrics(9000, 0))}  # new: a baseline
    scaler.step("ns/p", ON, [pod("a", True), pod("b", True)], both)
    rates = scaler._policies["ns/p"].planner._rates
    assert rates[-1][1] == pytest.approx(30 / 15)


def test_off_forgets_the_planner_and_new_settings_start_a_new_one() -> None:
    clock = Clock()
    scaler = Autoscaler(clock)
    sample = {"http://a/metrics": SidecarSample()}
    scaler.step("ns/p", ON, [], sample)
    first = scaler._policies["ns/p"].planner
    assert scaler.step("ns/p", ON.model_copy(update={"enabled": False}), [], sample) is None
    assert "ns/p" not in scaler._policies
    scaler.step("ns/p", ON, [], sample)
    scaler.step("ns/p", ON.model_copy(update={"max_replicas": 3}), [], sample)
    assert scaler._policies["ns/p"].planner is not first


def policy(kube: FakeKube, autoscaling: dict[str, Any]) -> None:
    kube.add({"apiVersion": c.API_VERSION, "kind": c.KIND,
              "metadata": {"name": "chat", "namespace": NS},
              "spec": serving({"replicas": 2, "autoscaling": autoscaling})})


def body(kube: FakeKube) -> dict[str, Any]:
    found = kube.get(c.API_VERSION, c.KIND, NS, "chat")
    assert found is not None
    return found


def test_the_reconcile_writes_the_planners_count_to_spec_replicas_with_an_event() -> None:
    kube = FakeKube()
    policy(kube, {"enabled": True, "replicaCapacity": 2.0, "utilization": 0.5,
                  "maxReplicas": 20})
    kube.add(pod("chat-1", True))
    kube.add(pod("chat-22", True))
    clock = Clock()
    scaler = Autoscaler(clock)
    targets = iter([(0, 0), (0, 0), (75, 70), (75, 70)])

    def fetch(url: str, timeout: float) -> str:
        arrivals, met = next(targets)
        return metrics(arrivals, met)

    scraper = Scraper(fetch=fetch, clock=clock)
    reconcile(kube, body(kube), SETTINGS, scraper, now="2026-12-06T10:00:00Z", autoscaler=scaler)
    assert body(kube)["spec"]["replicas"] == 2  # a baseline, no decision yet
    clock.now = 15.0
    out = reconcile(kube, body(kube), SETTINGS, scraper, now="2026-12-06T10:00:15Z",
                    autoscaler=scaler)
    # 150 arrivals over two pods in 15 s: 10/s on 2/s replicas at 0.5 -> 10
    assert body(kube)["spec"]["replicas"] == 10
    assert "scale SLOPolicy team-a/chat 2->10" in out.writes
    status = body(kube)["status"]["autoscaling"]
    # attainment held with the replicas loaded: the utilization rose a step
    assert status["desiredReplicas"] == 10 and status["utilization"] == 0.51
    assert status["lastScaleTime"] == "2026-12-06T10:00:15Z"
    events = [o for (_, kind, _, _), o in kube.objects.items() if kind == "Event"]
    assert [e["reason"] for e in events if e["reason"].startswith("Scaled")] == ["ScaledUp"]
    # the next reconcile (spec changed) sizes the Deployment from spec.replicas
    reconcile(kube, body(kube), SETTINGS)
    deployment = kube.get("apps/v1", "Deployment", NS, "chat")
    assert deployment is not None and deployment["spec"]["replicas"] == 10


def test_a_scale_down_marks_each_pods_work_as_its_deletion_cost() -> None:
    """Before the count goes down, each scraped pod carries its requests in flight as
    controller.kubernetes.io/pod-deletion-cost: the ReplicaSet removes the idlest first."""
    kube = FakeKube()
    policy(kube, {"enabled": True, "replicaCapacity": 2.0, "utilization": 0.5,
                  "maxReplicas": 20})
    for name in ("chat-1", "chat-22", "chat-333"):
        kube.add(pod(name, True))
    in_flight = {"10.0.0.6": (5, 2), "10.0.0.7": (0, 0), "10.0.0.8": (1, 0)}  # by pod IP
    clock = Clock()

    def fetch(url: str, timeout: float) -> str:
        running, queued = in_flight[url.split("//")[1].split(":")[0]]
        return metrics(0, 0, queue=queued) + f"jitserve_running_requests {running}\n"

    scraper = Scraper(fetch=fetch, clock=clock)
    scaler = Autoscaler(clock)
    reconcile(kube, body(kube), SETTINGS, scraper, autoscaler=scaler)
    assert all(DELETION_COST not in (p["metadata"].get("annotations") or {})
               for p in kube.list("v1", "Pod", NS))  # no scale-down yet: no marks
    clock.now = 15.0
    out = reconcile(kube, body(kube), SETTINGS, scraper, autoscaler=scaler)
    assert "scale SLOPolicy team-a/chat 2->1" in out.writes
    costs = {p["metadata"]["name"]: p["metadata"]["annotations"][DELETION_COST]
             for p in kube.list("v1", "Pod", NS)}
    assert costs == {"chat-1": "7", "chat-22": "0", "chat-333": "1"}
    # marks already right are not written again; a changed one is
    in_flight["10.0.0.7"] = (3, 0)
    ip_of = {p["metadata"]["name"]: p["status"]["podIP"] for p in kube.list("v1", "Pod", NS)}
    samples = {name: SidecarSample(running=in_flight[ip][0], queue_depth=in_flight[ip][1])
               for name, ip in ip_of.items()}
    written = len(kube.writes)
    mark_deletion_costs(kube, NS, kube.list("v1", "Pod", NS), samples)
    assert kube.writes[written:] == ["patch Pod"]
    assert kube.get("v1", "Pod", NS, "chat-22")["metadata"]["annotations"][DELETION_COST] == "3"


def test_with_autoscaling_off_spec_replicas_is_the_users() -> None:
    kube = FakeKube()
    policy(kube, {"enabled": False})
    kube.add(pod("chat-1", True))
    clock = Clock()
    scraper = Scraper(fetch=lambda u, t: metrics(10_000, 0), clock=clock)
    scaler = Autoscaler(clock)
    for at in (0.0, 15.0, 30.0):
        clock.now = at
        out = reconcile(kube, body(kube), SETTINGS, scraper, autoscaler=scaler)
        assert not any(w.startswith("scale") for w in out.writes)
    assert body(kube)["spec"]["replicas"] == 2
    assert "autoscaling" not in body(kube).get("status", {})


def test_with_the_keda_actuator_the_count_is_exported_not_written() -> None:
    from jitserve.operator.metrics import OperatorMetrics

    kube = FakeKube()
    policy(kube, {"enabled": True, "actuator": "keda", "replicaCapacity": 2.0,
                  "utilization": 0.5, "maxReplicas": 20})
    kube.add(pod("chat-1", True))
    clock = Clock()
    counts = iter([0, 150])
    scraper = Scraper(fetch=lambda u, t: metrics(next(counts), 0), clock=clock)
    scaler = Autoscaler(clock)
    reconcile(kube, body(kube), SETTINGS, scraper, autoscaler=scaler)
    clock.now = 15.0
    out = reconcile(kube, body(kube), SETTINGS, scraper, autoscaler=scaler)
    assert body(kube)["spec"]["replicas"] == 2  # KEDA's to write
    assert not any(w.startswith("scale") for w in out.writes)
    assert body(kube)["status"]["autoscaling"]["desiredReplicas"] == 10
    gauges = OperatorMetrics()
    gauges.observe_status(NS, "chat", out.status)
    assert gauges.desired_replicas.labels(NS, "chat")._value.get() == 10
    gauges.observe_status(NS, "chat", {})
    assert not gauges.desired_replicas._metrics
