"""Build a scheduling policy by name: the one place that knows every scheduler.

``make_policy(spec)`` is what the sidecar calls with its config; the bench pairs a
policy with the estimators it runs with (``jitserve.bench.variants``).
"""

from __future__ import annotations

from collections.abc import Callable

from jitserve.policy import SLOPolicySpec
from jitserve.scheduling.base import Policy
from jitserve.scheduling.baselines import EDF, FCFS, LSF, PLAS, SJF, Sarathi
from jitserve.scheduling.gmax import GMAX

BASELINES: dict[str, Callable[[], Policy]] = {
    "fcfs": FCFS,
    "sarathi": Sarathi,
    "edf": EDF,
    "lsf": LSF,
    "sjf": SJF,
    "plas": PLAS,
}


def scheduler_names() -> list[str]:
    return ["gmax", *BASELINES]


def make_policy(spec: SLOPolicySpec, seed: int = 0, name: str | None = None) -> Policy:
    """The scheduler named by ``name`` (default: ``spec.scheduler.policy``)."""
    scheduler = name or spec.scheduler.policy
    if scheduler == "gmax":
        return GMAX(spec, seed=seed)
    if scheduler in BASELINES:
        policy = BASELINES[scheduler]()
        policy.configure(spec)
        return policy
    raise ValueError(f"unknown policy {scheduler!r}; known: {', '.join(scheduler_names())}")
