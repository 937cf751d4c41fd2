"""The simulator's engine runs each iteration at the budget its rule names."""

from __future__ import annotations

from dataclasses import replace

import pytest

from jitserve.bench.variants import make_setup
from jitserve.goodput import GoodputLedger
from jitserve.policy import BudgetRule, SLOPolicySpec
from jitserve.sim.engine import Engine
from jitserve.sim.engine_stats import EngineStats
from jitserve.sim.latency import load_profile
from jitserve.sim.workload import WorkloadSpec, generate


def run(rule: BudgetRule, policy: str, constructor: bool = False,
        ) -> tuple[EngineStats, GoodputLedger]:
    profile = load_profile().model_copy(update={"chunk_token_budget": 4096})
    spec = SLOPolicySpec()
    setup = make_setup(policy, spec, seed=1)
    ledger = GoodputLedger()
    engine = Engine(profile, setup.policy, setup.estimator, setup.stage_share, ledger=ledger,
                    budget_rule=rule, batch_constructor=constructor)
    # the trace's first rows: a burst of long prompts beside tight decodes (seeds now pick
    # other windows)
    workload = replace(WorkloadSpec(trace="azure-conv", mix=(1.0, 0.0, 0.0), duration_s=30,
                                    slo=spec.slo_defaults), rate_per_s=12.0, seed=3,
                       window_offset=0)
    engine.run(generate(workload))
    return engine.stats, ledger


@pytest.mark.parametrize("policy", ["gmax", "edf-ac"])
def test_slo_rules_cut_the_budget_under_tight_decodes_and_fixed_never(policy: str) -> None:
    fixed, fixed_ledger = run(BudgetRule.FIXED, policy)
    assert fixed.budget_cuts == 0
    for rule in (BudgetRule.GREEDY, BudgetRule.SLIDING):
        stats, ledger = run(rule, policy)
        assert 0 < stats.budget_cuts <= stats.iterations
        assert ledger.overall.requests == fixed_ledger.overall.requests  # same arrivals


def test_the_batch_constructor_replaces_some_batches_and_never_without_it() -> None:
    plain, _ = run(BudgetRule.SLIDING, "slidingserve-ac")
    assert plain.constructed == 0
    built, ledger = run(BudgetRule.SLIDING, "slidingserve-ac", constructor=True)
    assert 0 < built.constructed <= built.iterations
    assert ledger.overall.requests > 0


def test_the_rules_predict_with_the_live_estimator_learned_from_simulated_steps() -> None:
    """Estimators, not the truth: the simulated rules read the in-engine scheduler's online
    model, warm started from the profile and refitted from the steps simulated since; its
    error against the engine's exact step time is in the results."""
    from jitserve.engine.steps import BudgetSteps
    from jitserve.sim.budgeting import warm_started

    profile = load_profile().model_copy(update={"chunk_token_budget": 4096})
    setup = make_setup("gmax", SLOPolicySpec(), seed=1)
    engine = Engine(profile, setup.policy, setup.estimator, setup.stage_share,
                    budget_rule=BudgetRule.SLIDING)
    assert engine.step_model is not None
    assert type(engine.step_model) is type(BudgetSteps(BudgetRule.SLIDING, 4096).model)
    warm = warm_started(profile).coef
    assert engine.step_model.coef == warm
    workload = replace(WorkloadSpec(trace="azure-conv", mix=(1.0, 0.0, 0.0), duration_s=30),
                       rate_per_s=12.0, seed=3, window_offset=0)
    engine.run(generate(workload))
    assert engine.step_model.coef != warm  # refitted from what was simulated
    exact = profile.step_s(512, 512 * 256.0, 64, 64 * 1024, 65)
    predicted = engine.step_model.predict(512 + 64, 65)
    assert predicted != pytest.approx(exact, rel=1e-3)  # a model, with its error
    assert predicted == pytest.approx(exact, rel=0.5)  # and a model of this engine
    fixed = Engine(profile, setup.policy, setup.estimator, setup.stage_share)
    assert fixed.step_model is None  # nothing predicts steps under the fixed budget
