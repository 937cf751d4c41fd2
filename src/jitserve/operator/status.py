"""Pure functions that compute an SLOPolicy's ``status``.

Inputs: the policy's generation, spec problems, the live Deployment, and the samples
scraped from the sidecars' ``/metrics`` (the sidecar metrics contract):

- ``jitserve_requests_total{tenant,kind,slo_class,outcome}``, outcome in
  met|missed|retired|cancelled|error; attainment per kind = met / (met+missed+retired);
- ``jitserve_goodput_tokens_total{tenant,kind,slo_class}``: goodput tokens, a counter;
- ``jitserve_effective_cutoff``: the ``p`` the sidecar's scheduler uses now;
  ``jitserve_fairness_weight``: the f it uses now;
- ``jitserve_tenant_demand_tokens_total{tenant}``: the goodput the tenant's admitted
  requests would earn by meeting their SLOs (with goodput by tenant: ``status.fairness``,
  :mod:`~jitserve.operator.fairness_status`).

Attainment is reported twice: ``attainment`` over the pods' lifetime (their counters) and
``recentAttainment`` over the last ``spec.reporting.attainmentWindowSeconds``, from the
difference of two scrapes (:class:`OutcomeHistory`), so tuning p or f shows within it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from jitserve.goodput import ATTAINMENT_OUTCOMES
from jitserve.operator.replica_status import gateway_status, replica_status
from jitserve.policy import (
    Attainment,
    Condition,
    ConditionType,
    FairnessStatus,
    GatewayStatus,
    SLOPolicyStatus,
)

JSON = dict[str, Any]

_COUNTED = ATTAINMENT_OUTCOMES
DEMAND, GOODPUT = "demand", "goodput"  # a sample's per-tenant token counters
_KIND_FIELDS = {
    "latency": "latency",
    "deadline": "deadline",
    "compound": "compound",
    "best_effort": "best_effort",
}


@dataclass
class SidecarSample:
    """What one sidecar's ``/metrics`` said."""

    outcomes: dict[tuple[str, str], float] = field(default_factory=dict)  # (kind, outcome) -> count
    goodput_tokens: float = 0.0
    effective_cutoff: float | None = None
    fairness_weight: float | None = None
    tenants: dict[tuple[str, str], float] = field(default_factory=dict)
    """(tenant, DEMAND | GOODPUT) -> tokens, the counters' totals."""


def parse_metrics(text: str) -> SidecarSample:
    """Parse a Prometheus text exposition into the figures the status needs."""
    sample = SidecarSample()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "jitserve_requests_total":
                key = (s.labels.get("kind", ""), s.labels.get("outcome", ""))
                sample.outcomes[key] = sample.outcomes.get(key, 0.0) + float(s.value)
            elif s.name == "jitserve_goodput_tokens_total":
                sample.goodput_tokens += float(s.value)
                _add(sample.tenants, (s.labels.get("tenant", ""), GOODPUT), float(s.value))
            elif s.name == "jitserve_tenant_demand_tokens_total":
                _add(sample.tenants, (s.labels.get("tenant", ""), DEMAND), float(s.value))
            elif s.name == "jitserve_effective_cutoff":
                sample.effective_cutoff = float(s.value)
            elif s.name == "jitserve_fairness_weight":
                sample.fairness_weight = float(s.value)
    return sample


def _add(into: dict[tuple[str, str], float], key: tuple[str, str], value: float) -> None:
    into[key] = into.get(key, 0.0) + value


Outcomes = dict[tuple[str, str], float]  # (kind, outcome) -> count; also (tenant, what)


def attainment(samples: Iterable[SidecarSample]) -> Attainment | None:
    """met / (met + missed + retired) per kind and overall, summed over sidecars."""
    totals: Outcomes = {}
    for sample in samples:
        for key, value in sample.outcomes.items():
            totals[key] = totals.get(key, 0.0) + value
    return attainment_of(totals)


def counted_requests(totals: Mapping[tuple[str, str], float]) -> int:
    """Requests that count toward attainment (met, missed, retired)."""
    return round(sum(v for (_, outcome), v in totals.items() if outcome in _COUNTED))


def attainment_of(totals: Mapping[tuple[str, str], float]) -> Attainment | None:
    """Attainment from summed ``(kind, outcome)`` counts; None when nothing was counted."""
    if counted_requests(totals) == 0:
        return None
    values: dict[str, float | None] = {}
    all_met = all_counted = 0.0
    for kind, name in _KIND_FIELDS.items():
        met = totals.get((kind, "met"), 0.0)
        n = sum(totals.get((kind, o), 0.0) for o in _COUNTED)
        values[name] = round(met / n, 4) if n > 0 else None
        all_met += met
        all_counted += n
    values["overall"] = round(all_met / all_counted, 4) if all_counted > 0 else None
    return Attainment(**values)


