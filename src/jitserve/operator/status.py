"""Pure functions that compute an SLOPolicy's ``status``.

Inputs: the policy's generation, spec problems, the live Deployment, and what the
sidecars' ``/metrics`` said (:mod:`~jitserve.operator.sidecar_metrics`). Attainment per
kind = met / (met + missed + retired).

Attainment is reported twice: ``attainment`` over the pods' lifetime (their counters) and
``recentAttainment`` over the last ``spec.reporting.attainmentWindowSeconds``, from the
difference of two scrapes (:class:`~.sidecar_metrics.OutcomeHistory`), so tuning p or f
shows within it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from jitserve.goodput import ATTAINMENT_OUTCOMES
from jitserve.operator.replica_status import gateway_status, replica_status
from jitserve.operator.sidecar_metrics import Outcomes, SidecarSample
from jitserve.policy import (
    Attainment,
    AutoscalingStatus,
    Condition,
    ConditionType,
    FairnessStatus,
    GatewayStatus,
    SLOPolicyStatus,
)

JSON = dict[str, Any]

_COUNTED = ATTAINMENT_OUTCOMES
_KIND_FIELDS = {
    "latency": "latency",
    "deadline": "deadline",
    "compound": "compound",
    "best_effort": "best_effort",
}


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


def policy_in_effect(samples: Sequence[SidecarSample]) -> JSON:
    """``policyInEffect`` (the one name, or each with its pods, most first) and
    ``policyInEffectSince`` (the latest change on any pod); empty when no sidecar said."""
    counts: dict[str, int] = {}
    since = [s.policy_since_s for s in samples if s.policy_in_effect is not None
             and s.policy_since_s is not None]
    for sample in samples:
        if sample.policy_in_effect is not None:
            counts[sample.policy_in_effect] = counts.get(sample.policy_in_effect, 0) + 1
    if not counts:
        return {}
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    out: JSON = {"policyInEffect": ranked[0][0] if len(ranked) == 1 else
                 ", ".join(f"{name} {n}" for name, n in ranked)}
    if since:
        out["policyInEffectSince"] = datetime.fromtimestamp(max(since), UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ")
    return out


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
    autoscaling: JSON | None = None,
) -> JSON:
    """The full ``status`` (wire names). ``samples=None``: no scrape this time, keep metrics.

    ``recent``: outcome counts over the recent window and the seconds it covers
    (:meth:`OutcomeHistory.recent`); ``fairness``: the tenants' shares over the same
    window. ``pods``: the serving pods (None: not listed this
    time, keep ``replicaStatus``); ``gateway``: the gateway's live Deployment, when
    ``gateway_wanted`` (more than one pod); ``autoscaling``: the planner's decision
    (None: none this time, keep the last; empty: autoscaling is off)."""
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
    if autoscaling:
        status["autoscaling"] = AutoscalingStatus.model_validate(autoscaling).model_dump(
            mode="json", by_alias=True, exclude_none=True)
    elif autoscaling is None and "autoscaling" in old_status:
        status["autoscaling"] = old_status["autoscaling"]
    metric_keys = (
        "effectiveCutoff",
        "policyInEffect",
        "policyInEffectSince",
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
        status.update(policy_in_effect(samples))
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
