"""Late binding (``power-of-k-late``): a request waits as a copy on K replicas, the
first to start it keeps it, the others drop their copy without an outcome."""

from __future__ import annotations

from collections import Counter

import pytest

from jitserve.bench.fleet import scaled_profile
from jitserve.bench.variants import make_setup
from jitserve.goodput import GoodputLedger
from jitserve.placement.registry import make_placer
from jitserve.policy import SLOPolicySpec
from jitserve.requests import LiveRequest, Phase, Program, Request, Workitem
from jitserve.scheduling.base import RetireReason
from jitserve.sim import cluster
from jitserve.sim.cluster import LateBinding, Placement, run_placed
from jitserve.sim.engine import Engine
from jitserve.sim.late import LateBinder, advance_in_step
from jitserve.sim.latency import load_profile
from jitserve.sim.workload import WorkloadSpec, generate, parse_mix
from jitserve.slo import DeadlineSLO, SLOKind


def fleet(speeds: tuple[float, ...]) -> list[Engine]:
    ledger = GoodputLedger()
    out = []
    for i, speed in enumerate(speeds):
        setup = make_setup("gmax", SLOPolicySpec(), seed=i)
        out.append(Engine(scaled_profile(load_profile(), speed), setup.policy, setup.estimator,
                          setup.stage_share, ledger=ledger))
    return out


class Watching(LateBinder):
    """Counts each request's wins, so a test sees a second one."""

    def __init__(self, engines: list[Engine], k: int | None = None, seed: int = 0) -> None:
        super().__init__(engines, k, seed)
        self.wins: Counter[str] = Counter()

    def started(self, r: LiveRequest, now_s: float) -> None:
        if r in self._copies:
            self.wins[r.req.request_id] += 1
            others = [o for _, o in self._copies[r] if o is not r]
            assert all(o.phase is Phase.WAITING for o in others)
        super().started(r, now_s)


def test_a_request_started_on_one_replica_vanishes_from_the_others() -> None:
    engines = fleet((1.0, 1.0, 1.0))
    binder = LateBinder(engines)
    req = Request("r0", "t", DeadlineSLO(30.0), 400, 0.0, output_tokens=50)
    copies = binder.submit(req)
    assert [e.lifecycle.waiting for e in engines] == [[c] for c in copies]
    assert all(e.policy.waiting() == 1 and e.live == 1 for e in engines)
    advance_in_step(engines, 0.001)  # the first fill starts it
    running = [c for c in copies if c.phase is Phase.RUNNING]
    assert len(running) == 1
    for engine, copy in zip(engines, copies, strict=True):
        if copy is running[0]:
            continue
        assert copy.phase is Phase.WITHDRAWN
        assert not engine.lifecycle.waiting and engine.policy.waiting() == 0
        assert engine.live == 0
    assert binder.withdrawn == 2 and binder.waiting_copies() == 0
    advance_in_step(engines, float("inf"))
    assert engines[0].ledger.overall.requests == 1
    assert sum(e.stats.output_tokens for e in engines) == 50


def test_the_request_is_retired_only_when_its_last_copy_goes() -> None:
    engines = fleet((1.0, 1.0))
    binder = LateBinder(engines)
    ledger = engines[0].ledger
    req = Request("r0", "t", DeadlineSLO(30.0), 400, 0.0, output_tokens=50)
    a, b = binder.submit(req)
    assert engines[0].lifecycle.retire(a, RetireReason.UNREACHABLE, 0.0) == []
    assert a.phase is Phase.WITHDRAWN and b.phase is Phase.WAITING
    assert ledger.overall.requests == 0 and engines[0].live == 0
    assert engines[1].policy.waiting() == 1
    gone = engines[1].lifecycle.retire(b, RetireReason.UNREACHABLE, 0.0)
    assert [g.request for g in gone] == [b] and gone[0].outcome is not None
    assert b.phase is Phase.RETIRED and ledger.overall.requests == 1
    assert binder.waiting_copies() == 0
    # retiring a copy already withdrawn changes nothing
    assert engines[0].lifecycle.retire(a, RetireReason.UNREACHABLE, 0.0) == []
    assert ledger.overall.requests == 1


def test_a_lifecycle_without_copies_retires_as_before() -> None:
    (engine,) = fleet((1.0,))
    r = engine.lifecycle.arrive(Request("r0", "t", DeadlineSLO(30.0), 400, 0.0), 0.0)
    gone = engine.lifecycle.retire(r, RetireReason.UNREACHABLE, 0.0)
    assert len(gone) == 1 and r.phase is Phase.RETIRED
    with pytest.raises(AssertionError, match="withdrawing"):
        engine.lifecycle.withdraw(r)


@pytest.mark.parametrize("load", [1.0, 2.5])
def test_every_work_item_is_scored_once_and_won_by_one_replica(
    load: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    engines = fleet((1.0, 1.0, 0.5))
    spec = WorkloadSpec(trace="azure-conv", mix=parse_mix("1:1:1"), duration_s=30.0,
                        rate_per_s=3.0 * 2.5 * load, seed=7)
    items: list[Workitem] = list(generate(spec))
    kinds = Counter(
        SLOKind.COMPOUND if isinstance(i, Program) else i.slo.kind for i in items
    )
    binders: list[Watching] = []

    def watching(es: list[Engine], k: int | None, seed: int) -> Watching:
        binders.append(Watching(es, k, seed))
        return binders[-1]

    monkeypatch.setattr(cluster, "LateBinder", watching)
    placement = Placement(make_placer("power-of-k", 1), engines[0].lifecycle.estimator,
                          late=LateBinding(seed=1))
    stats = run_placed(engines, items, placement)
    ledger = engines[0].ledger
    assert ledger.overall.requests == len(items)
    assert {k: t.requests for k, t in ledger.by_kind.items() if t.requests} == dict(kinds)
    (binder,) = binders
    assert max(binder.wins.values()) == 1
    assert stats.withdrawn > 0 and binder.waiting_copies() == 0
    assert all(e.live == 0 and e.policy.waiting() == 0 for e in engines)
    if load > 2:  # overload: some requests are retired, each once
        assert ledger.overall.retired > 0


def test_k_of_m_puts_a_copy_on_k_sampled_replicas() -> None:
    engines = fleet((1.0, 1.0, 1.0, 1.0))
    binder = LateBinder(engines, k=2, seed=3)
    holders = set()
    for i in range(20):
        copies = binder.submit(Request(f"r{i}", "t", DeadlineSLO(30.0), 100, 0.0))
        where = [j for j, e in enumerate(engines) if any(c in e.lifecycle.waiting for c in copies)]
        assert len(copies) == 2 and len(where) == 2
        holders.add(tuple(where))
    assert len(holders) > 1  # sampled, not always the same two
    with pytest.raises(ValueError, match="K must be >= 1"):
        LateBinder(engines, k=0)
