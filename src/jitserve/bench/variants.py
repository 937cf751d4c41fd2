"""The policies ``jitserve bench`` compares: a scheduler paired with its estimators.

A variant names a scheduler (``jitserve.scheduling.registry``), a length estimator and a
stage-share estimator, so that every alternative runs with the information it is meant to
have, and optionally GMAX mechanisms to switch off (ablations). Comparisons are fair by
construction:

- every baseline runs raw (what stock engines do) and as ``<name>-ac``, inside the same
  overload-control layer GMAX runs in;
- a length-aware baseline (LSF, SJF read the bounds) gets the same estimators as the
  GMAX variant it sits beside: the in-process quantile model (``gmax``, ``lsf-ac``), the
  analyzer's QRF and pattern matcher (``gmax-qrf``, ``lsf-ac-qrf``), or exact lengths
  (``gmax-exact``, ``lsf-ac-exact``: simulation only; GMAX with exact lengths is a
  heuristic, not a bound);
- ``gmax-no-<mechanism>`` is GMAX with one mechanism off (``scheduler.mechanisms``).
"""

from __future__ import annotations

from dataclasses import dataclass

from jitserve.goodput import GoodputLedger
from jitserve.policy import MechanismSettings, SLOPolicySpec
from jitserve.scheduling.base import Policy
from jitserve.scheduling.estimators import (
    ExactEstimator,
    ExactStageShare,
    FrozenBounds,
    LengthEstimator,
    MeanEstimator,
    QuantileEstimator,
    StageShareEstimator,
    UniformStageShare,
)
from jitserve.scheduling.registry import AC_SUFFIX, BASELINES, make_policy
from jitserve.sim.engine import Engine
from jitserve.sim.latency import Profile


@dataclass
class Setup:
    policy: Policy
    estimator: LengthEstimator
    stage_share: StageShareEstimator


@dataclass(frozen=True)
class Variant:
    scheduler: str
    estimator: str = "quantile"
    stage_share: str = "uniform"
    off: tuple[str, ...] = ()
    """``MechanismSettings`` fields switched off (ablation)."""


ABLATIONS: dict[str, str] = {
    "cutoff": "cutoff",
    "window": "length_window",
    "preemption": "preemption",
    "refinement": "refinement",
    "fairness": "fairness",
    "aging": "aging",
    "overload": "overload_control",
    "pacing": "prefill_pacing",
    "sequencing": "latest_start_sequencing",
}
"""``gmax-no-<key>`` switches off mechanism ``<value>``."""
LENGTH_AWARE = ("lsf", "sjf")
"""Baselines that read the length bounds: they also run with each GMAX estimator."""
ESTIMATORS = {"qrf": ("qrf", "pattern"), "exact": ("exact", "exact")}

VARIANTS: dict[str, Variant] = {
    "gmax": Variant("gmax"),
    "gmax-mean": Variant("gmax", "mean"),
    "gmax-qrf": Variant("gmax", "qrf", "pattern"),
    "gmax-exact": Variant("gmax", "exact", "exact"),
    **{name: Variant(name) for name in BASELINES},
    **{f"{name}{AC_SUFFIX}": Variant(f"{name}{AC_SUFFIX}") for name in BASELINES},
    **{
        f"{name}{AC_SUFFIX}-{suffix}": Variant(f"{name}{AC_SUFFIX}", estimator, stage_share)
        for name in LENGTH_AWARE
        for suffix, (estimator, stage_share) in ESTIMATORS.items()
    },
    **{f"gmax-no-{key}": Variant("gmax", off=(field,)) for key, field in ABLATIONS.items()},
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
    if kind == "exact":
        return ExactEstimator()
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
    return ExactStageShare() if kind == "exact" else UniformStageShare()


def with_mechanisms_off(spec: SLOPolicySpec, off: tuple[str, ...]) -> SLOPolicySpec:
    """``spec`` with the named ``MechanismSettings`` fields set to false."""
    if not off:
        return spec
    unknown = set(off) - set(MechanismSettings.model_fields)
    if unknown:
        raise ValueError(f"unknown mechanisms {sorted(unknown)}")
    return spec.with_scheduler(
        mechanisms=spec.scheduler.mechanisms.model_copy(update=dict.fromkeys(off, False)))


def make_engine(name: str, spec: SLOPolicySpec, profile: Profile, seed: int,
                ledger: GoodputLedger | None = None) -> Engine:
    """An engine running policy ``name`` as ``spec``'s scheduler settings say."""
    setup = make_setup(name, spec, seed)
    scheduler = spec.scheduler
    return Engine(profile, setup.policy, setup.estimator, setup.stage_share, ledger=ledger,
                  refine_every=scheduler.refine_every, budget_rule=scheduler.budget_rule,
                  batch_constructor=scheduler.batch_constructor, spec=spec)


def make_setup(name: str, spec: SLOPolicySpec, seed: int = 0) -> Setup:
    if name not in VARIANTS:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(policy_names())}")
    variant = VARIANTS[name]
    spec = with_mechanisms_off(spec, variant.off)
    estimator = make_estimator(variant.estimator, spec.scheduler.length_quantile, seed)
    if not spec.scheduler.mechanisms.refinement:
        estimator = FrozenBounds(estimator)
    return Setup(
        make_policy(spec, seed, variant.scheduler),
        estimator,
        make_stage_share(variant.stage_share),
    )
