"""Build a policy and its estimators by name: one place that knows every policy.

``make_policy(spec, ...)`` is what the sidecar calls with its config; the simulator's
bench calls :func:`make_setup` to get a policy together with the length and stage-share
estimators it is meant to run with (e.g. the oracle is GMAX with exact lengths).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from jitserve.policy import SLOPolicySpec
from jitserve.scheduling.base import Policy
from jitserve.scheduling.baselines import EDF, FCFS, LSF, PLAS, SJF, Sarathi
from jitserve.scheduling.estimators import (
    LengthEstimator,
    MeanEstimator,
    OracleEstimator,
    OracleStageShare,
    QuantileEstimator,
    StageShareEstimator,
    UniformStageShare,
)
from jitserve.scheduling.gmax import GMAX

BASELINES: dict[str, Callable[[], Policy]] = {
    "fcfs": FCFS,
    "sarathi": Sarathi,
    "edf": EDF,
    "lsf": LSF,
    "sjf": SJF,
    "plas": PLAS,
}


@dataclass
class Setup:
    policy: Policy
    estimator: LengthEstimator
    stage_share: StageShareEstimator


# policy name -> (scheduler, length estimator, stage-share estimator)
VARIANTS: dict[str, tuple[str, str, str]] = {
    "gmax": ("gmax", "quantile", "uniform"),
    "gmax-mean": ("gmax", "mean", "uniform"),
    "gmax-qrf": ("gmax", "qrf", "pattern"),
    "oracle": ("gmax", "oracle", "oracle"),
    **{name: (name, "quantile", "uniform") for name in BASELINES},
}


def policy_names() -> list[str]:
    return list(VARIANTS)


def make_policy(spec: SLOPolicySpec, seed: int = 0, name: str | None = None) -> Policy:
    """The scheduler named by ``name`` (default: ``spec.scheduler.policy``)."""
    scheduler = VARIANTS.get(
        name or spec.scheduler.policy, (name or spec.scheduler.policy, "", "")
    )[0]
    if scheduler == "gmax":
        return GMAX(spec, seed=seed)
    if scheduler in BASELINES:
        policy = BASELINES[scheduler]()
        policy.configure(spec)
        return policy
    raise ValueError(f"unknown policy {scheduler!r}; known: {', '.join(policy_names())}")


def make_estimator(kind: str, quantile: float = 0.95, seed: int = 0) -> LengthEstimator:
    if kind == "qrf":
        try:
            from jitserve.analyzer.qrf import QRFEstimator
        except ImportError as err:
            raise ValueError(
                f"the qrf estimator needs the analyzer extra ({err.name} missing)"
            ) from err
        return QRFEstimator.pretrained(quantile=quantile, seed=seed)
    if kind == "oracle":
        return OracleEstimator()
    if kind == "mean":
        return MeanEstimator()
    if kind == "quantile":
        return QuantileEstimator(quantile)
    raise ValueError(f"unknown length estimator {kind!r}")


def make_stage_share(kind: str) -> StageShareEstimator:
    if kind == "pattern":
        try:
            from jitserve.analyzer.matcher import PatternMatcher
        except ImportError as err:
            raise ValueError(
                f"pattern matching needs the analyzer extra ({err.name} missing)"
            ) from err
        return PatternMatcher()
    return OracleStageShare() if kind == "oracle" else UniformStageShare()


def make_setup(name: str, spec: SLOPolicySpec, seed: int = 0) -> Setup:
    if name not in VARIANTS:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(policy_names())}")
    scheduler, estimator, stage_share = VARIANTS[name]
    return Setup(
        make_policy(spec, seed, scheduler),
        make_estimator(estimator, spec.scheduler.length_quantile, seed),
        make_stage_share(stage_share),
    )
