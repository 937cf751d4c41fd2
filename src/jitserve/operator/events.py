"""Kubernetes Events for an SLOPolicy's state changes (owner: operator).

``kubectl describe slop NAME`` shows what happened to a policy: each condition that
changed (Ready, Progressing, Degraded: a new status or reason) and a move of the
sidecars' effective cutoff p by :data:`CUTOFF_STEP` or more. :func:`changes` is pure
(old status, new status -> what to tell); :func:`event_object` builds the core/v1 Event;
posting one that fails is logged, never a failed reconcile.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jitserve.operator import constants as c
from jitserve.operator.kube import JSON, Kube, KubeError

log = logging.getLogger("jitserve.operator")

CUTOFF_STEP = 0.05
"""A move of the mean effective p this large is an Event (smaller ones are the adaptive
cutoff's usual drift, visible in the status and the metrics)."""

COMPONENT = "jitserve-operator"


@dataclass(frozen=True)
class Change:
    type: str  # Normal | Warning
    reason: str
    message: str


def _by_type(status: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {str(cond.get("type")): cond for cond in status.get("conditions") or ()}


def _warning(kind: str, status: str) -> bool:
    """Degraded=True is bad news; so is Ready going False (not at creation)."""
    return (kind == "Degraded" and status == "True") or (kind == "Ready" and status == "False")


def changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    """What changed from ``old`` to ``new`` status worth an Event."""
    out: list[Change] = []
    before = _by_type(old)
    for kind, cond in _by_type(new).items():
        prev = before.get(kind)
        status, reason = str(cond.get("status")), str(cond.get("reason"))
        if prev is not None and (prev.get("status"), prev.get("reason")) == (status, reason):
            continue
        warn = _warning(kind, status) and (prev is not None or kind == "Degraded")
        was = "" if prev is None else f" (was {prev.get('status')}, {prev.get('reason')})"
        out.append(Change("Warning" if warn else "Normal", reason,
                          f"{kind}={status}: {cond.get('message') or reason}{was}"))
    p_old, p_new = old.get("effectiveCutoff"), new.get("effectiveCutoff")
    if isinstance(p_old, int | float) and isinstance(p_new, int | float) \
            and abs(p_new - p_old) >= CUTOFF_STEP:
        out.append(Change("Normal", "CutoffMoved",
                          f"the sidecars' mean effective p moved {p_old:.3f} -> {p_new:.3f}"))
    return out


def event_object(policy: JSON, change: Change, now: str) -> JSON:
    meta = policy["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {"apiVersion": c.API_VERSION, "kind": c.KIND,
                           "name": meta["name"], "namespace": meta["namespace"],
                           "uid": meta.get("uid", ""),
                           "resourceVersion": meta.get("resourceVersion", "")},
        "reason": change.reason,
        "message": change.message[:1024],
        "type": change.type,
        "source": {"component": COMPONENT, "host": socket.gethostname()},
        "reportingComponent": COMPONENT,
        "reportingInstance": socket.gethostname(),
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def post(kube: Kube, policy: JSON, found: list[Change], now: str) -> None:
    for change in found:
        try:
            kube.create(event_object(policy, change, now))
        except KubeError as err:  # an Event is for humans: never fail the reconcile
            log.warning("could not post Event %s for %s/%s: %s", change.reason,
                        policy["metadata"]["namespace"], policy["metadata"]["name"], err)
