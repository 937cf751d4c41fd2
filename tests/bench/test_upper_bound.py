"""``upper-bound`` is at least the goodput of every policy the bench has."""

from __future__ import annotations

import pytest

from jitserve.bench.upper_bound import lone_token_times, upper_bound
from jitserve.bench.variants import make_setup, policy_names
from jitserve.goodput import GoodputLedger
from jitserve.policy import SLOPolicySpec
from jitserve.requests import Request, Workitem
from jitserve.sim.engine import Engine
from jitserve.sim.latency import Profile, load_profile
from jitserve.sim.workload import WorkloadSpec, generate
from jitserve.slo import DeadlineSLO, LatencySLO

pytest.importorskip("scipy")


def simulate(items: list[Workitem], policy: str, profile: Profile) -> GoodputLedger:
    setup = make_setup(policy, SLOPolicySpec())
    engine = Engine(profile, setup.policy, setup.estimator, setup.stage_share)
    return engine.run(items)


CASES = {
    "azure-conv, load ~1": (WorkloadSpec(duration_s=20, rate_per_s=3.0, seed=1), {}),
    "azure-conv, load ~2": (WorkloadSpec(duration_s=20, rate_per_s=6.0, seed=2), {}),
    "azure-code, latency and deadline": (
        WorkloadSpec(trace="azure-code", mix=(0.5, 0.5, 0.0), duration_s=20, rate_per_s=5.0),
        {},
    ),
    "few slots, small budget, small KV": (
        WorkloadSpec(duration_s=20, rate_per_s=2.0, seed=3),
        {"max_running": 8, "chunk_token_budget": 512, "kv_capacity_tokens": 30_000},
    ),
    "small budget": (
        WorkloadSpec(duration_s=20, rate_per_s=4.0, seed=5),
        {"chunk_token_budget": 512},
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bound_is_above_every_policy(case: str) -> None:
    spec, overrides = CASES[case]
    profile = load_profile().model_copy(update=overrides)
    items = list(generate(spec))
    bound = upper_bound(items, profile)
    assert bound.items == len(items)
    for policy in policy_names():
        if "qrf" in policy:
            continue  # same engine and goodput rules; its estimator needs the analyzer corpus
        ledger = simulate(items, policy, profile)
        assert ledger.overall.goodput_tokens <= bound.goodput_tokens, policy
        assert ledger.overall.met <= bound.met_requests + 1e-6, policy


def test_a_lone_request_is_bounded_by_what_it_can_earn() -> None:
    profile = load_profile()
    alone = lone_token_times(profile, 1000, 200)
    feasible = Request("a", "t", DeadlineSLO(float(alone[-1]) + 0.01), 1000, 0.0, output_tokens=200)
    bound = upper_bound([feasible], profile)
    assert bound.goodput_tokens == pytest.approx(1200, rel=1e-5)
    assert bound.met_requests == pytest.approx(1.0, rel=1e-5)
    # a deadline shorter than the request takes alone: nothing can be earned
    hopeless = Request("b", "t", DeadlineSLO(float(alone[-1]) - 0.01), 1000, 0.0, output_tokens=200)
    assert upper_bound([hopeless], profile).goodput_tokens == 0.0
    # a latency request earns only the tokens it could deliver on time, even alone
    tight = LatencySLO(ttft_s=float(alone[0]) + 0.001, tbt_s=0.001)
    late = Request("c", "t", tight, 1000, 0.0, output_tokens=200)
    result = upper_bound([late], profile)
    assert 1.0 <= result.goodput_tokens < 200
    assert result.met_requests == 0.0


def test_lone_times_bound_the_engine_and_match_its_branches() -> None:
    """The bound prices with the profile's straight branches, a lower envelope of its
    measured table: never slower than the engine, and exactly it on the branches alone."""
    request = Request("a", "t", DeadlineSLO(100.0), 3000, 0.0, output_tokens=50)
    for table in (True, False):
        profile = load_profile().model_copy(update={"chunk_token_budget": 8192})
        if not table:
            profile = profile.model_copy(update={"linear_table": None})
        ledger = simulate([request], "sarathi", profile)
        # one 3000-token chunk, then 49 lone decode steps
        lone = float(lone_token_times(profile, 3000, 50)[-1])
        engine = ledger.e2el.percentile(50)
        if table:
            assert lone <= engine * 1.01  # the histogram's 1% buckets
            assert lone < 0.99 * engine  # the table's steps are above the branches
        else:
            assert engine == pytest.approx(lone, rel=0.02)


def test_engine_time_binds_under_overload() -> None:
    """200 requests at once, 10 s to finish: engine time, not the deadlines, limits them."""
    profile = load_profile()
    items: list[Workitem] = [
        Request(f"r{i}", "t", DeadlineSLO(10.0), 1000, 0.0, output_tokens=100) for i in range(200)
    ]
    bound = upper_bound(items, profile)
    # each request needs >= 1100 tokens at a1 and its KV reads: ~90 ms of a 10 s window
    assert bound.goodput_tokens < 0.8 * 200 * 1100
    assert bound.met_requests < 0.8 * 200
    for policy in ("sarathi", "edf", "gmax"):
        ledger = simulate(items, policy, profile)
        assert ledger.overall.goodput_tokens <= bound.goodput_tokens
        assert ledger.overall.met <= bound.met_requests
