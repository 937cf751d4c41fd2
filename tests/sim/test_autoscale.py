"""A simulated pool a scaler sizes while traffic plays: new replicas serve only after their
warm-up, drained ones finish every request they hold, and replica-seconds are what the
pool paid."""

from __future__ import annotations

from jitserve.bench.variants import make_setup
from jitserve.goodput import GoodputLedger
from jitserve.placement.power_of_k import PowerOfK
from jitserve.policy import SLOPolicySpec
from jitserve.requests import Request, Workitem
from jitserve.scaling.signals import Decision, PoolSignals, Static
from jitserve.sim.autoscale import run_pool
from jitserve.sim.engine import Engine
from jitserve.sim.latency import load_profile
from jitserve.sim.workload import WorkloadSpec, generate
from jitserve.slo import DeadlineSLO

SPEC = SLOPolicySpec()


class Recorded(Engine):
    """An engine that keeps when each item it was given arrived."""

    submitted: list[float]

    def submit(self, item: Workitem) -> None:
        self.submitted.append(item.arrival_s)
        super().submit(item)


def new_engine(index: int, ledger: GoodputLedger) -> Engine:
    setup = make_setup("gmax", SPEC, seed=index)
    engine = Recorded(load_profile(), setup.policy, setup.estimator, setup.stage_share,
                      ledger=ledger)
    engine.submitted = []
    return engine


def steady(n: int, gap_s: float) -> list[Workitem]:
    return [Request(f"r{i}", "t", DeadlineSLO(60.0), 600, i * gap_s, output_tokens=150)
            for i in range(n)]


class Script:
    """Asks for the counts in ``plan`` at the given times; records what it saw."""

    name = "script"
    period_s = 5.0

    def __init__(self, plan: dict[float, int]) -> None:
        self.plan = plan
        self.seen: list[PoolSignals] = []

    def decide(self, signals: PoolSignals) -> Decision:
        self.seen.append(signals)
        wanted = [n for t, n in sorted(self.plan.items()) if t <= signals.at_s]
        return Decision(wanted[-1] if wanted else signals.provisioned, "scripted")


def placer() -> PowerOfK:
    return PowerOfK(1, None, SPEC)


def test_a_static_pool_pays_its_size_for_the_whole_run() -> None:
    items = steady(400, 0.25)
    run = run_pool(items, new_engine, placer(), make_setup("gmax", SPEC).estimator,
                   Static(3, period_s=5.0), initial=3, warmup_s=30.0, end_s=100.0)
    assert run.replica_seconds() == 300.0
    assert run.ledger.overall.requests == 400
    assert run.changes == 0


def test_new_replicas_serve_only_after_warm_up_and_drained_ones_finish_their_work() -> None:
    items = steady(1200, 0.1)  # 10/s over 120 s
    script = Script({0.0: 1, 10.0: 3, 60.0: 1})
    run = run_pool(items, new_engine, placer(), make_setup("gmax", SPEC).estimator, script,
                   initial=1, warmup_s=20.0, end_s=120.0)
    assert run.ledger.overall.requests == len(items)  # nothing lost to a drain
    _, *added = run.replicas
    assert len(added) == 2
    for replica in added:
        assert replica.created_s == 10.0 and replica.ready_s == 30.0
        submitted = replica.engine.submitted  # type: ignore[attr-defined]
        assert submitted and min(submitted) >= 30.0  # nothing placed while it warmed
    drained = [r for r in run.replicas if r.draining_s is not None]
    assert len(drained) == 2 and all(r.draining_s == 60.0 for r in drained)
    for replica in drained:
        assert max(replica.engine.submitted) < 60.0  # type: ignore[attr-defined]
    gone = [r for r in run.replicas if r.gone_s is not None]
    assert len(gone) == 2 and all(r.engine.outstanding == 0 for r in gone)
    # the warm-up shows in what the scaler saw
    at_20 = next(s for s in script.seen if s.at_s == 20.0)
    assert (at_20.ready, at_20.warming) == (1, 2)
    at_35 = next(s for s in script.seen if s.at_s == 35.0)
    assert (at_35.ready, at_35.warming) == (3, 0)
    # one replica for 120 s, two from 10 s until their drains ended
    paid = run.replica_seconds()
    assert 120 + 2 * 50 <= paid <= 120 + 2 * 110


def test_the_scaler_sees_arrivals_outcomes_and_latency_percentiles() -> None:
    spec = WorkloadSpec(trace="azure-conv", rate_per_s=2.0, duration_s=120.0, seed=2)
    script = Script({})
    run = run_pool(generate(spec), new_engine, placer(), make_setup("gmax", SPEC).estimator,
                   script, initial=2, warmup_s=10.0, end_s=120.0)
    arrived = sum(s.arrived for s in script.seen)
    assert 0 < arrived <= run.ledger.overall.requests
    ended = sum(sum(s.finished.values()) for s in script.seen)
    assert 0 < ended <= run.ledger.overall.requests
    assert all(sum(s.met.values()) <= sum(s.finished.values()) for s in script.seen)
    late = [s for s in script.seen if s.at_s >= 60.0]
    assert all(s.p90_ttft_s is not None and s.p90_ttft_s > 0 for s in late)
    assert all(s.p90_tpot_s is not None and 0 < s.p90_tpot_s < 1.0 for s in late)


def test_a_step_up_in_load_is_served_within_one_period_and_the_warm_up() -> None:
    """The planner's added replicas serve at most one period plus the warm-up after the
    rate steps up (the issue's bound): it sizes for the new rate at its first decision."""
    from jitserve.policy.autoscaling import AutoscalingSettings
    from jitserve.scaling.planner import SLOPlanner

    step_s, period_s, warmup_s = 120.0, 15.0, 30.0
    slow = [Request(f"a{i}", "t", DeadlineSLO(60.0), 100, i * 0.5, output_tokens=20)
            for i in range(int(step_s / 0.5))]  # 2/s
    fast = [Request(f"b{i}", "t", DeadlineSLO(60.0), 100, step_s + i / 12, output_tokens=20)
            for i in range(12 * 120)]  # 12/s
    settings = AutoscalingSettings(enabled=True, replica_capacity=2.0, utilization=0.5,
                                   max_replicas=40, period_seconds=period_s,
                                   warmup_seconds=warmup_s)
    run = run_pool([*slow, *fast], new_engine, placer(), make_setup("gmax", SPEC).estimator,
                   SLOPlanner(settings), initial=2, warmup_s=warmup_s, end_s=240.0)
    needed = 12 / (2.0 * 0.5)  # the new rate at the planner's utilization
    by = step_s + period_s + warmup_s
    ready = [s.ready for s in run.samples if s.at_s >= by]
    assert ready and ready[0] >= needed, [(s.at_s, s.ready, s.warming) for s in run.samples]
