"""Scale by SLO in the operator: each policy with ``autoscaling.enabled`` keeps a
:class:`~jitserve.scaling.planner.SLOPlanner`; every ``periodSeconds`` its sidecars' scrape
becomes :class:`~jitserve.scaling.signals.PoolSignals` and the planner's count is what
the reconcile writes to ``spec.replicas`` — the scale subresource an HorizontalPodAutoscaler
would write, so the Deployment follows through the usual reconcile (owner: operator).

From the scrape (per sidecar, the difference since the previous scrape; a pod first seen
counts from then, a counter that went down from zero): arrivals
(``jitserve_arrivals_total``), ended and met requests by kind
(``jitserve_requests_total``: met, missed, retired), the queue (``jitserve_queue_depth``).
From the pods: ready (Ready) and warming (not yet Ready, not terminating). The planner's
state (its rate history, its learned utilization) lives in this process: an operator
restart starts it afresh, from ``autoscaling.utilization``.

Before a count goes down (whichever actuator applies it), each scraped pod gets the
``controller.kubernetes.io/pod-deletion-cost`` annotation: its requests in flight (running
and queued), so the ReplicaSet removes the pods with the least to drain first
(Kubernetes >= 1.22 reads it), as the simulator's pool does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from jitserve.operator import constants as c
from jitserve.operator import events
from jitserve.operator.kube import JSON, Kube, KubeError
from jitserve.operator.sidecar_metrics import SidecarSample, increase
from jitserve.policy.autoscaling import Actuator, AutoscalingSettings
from jitserve.scaling.planner import SLOPlanner
from jitserve.scaling.signals import Decision, PoolSignals
from jitserve.slo import SLOKind

log = logging.getLogger("jitserve.operator")
ENDED = ("met", "missed", "retired")
"""Outcomes that count toward attainment (cancelled and error are the client's or the
engine's, not the SLO's)."""
KINDS = {k.value: k for k in SLOKind}


def pod_readiness(pods: list[JSON]) -> tuple[int, int]:
    """(ready, warming) among the serving pods: Ready=True, and not yet Ready while not
    terminating."""
    ready = warming = 0
    for pod in pods:
        if pod.get("metadata", {}).get("deletionTimestamp"):
            continue
        conditions = (pod.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
            ready += 1
        else:
            warming += 1
    return ready, warming


DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"


def deletion_costs(samples: Mapping[str, SidecarSample]) -> dict[str, int]:
    """Each scraped pod's requests in flight (running and queued), by pod name; a pod its
    scrape does not show gets none (the ReplicaSet ranks unready pods first anyway)."""
    return {pod: round(s.running + s.queue_depth) for pod, s in samples.items()}


def mark_deletion_costs(kube: Kube, namespace: str, pods: list[JSON],
                        samples: Mapping[str, SidecarSample]) -> None:
    """Write each scraped pod's cost (``samples``: by pod name) on the pods listed, unless
    its annotation already says it (a scale-down that KEDA applies a period later would
    otherwise rewrite every pod each period)."""
    marked = {p["metadata"]["name"]: (p["metadata"].get("annotations") or {}).get(DELETION_COST)
              for p in pods}
    for name, cost in deletion_costs(samples).items():
        if name not in marked or marked[name] == str(cost):
            continue
        try:
            kube.merge_patch("v1", "Pod", namespace, name,
                             {"metadata": {"annotations": {DELETION_COST: str(cost)}}})
        except KubeError as err:  # advice only: the count still goes down
            log.warning("pod %s/%s: %s could not be set: %s", namespace, name,
                        DELETION_COST, err.message)


def _counters(sample: SidecarSample) -> dict[tuple[str, str], float]:
    """A sidecar's counters the planner reads: (``arrivals``, kind) and (kind, outcome)."""
    out = {("arrivals", kind): n for kind, n in sample.arrivals.items()}
    out.update(sample.outcomes)
    return out


def _since(now: Mapping[tuple[str, str], float],
           before: Mapping[tuple[str, str], float] | None) -> dict[tuple[str, str], float]:
    """Counter increments since ``before`` (none for a target first seen now; from zero
    after a restart)."""
    return {} if before is None else increase(now, before)