def goodput_rate(
    previous: Mapping[str, tuple[float, float]], current: Mapping[str, tuple[float, float]]
) -> float | None:
    """Goodput tokens/s summed over sidecars, from two scrapes ``target -> (time, total)``.

    A target seen only once contributes nothing; a counter that went down (pod restart)
    counts from zero.
    """
    rate = 0.0
    seen = False
    for target, (t1, v1) in current.items():
        if target not in previous:
            continue
        t0, v0 = previous[target]
        if t1 <= t0:
            continue
        seen = True
        delta = v1 - v0 if v1 >= v0 else v1
        rate += delta / (t1 - t0)
    return round(rate, 3) if seen else None


@dataclass
class OutcomeHistory:
    """Counters per scrape target over time (outcomes, or tenants' tokens), for their
    totals over a recent window.

    The sidecars' counters only grow (they count since the pod started), so the requests
    of the last ``window`` seconds are the difference between the newest scrape and the
    newest one at least ``window`` old (or the oldest kept, while the history is younger).
    A target first seen later is counted from its first scrape; a counter that went down
    (pod restart) counts from zero.
    """

    snapshots: list[tuple[float, dict[str, Outcomes]]] = field(default_factory=list)

    def add(self, t: float, per_target: Mapping[str, Outcomes], window_s: float) -> None:
        self.snapshots.append((t, {k: dict(v) for k, v in per_target.items()}))
        # Keep the newest snapshot that is at least `window_s` old (the baseline) and later.
        old = [i for i, (ts, _) in enumerate(self.snapshots) if ts <= t - window_s]
        if old:
            del self.snapshots[: old[-1]]

    def recent(self) -> tuple[Outcomes, float]:
        """Outcome counts since the baseline, summed over targets, and the span covered."""
        if len(self.snapshots) < 2:
            return {}, 0.0
        (t0, base), (t1, now) = self.snapshots[0], self.snapshots[-1]
        totals: Outcomes = {}
        for target, counts in now.items():
            first = base.get(target)
            if first is None:  # first seen after the baseline: count from its first scrape
                first = next((snap[target] for _, snap in self.snapshots if target in snap), {})
            if any(v < first.get(k, 0.0) for k, v in counts.items()):
                first = {}  # counter reset: the pod restarted
            for key, value in counts.items():
                totals[key] = totals.get(key, 0.0) + value - first.get(key, 0.0)
        return totals, t1 - t0


def merge_conditions(old: Iterable[Mapping[str, Any]], new: list[Condition]) -> list[Condition]:
    """Keep ``lastTransitionTime`` of conditions whose status did not change."""
    previous = {str(o.get("type")): o for o in old}
    merged: list[Condition] = []
    for cond in new:
        before = previous.get(cond.type.value)
        if (
            before is not None
            and before.get("status") == cond.status
            and before.get("lastTransitionTime")
        ):
            cond = cond.model_copy(
                update={"last_transition_time": str(before["lastTransitionTime"])}
            )
        merged.append(cond)
    return merged


@dataclass(frozen=True)
class RolloutState:
    replicas: int
    ready: int
    updated: int
    available: int
    observed_current: bool


def rollout_state(deployment: JSON | None) -> RolloutState | None:
    if deployment is None:
        return None
    status = deployment.get("status") or {}
    generation = int(deployment.get("metadata", {}).get("generation", 0))
    return RolloutState(
        replicas=int(deployment.get("spec", {}).get("replicas", 1)),
        ready=int(status.get("readyReplicas", 0)),
        updated=int(status.get("updatedReplicas", 0)),
        available=int(status.get("availableReplicas", 0)),
        observed_current=int(status.get("observedGeneration", 0)) >= generation,
    )


def conditions(
    *,
    generation: int,
    problems: list[str],
    errors: list[str],
    rollout: RolloutState | None,
    now: str,
    gateway: GatewayStatus | None = None,
    gateway_wanted: bool = False,
) -> list[Condition]:
    """Ready / Progressing / Degraded from spec problems, apply errors and the rollout;
    with a gateway wanted (more than one pod), Ready also needs a ready gateway pod (the
    Ingress goes through it)."""

    def cond(kind: ConditionType, ok: bool, reason: str, message: str) -> Condition:
        return Condition(
            type=kind,
            status="True" if ok else "False",
            reason=reason,
            message=message,
            last_transition_time=now,
            observed_generation=generation,
        )

    if problems:
        degraded = cond(ConditionType.DEGRADED, True, "InvalidSpec", "; ".join(problems))
    elif errors:
        degraded = cond(ConditionType.DEGRADED, True, "ApplyFailed", "; ".join(errors))
    else:
        # Never an empty message: some API servers (the Debian 1.20 build) read "" as null.
        degraded = cond(ConditionType.DEGRADED, False, "AsExpected", "spec valid, children applied")

    if rollout is None:
        ready = cond(
            ConditionType.READY, False, "NoDeployment", "the serving Deployment does not exist yet"
        )
        progressing = (
            cond(ConditionType.PROGRESSING, False, "InvalidSpec", "fix the spec to continue")
            if problems
            else cond(
                ConditionType.PROGRESSING, True, "Creating", "creating the serving Deployment"
            )
        )
        return [ready, progressing, degraded]

    done = (
        rollout.observed_current
        and rollout.updated >= rollout.replicas
        and rollout.ready >= rollout.replicas
        and rollout.available >= rollout.replicas
    )
    counts = f"{rollout.ready}/{rollout.replicas} replicas ready, {rollout.updated} updated"
    gateway_ready = gateway is not None and gateway.ready_replicas > 0
    if gateway_wanted:
        shown = gateway or GatewayStatus()
        counts += f"; gateway {shown.ready_replicas}/{shown.replicas} ready"
    if done and gateway_wanted and not gateway_ready:
        ready = cond(ConditionType.READY, False, "WaitingForGateway", counts)
    elif done:
        ready = cond(
            ConditionType.READY, True, "Available" if rollout.replicas else "ScaledToZero", counts
        )
    else:
        ready = cond(ConditionType.READY, False, "WaitingForReplicas", counts)
    if problems:
        progressing = cond(
            ConditionType.PROGRESSING, False, "InvalidSpec", "fix the spec to continue"
        )
    elif done:
        progressing = cond(ConditionType.PROGRESSING, False, "RolloutComplete", counts)
    else:
        progressing = cond(ConditionType.PROGRESSING, True, "RollingOut", counts)
    return [ready, progressing, degraded]


