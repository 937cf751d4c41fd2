"""The simulated fleet: engines of different speeds behind a placer fed with their
reports every period."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from jitserve.bench.fleet import scaled_profile
from jitserve.bench.variants import make_setup
from jitserve.goodput import GoodputLedger
from jitserve.placement.base import Ask, Pick, Refusal, ReplicaReport
from jitserve.placement.registry import make_placer
from jitserve.policy import SLOPolicySpec
from jitserve.requests import Request, Workitem
from jitserve.sim.cluster import Placement, run_placed
from jitserve.sim.engine import Engine
from jitserve.sim.latency import load_profile
from jitserve.sim.reports import EngineReporter, ask_of
from jitserve.sim.workload import WorkloadSpec, generate, parse_mix
from jitserve.slo import DeadlineSLO


def engines(speeds: Sequence[float], policy: str = "gmax") -> list[Engine]:
    ledger = GoodputLedger()
    out = []
    for i, speed in enumerate(speeds):
        setup = make_setup(policy, SLOPolicySpec(), seed=i)
        out.append(Engine(scaled_profile(load_profile(), speed), setup.policy, setup.estimator,
                          setup.stage_share, ledger=ledger))
    return out


def requests(n: int, gap_s: float = 0.05) -> list[Workitem]:
    return [Request(f"r{i}", "t", DeadlineSLO(30.0), 800, i * gap_s, output_tokens=200)
            for i in range(n)]


class Recording:
    """Wraps a placer; keeps every report it was given and every choice it made."""

    def __init__(self, name: str) -> None:
        self.inner = make_placer(name, seed=1)
        self.name = name
        self.reports: list[tuple[float, list[ReplicaReport]]] = []
        self.reported_at: list[float] = []

    def place(self, ask: Ask, reports: Sequence[ReplicaReport], now_s: float) -> Pick | Refusal:
        self.reports.append((now_s, list(reports)))
        return self.inner.place(ask, reports, now_s)

    def placed(self, ask: Ask, replica: str) -> None:
        self.inner.placed(ask, replica)

    def reported(self, report: ReplicaReport) -> None:
        self.reported_at.append(report.at_s)
        self.inner.reported(report)


def test_a_half_speed_replica_takes_twice_as_long() -> None:
    busy = []
    for speed in (1.0, 0.5):
        (engine,) = engines([speed], policy="fcfs")
        engine.run(requests(20))
        busy.append(engine.stats.busy_s)
    assert busy[1] == pytest.approx(2 * busy[0], rel=0.02)


@pytest.mark.parametrize("period_s", [0.25, 2.0])
def test_placement_reads_reports_at_most_one_period_old(period_s: float) -> None:
    """Every request is placed, whatever the period (the placer once refused reports
    over 1 s old: with a 2 s period, half the arrivals went to replica 0 as refused)."""
    fleet = engines([1.0, 1.0, 0.5])
    placer = Recording("power-of-k")
    stats = run_placed(fleet, requests(200, gap_s=0.02),
                       Placement(placer, fleet[0].lifecycle.estimator, period_s))
    assert sum(stats.placed) == 200 and stats.refused == 0
    assert fleet[0].ledger.overall.requests == 200
    for now_s, reports in placer.reports:
        assert {r.replica for r in reports} == {"r0", "r1", "r2"}
        assert all(0 <= now_s - r.at_s < period_s + 1e-9 for r in reports)
    # a report per replica per period over the 4 s of arrivals
    assert len(placer.reported_at) == 3 * (int(199 * 0.02 / period_s) + 1)


def test_the_slow_replica_gets_less_work_from_power_of_k() -> None:
    spec = WorkloadSpec(trace="azure-conv", mix=parse_mix("1:1:1"), duration_s=30.0,
                        rate_per_s=3.0 * 3.5, seed=1)
    fleet = engines([1.0, 1.0, 0.5])
    stats = run_placed(fleet, generate(spec), Placement(
        make_placer("power-of-k", 1), fleet[0].lifecycle.estimator))
    assert stats.placed[2] < min(stats.placed[:2])
    assert fleet[0].ledger.overall.requests > 0


def test_reports_carry_what_a_sidecar_publishes() -> None:
    (engine,) = engines([1.0])
    reporter = EngineReporter("r0", engine)
    empty = reporter.report(0.0)
    assert (empty.running, empty.waiting, empty.outstanding_tokens) == (0, 0, 0)
    assert empty.admit_priority == 0.0 and empty.ready and empty.max_running == 256
    for item in requests(300, gap_s=0.0):
        engine.submit(item)
    engine.advance(until_s=0.01)
    busy = reporter.report(engine.now)
    assert busy.running + busy.waiting == 300
    assert busy.running <= busy.max_running and busy.waiting == sum(
        busy.waiting_by_kind.values())
    assert busy.prefill_tokens > 0 and busy.outstanding_tokens > busy.prefill_tokens
    assert 0 < busy.kv_usage <= 1


def test_a_program_is_asked_for_as_one_item_with_its_book_key() -> None:
    spec = WorkloadSpec(trace="azure-conv", mix=parse_mix("0:0:1"), duration_s=20.0,
                        rate_per_s=1.0, seed=2)
    program = next(iter(generate(spec)))
    (engine,) = engines([1.0])
    ask = ask_of(program, engine.lifecycle.estimator)
    assert ask.program is not None and ask.program.endswith(ask.request_id)
    assert ask.prompt_tokens == program.input_tokens  # type: ignore[union-attr]
    assert ask.slo.deadline_s <= program.slo.deadline_s  # type: ignore[union-attr]


def test_several_replicas_need_a_placement() -> None:
    with pytest.raises(ValueError, match="needs a placement"):
        run_placed(engines([1.0, 1.0]), requests(2))
    fleet = [*engines([1.0]), *engines([1.0])]  # two ledgers
    with pytest.raises(ValueError, match="share a ledger"):
        run_placed(fleet, requests(2), Placement(make_placer("round-robin"),
                                                 fleet[0].lifecycle.estimator))
