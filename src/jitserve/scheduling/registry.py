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
from jitserve.scheduling.base import Policy
from jitserve.scheduling.baselines import EDF, FCFS, LSF, PLAS, SJF, Sarathi
from jitserve.scheduling.baselines.keyed import KeyedPolicy
from jitserve.scheduling.baselines.slidingserve import SlidingServe
from jitserve.scheduling.gmax import GMAX
from jitserve.scheduling.overload import OverloadControl
from jitserve.scheduling.staged import StagedPolicy

BASELINES: dict[str, Callable[[SLOPolicySpec, OverloadControl | None], KeyedPolicy]] = {
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


def profiles(spec: SLOPolicySpec) -> dict[str, list[str]]:
    """Each scheduler's stages, in the order its frames run them, under ``spec``
    (docs/design.md draws this; a test keeps the drawing true)."""
    out = {}
    for name in scheduler_names():
        policy = make_policy(spec, name=name)
        assert isinstance(policy, StagedPolicy)
        out[name] = [stage.name for stage in policy.pipeline.stages]
    return out


def make_policy(spec: SLOPolicySpec, seed: int = 0, name: str | None = None) -> Policy:
    """The scheduler named by ``name`` (default: ``spec.scheduler.policy``)."""
    scheduler = name or spec.scheduler.policy
    if scheduler == "gmax":
        return GMAX(spec, seed=seed, overload=OverloadControl(follow_spec=True))
    base = scheduler.removesuffix(AC_SUFFIX)
    if base in BASELINES:
        overload = OverloadControl() if scheduler.endswith(AC_SUFFIX) else None
        return BASELINES[base](spec, overload)
    raise ValueError(f"unknown policy {scheduler!r}; known: {', '.join(scheduler_names())}")