def build_status(
    *,
    old_status: Mapping[str, Any],
    generation: int,
    problems: list[str],
    errors: list[str],
    deployment: JSON | None,
    selector: str,
    samples: list[SidecarSample] | None,
    goodput_per_s: float | None,
    now: str,
    recent: tuple[Outcomes, float] | None = None,
    fairness: FairnessStatus | None = None,
    pods: list[JSON] | None = None,
    gateway: JSON | None = None,
    gateway_wanted: bool = False,
    url: str | None = None,
) -> JSON:
    """The full ``status`` (wire names). ``samples=None``: no scrape this time, keep metrics.

    ``recent``: outcome counts over the recent window and the seconds it covers
    (:meth:`OutcomeHistory.recent`); ``fairness``: the tenants' shares over the same
    window. ``pods``: the serving pods (None: not listed this
    time, keep ``replicaStatus``); ``gateway``: the gateway's live Deployment, when
    ``gateway_wanted`` (more than one pod)."""
    rollout = rollout_state(deployment)
    fleet_gateway = gateway_status(gateway) if gateway_wanted else None
    conds = merge_conditions(
        old_status.get("conditions") or [],
        conditions(
            generation=generation, problems=problems, errors=errors, rollout=rollout, now=now,
            gateway=fleet_gateway, gateway_wanted=gateway_wanted,
        ),
    )
    model = SLOPolicyStatus(
        observed_generation=generation if not problems else old_status.get("observedGeneration"),
        conditions=conds,
        replicas=rollout.replicas if rollout else 0,
        ready_replicas=rollout.ready if rollout else 0,
        selector=selector,
        url=url,
        replica_status=replica_status(pods) if pods is not None else [],
        gateway=fleet_gateway,
    )
    status: JSON = model.model_dump(mode="json", by_alias=True, exclude_none=True)
    if pods is None and "replicaStatus" in old_status:
        status["replicaStatus"] = old_status["replicaStatus"]
    metric_keys = (
        "effectiveCutoff",
        "attainment",
        "recentAttainment",
        "recentWindowSeconds",
        "recentRequests",
        "fairness",
        "goodputTokensPerSecond",
        "scrapedPods",
        "lastScrapeTime",
    )
    if samples is None:
        for key in metric_keys:
            if key in old_status:
                status[key] = old_status[key]
        return status
    status["scrapedPods"] = len(samples)
    if samples:
        cutoffs = [s.effective_cutoff for s in samples if s.effective_cutoff is not None]
        if cutoffs:
            status["effectiveCutoff"] = round(sum(cutoffs) / len(cutoffs), 4)
        att = attainment(samples)
        if att is not None:
            status["attainment"] = att.model_dump(mode="json", by_alias=True, exclude_none=True)
        if goodput_per_s is not None:
            status["goodputTokensPerSecond"] = goodput_per_s
        if recent is not None and recent[1] > 0:
            totals, span = recent
            status["recentWindowSeconds"] = round(span)
            status["recentRequests"] = counted_requests(totals)
            recent_att = attainment_of(totals)
            if recent_att is not None:
                status["recentAttainment"] = recent_att.model_dump(
                    mode="json", by_alias=True, exclude_none=True
                )
        if fairness is not None:
            status["fairness"] = fairness.model_dump(mode="json", by_alias=True, exclude_none=True)
        status["lastScrapeTime"] = now
    return status


def status_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> JSON | None:
    """A JSON merge patch turning ``old`` into ``new`` (None when they are equal)."""
    if dict(old) == dict(new):
        return None
    patch: JSON = {}
    for key, value in new.items():
        before = old.get(key)
        if before == value:
            continue
        if isinstance(before, Mapping) and isinstance(value, Mapping):
            patch[key] = status_patch(before, value)
        else:
            patch[key] = value
    for key in old:
        if key not in new:
            patch[key] = None
    return patch