@dataclass
class _PolicyState:
    settings: AutoscalingSettings
    planner: SLOPlanner
    last_at: float
    counters: dict[str, dict[tuple[str, str], float]] = field(default_factory=dict)
    """Per pod: the counters its sidecar showed at the last scrape."""
    arrived: float = 0.0
    finished: dict[SLOKind, int] = field(default_factory=dict)
    met: dict[SLOKind, int] = field(default_factory=dict)
    """Counted since the last decision (scrapes may come more often than decisions)."""


class Autoscaler:
    """One planner per policy; :meth:`step` once per scrape."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._policies: dict[str, _PolicyState] = {}

    def step(
        self,
        key: str,
        settings: AutoscalingSettings,
        pods: list[JSON],
        samples: Mapping[str, SidecarSample],
    ) -> Decision | None:
        """The planner's decision for policy ``key`` once a period has passed since its
        last (the first a period after the first scrape: a rate needs two), else None;
        None with autoscaling off. ``samples``: this scrape's, by pod name."""
        if not settings.enabled:
            self.forget(key)
            return None
        now = self.clock()
        state = self._policies.get(key)
        if state is None or state.settings != settings:
            state = _PolicyState(settings, SLOPlanner(settings), now)
            self._policies[key] = state
        for pod, sample in samples.items():
            counters = _counters(sample)
            for (what, detail), n in _since(counters, state.counters.get(pod)).items():
                if what == "arrivals":
                    state.arrived += n
                elif what in KINDS and detail in ENDED:
                    kind = KINDS[what]
                    state.finished[kind] = state.finished.get(kind, 0) + round(n)
                    if detail == "met":
                        state.met[kind] = state.met.get(kind, 0) + round(n)
            state.counters[pod] = counters
        if now - state.last_at < settings.period_seconds:
            return None
        ready, warming = pod_readiness(pods)
        signals = PoolSignals(
            at_s=now, period_s=now - state.last_at, ready=ready,
            warming=warming, arrived=round(state.arrived), finished=state.finished,
            met=state.met, queued=round(sum(s.queue_depth for s in samples.values())),
        )  # fmt: skip
        state.last_at = now
        state.arrived, state.finished, state.met = 0.0, {}, {}
        return state.planner.decide(signals)

    def utilization(self, key: str) -> float | None:
        state = self._policies.get(key)
        return None if state is None else state.planner.utilization

    def forget(self, key: str) -> None:
        self._policies.pop(key, None)


def autoscale(
    kube: Kube,
    body: JSON,
    settings: AutoscalingSettings,
    replicas: int,
    autoscaler: Autoscaler,
    pods: list[JSON],
    samples: Mapping[str, SidecarSample],
    now: str,
) -> tuple[JSON | None, str | None]:
    """Run the policy's planner on this scrape; write a new count to ``spec.replicas``
    (with an Event) unless KEDA applies it (``actuator: keda``: the status and the
    operator's gauge carry it). Returns the ``status.autoscaling`` to show (None: keep the last;
    ``{}``: autoscaling is off) and the write made, if any."""
    meta = body["metadata"]
    key = f"{meta['namespace']}/{meta['name']}"
    if not settings.enabled:
        autoscaler.forget(key)
        return {}, None
    decision = autoscaler.step(key, settings, pods, samples)
    if decision is None:
        return None, None
    old = (body.get("status") or {}).get("autoscaling") or {}
    status: JSON = {
        "desiredReplicas": decision.desired,
        "utilization": round(autoscaler.utilization(key) or 0.0, 3),
        "reason": decision.reason,
        "lastDecisionTime": now,
    }
    if "lastScaleTime" in old:
        status["lastScaleTime"] = old["lastScaleTime"]
    if decision.desired < replicas:
        mark_deletion_costs(kube, meta["namespace"], pods, samples)
    if decision.desired == replicas or settings.actuator is Actuator.KEDA:
        return status, None
    kube.merge_patch(c.API_VERSION, c.KIND, meta["namespace"], meta["name"],
                     {"spec": {"replicas": decision.desired}})
    status["lastScaleTime"] = now
    verb = "ScaledUp" if decision.desired > replicas else "ScaledDown"
    events.post(kube, body, [events.Change(
        "Normal", verb, f"replicas {replicas} -> {decision.desired}: {decision.reason}")], now)
    return status, f"scale {c.KIND} {key} {replicas}->{decision.desired}"
