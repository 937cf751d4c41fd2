"""Length-aware baselines get the same information as the GMAX they are compared with,
and that information tells fresh requests apart (LSF is not EDF, SJF is not FIFO)."""

from __future__ import annotations

import pytest

from jitserve.bench.variants import ESTIMATORS, LENGTH_AWARE, VARIANTS, make_setup
from jitserve.policy import SLOPolicySpec
from jitserve.requests import LLMCall, Program, Stage
from jitserve.scheduling.baselines import EDF, FCFS, LSF, SJF
from jitserve.scheduling.estimators import (
    ExactEstimator,
    QuantileEstimator,
    UniformStageShare,
)
from jitserve.slo import CompoundSLO, DeadlineSLO
from tests.support.requests import live


def test_length_aware_baselines_run_with_each_gmax_estimator() -> None:
    for name in LENGTH_AWARE:
        assert VARIANTS[f"{name}-ac"].estimator == VARIANTS["gmax"].estimator
        for suffix in ESTIMATORS:
            gmax = VARIANTS[f"gmax-{suffix}"]
            baseline = VARIANTS[f"{name}-ac-{suffix}"]
            assert (baseline.estimator, baseline.stage_share) == (
                gmax.estimator,
                gmax.stage_share,
            )
    assert "oracle" not in VARIANTS and "gmax-exact" in VARIANTS
    setup = make_setup("sjf-ac-exact", SLOPolicySpec())
    assert isinstance(setup.estimator, ExactEstimator)


def trained() -> QuantileEstimator:
    """Short answers to short prompts, long answers to ~1k-token prompts."""
    q = QuantileEstimator(0.9, prior=())
    for i in range(200):
        q.observe(live(f"s{i}", prompt=100).req, 20 + i % 10)
        q.observe(live(f"l{i}", prompt=1100).req, 400 + i % 50)
    return q


def test_the_quantile_model_conditions_on_prompt_length() -> None:
    q = trained()
    short, long = live("short", prompt=100).req, live("long", prompt=1100).req
    assert q.bound(short, 0) < 40 < 400 < q.bound(long, 0)
    assert q.expected(short, 0) < q.expected(long, 0)
    # an unseen prompt size falls back to every length seen
    unseen = live("unseen", prompt=30000).req
    assert 20 <= q.expected(unseen, 0) <= 450
    # refinement still conditions on the tokens generated
    assert q.bound(short, 35) > 35
    # without features every fresh request looks the same
    flat = QuantileEstimator(0.9, prior=(), by_features=False)
    for i in range(200):
        flat.observe(live(f"s{i}", prompt=100).req, 20 + i % 10)
        flat.observe(live(f"l{i}", prompt=1100).req, 400 + i % 50)
    assert flat.bound(short, 0) == flat.bound(long, 0)


def with_bounds(q: QuantileEstimator, *rs: object) -> None:
    for r in rs:
        r.bound = q.bound(r.req, 0)  # type: ignore[attr-defined]
        r.expected = q.expected(r.req, 0)  # type: ignore[attr-defined]


def test_lsf_and_sjf_differ_from_edf_and_fifo_on_fresh_requests() -> None:
    q = trained()
    # same deadline; the long-answer request arrived later
    early_short = live("early-short", arrival=0.0, prompt=100, slo=DeadlineSLO(30))
    late_long = live("late-long", arrival=0.5, prompt=1100, slo=DeadlineSLO(29.5))
    with_bounds(q, early_short, late_long)

    def order(policy: object) -> list[str]:
        for r in (early_short, late_long):
            policy.enqueue(r, 1.0)  # type: ignore[attr-defined]
        return [policy.pop_next(1.0, 0).req.request_id for _ in range(2)]  # type: ignore[attr-defined]

    assert order(EDF()) == ["early-short", "late-long"]
    assert order(LSF()) == ["late-long", "early-short"]  # less slack: more work left
    assert order(FCFS()) == ["early-short", "late-long"]
    r = live("new-short", arrival=2.0, prompt=100, slo=DeadlineSLO(30))
    with_bounds(q, r)
    sjf = SJF()
    for x in (late_long, r):
        sjf.enqueue(x, 2.0)
    assert [sjf.pop_next(2.0, 0).req.request_id for _ in range(2)] == ["new-short", "late-long"]  # type: ignore[union-attr]


@pytest.mark.parametrize("stages", [2, 5])
def test_uniform_stage_share_learns_how_many_stages_programs_have(stages: int) -> None:
    share = UniformStageShare()
    program = Program("p", "t", 0.0, CompoundSLO(60), (Stage((LLMCall(10, 10),)),))
    assert share.stage_share(program, 0) == pytest.approx(1 / 4)  # prior: 4 stages
    for _ in range(10):
        share.observe_program(program, [1.0] * stages)
    assert share.stage_share(program, 0) == pytest.approx(1 / stages)
    assert share.stage_share(program, stages - 1) == 1.0
