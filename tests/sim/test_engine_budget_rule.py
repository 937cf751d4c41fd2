"""The simulator's engine runs each iteration at the budget its rule names."""

from __future__ import annotations

from dataclasses import replace

import pytest

from jitserve.bench.variants import make_setup
from jitserve.goodput import GoodputLedger
from jitserve.policy import SLOPolicySpec
from jitserve.policy_scheduler import BudgetRule
from jitserve.sim.engine import Engine, EngineStats
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
