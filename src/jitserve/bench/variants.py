"""The policies ``jitserve bench`` compares: a scheduler paired with its estimators.

A variant names a scheduler (``jitserve.scheduling.registry``), a length estimator and a
stage-share estimator, so that every alternative runs with the information it is meant to
have (e.g. ``gmax-qrf`` uses the analyzer's QRF and pattern matcher).
"""

from __future__ import annotations

from dataclasses import dataclass

from jitserve.policy import SLOPolicySpec
from jitserve.scheduling.base import Policy
from jitserve.scheduling.estimators import (
    LengthEstimator,
    MeanEstimator,
    OracleEstimator,
    OracleStageShare,
    QuantileEstimator,
    StageShareEstimator,
    UniformStageShare,
)
from jitserve.scheduling.registry import BASELINES, make_policy


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
