"""Build a scheduling policy by name: the one place that knows every scheduler.

``make_policy(spec)`` is what the sidecar calls with its config; the bench pairs a
policy with the estimators it runs with (``jitserve.bench.variants``).

Names: ``gmax`` (inside the overload-control layer, switched by
``mechanisms.overloadControl``), each baseline as stock engines run it (``fcfs``,
``sarathi``, ``edf``, ``lsf``, ``sjf``, ``plas``, SlidingServe's sorter ``slidingserve``:
no overload control) and with GMAX's
overload control (``fcfs-ac``, ...).
"""

from __future__ import annotations

from collections.abc import Callable

from jitserve.policy import SLOPolicySpec
from jitserve.scheduling.base import KeyedPolicy, Policy
from jitserve.scheduling.baselines import EDF, FCFS, LSF, PLAS, SJF, Sarathi
from jitserve.scheduling.gmax import GMAX
from jitserve.scheduling.overload import with_overload_control
from jitserve.scheduling.slidingserve import SlidingServe

BASELINES: dict[str, Callable[[], KeyedPolicy]] = {
    "fcfs": FCFS,
    "sarathi": Sarathi,
    "edf": EDF,
    "lsf": LSF,
    "sjf": SJF,
    "plas": PLAS,
    "slidingserve": SlidingServe,
}
AC_SUFFIX = "-ac"
"""A baseline with the overload control GMAX has (admission control)."""


def scheduler_names() -> list[str]:
    return ["gmax", *BASELINES, *(f"{name}{AC_SUFFIX}" for name in BASELINES)]


def make_policy(spec: SLOPolicySpec, seed: int = 0, name: str | None = None) -> Policy:
    """The scheduler named by ``name`` (default: ``spec.scheduler.policy``)."""
    scheduler = name or spec.scheduler.policy
    if scheduler == "gmax":
        return with_overload_control(GMAX(spec, seed=seed), spec, follow_spec=True)
    if scheduler in BASELINES:
        policy = BASELINES[scheduler]()
        policy.configure(spec)
        return policy
    base = scheduler.removesuffix(AC_SUFFIX)
    if scheduler.endswith(AC_SUFFIX) and base in BASELINES:
        return with_overload_control(BASELINES[base](), spec)
    raise ValueError(f"unknown policy {scheduler!r}; known: {', '.join(scheduler_names())}")
