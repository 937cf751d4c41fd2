"""A pool of simulated replicas that a :class:`~jitserve.scaling.signals.Scaler` sizes
while traffic plays: replicas are created (and serve only after a warm-up), drained
(no new work; they leave when their last request and program has ended), all behind the
gateway's placer.

Who owns what: :func:`run_pool` replays the workload on one clock. Every
``report_period_s`` the serving replicas report to the placer (as in
:mod:`jitserve.sim.cluster`); every ``scaler.period_s`` the pool builds the period's
:class:`~jitserve.scaling.signals.PoolSignals` (arrivals, outcomes by kind from the shared
:class:`WindowLedger`, the queue, P90 TTFT and TPOT of the last minute's latency
requests), asks
the scaler for a count and applies it: new replicas warm for ``warmup_s``; removals take
a warming replica first, then drain the serving one with the least outstanding work.
A replica costs from its creation until it has drained (or the run's end):
:meth:`PoolRun.replica_seconds`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from jitserve.goodput import GoodputLedger, Outcome
from jitserve.placement.base import Placer, Refusal, ReplicaReport
from jitserve.requests import Workitem
from jitserve.scaling.signals import PoolSignals, Scaler
from jitserve.scheduling.estimators import LengthEstimator
from jitserve.sim.engine import Engine
from jitserve.sim.reports import EngineReporter, ask_of, report_all
from jitserve.slo import SLOKind

LATENCY_WINDOW_S = 60.0
"""The P90s are of the latency requests finished over the last minute (llm-d's 1-minute
rates; only latency requests have TTFT and TPOT targets to measure them against)."""


@dataclass
class WindowLedger(GoodputLedger):
    """A ledger that also keeps the outcomes recorded since the pool last took them."""

    recent: list[Outcome] = field(default_factory=list)

    def record(self, o: Outcome) -> None:
        super().record(o)
        self.recent.append(o)

    def take(self) -> list[Outcome]:
        taken, self.recent = self.recent, []
        return taken


@dataclass
class Replica:
    name: str
    engine: Engine
    reporter: EngineReporter
    created_s: float
    ready_s: float
    draining_s: float | None = None
    gone_s: float | None = None

    def serving(self, now: float) -> bool:
        return self.gone_s is None and self.draining_s is None and self.ready_s <= now

    def warming(self, now: float) -> bool:
        return self.gone_s is None and self.draining_s is None and self.ready_s > now


@dataclass(frozen=True)
class PoolSample:
    at_s: float
    ready: int
    warming: int
    draining: int
    arrivals_per_s: float
    desired: int
    reason: str


@dataclass
class PoolRun:
    ledger: WindowLedger
    replicas: list[Replica]
    samples: list[PoolSample]
    end_s: float
    refused: int = 0

    def replica_seconds(self) -> float:
        """Replica-seconds paid over [0, end]: from creation to drained (or the end)."""
        return sum(
            max(min(r.gone_s if r.gone_s is not None else self.end_s, self.end_s)
                - r.created_s, 0.0)
            for r in self.replicas
        )  # fmt: skip

    @property
    def changes(self) -> int:
        """Decisions that changed the replica count."""
        return sum(1 for s in self.samples if s.desired != s.ready + s.warming)


def tpot_s(o: Outcome) -> float | None:
    if o.ttft_s is None or o.e2el_s is None or o.output_tokens < 2:
        return None
    return (o.e2el_s - o.ttft_s) / (o.output_tokens - 1)


class _Pool:
    def __init__(
        self,
        new_engine: Callable[[int, GoodputLedger], Engine],
        placer: Placer,
        estimator: LengthEstimator,
        scaler: Scaler,
        warmup_s: float,
    ) -> None:
        self.new_engine = new_engine
        self.placer = placer
        self.estimator = estimator
        self.scaler = scaler
        self.warmup_s = warmup_s
        self.ledger = WindowLedger()
        self.replicas: list[Replica] = []
        self.reports: list[ReplicaReport] = []
        self.samples: list[PoolSample] = []
        self.latencies: deque[tuple[float, float, float | None]] = deque()
        self.arrived = 0
        self.refused = 0
        self.last_decision_s = 0.0

    def add(self, now: float, warm: bool) -> None:
        engine = self.new_engine(len(self.replicas), self.ledger)
        engine.now = now
        name = f"r{len(self.replicas)}"
        ready = now if warm else now + self.warmup_s
        self.replicas.append(Replica(name, engine, EngineReporter(name, engine), now, ready))

    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.gone_s is None]

    def advance(self, until_s: float) -> None:
        for r in self.live():
            r.engine.advance_until(until_s)

    def report(self, now: float) -> None:
        for r in self.live():
            if r.draining_s is not None and r.engine.outstanding == 0:
                r.gone_s = now
        self.reports = report_all(
            (r.reporter for r in self.replicas if r.serving(now)), self.placer, now
        )

    def place(self, item: Workitem) -> None:
        self.arrived += 1
        serving = {r.name: r for r in self.replicas if r.serving(item.arrival_s)}
        assert serving, "a pool keeps at least one serving replica"
        ask = ask_of(item, self.estimator)
        reports = [rep for rep in self.reports if rep.replica in serving]
        if not reports:  # a replica became ready since the last report
            reports = [r.reporter.report(item.arrival_s) for r in serving.values()]
        choice = self.placer.place(ask, reports, item.arrival_s)
        if isinstance(choice, Refusal):
            self.refused += 1
            target = next(iter(serving))
        else:
            target = choice.replica
            self.placer.placed(ask, target)
        serving[target].engine.submit(item)

    def signals(self, now: float) -> PoolSignals:
        finished: dict[SLOKind, int] = {}
        met: dict[SLOKind, int] = {}
        for o in self.ledger.take():
            finished[o.kind] = finished.get(o.kind, 0) + 1
            met[o.kind] = met.get(o.kind, 0) + int(o.met)
            if o.kind is SLOKind.LATENCY and o.ttft_s is not None and not o.retired:
                self.latencies.append((now, o.ttft_s, tpot_s(o)))
        while self.latencies and self.latencies[0][0] <= now - LATENCY_WINDOW_S:
            self.latencies.popleft()
        ttft = [t for _, t, _ in self.latencies]
        tpot = [t for _, _, t in self.latencies if t is not None]
        period = now - self.last_decision_s
        serving = [r for r in self.replicas if r.serving(now)]
        return PoolSignals(
            at_s=now, period_s=period, ready=len(serving),
            warming=sum(1 for r in self.replicas if r.warming(now)), arrived=self.arrived,
            finished=finished, met=met,
            queued=sum(r.engine.policy.waiting() for r in serving),
            p90_ttft_s=float(np.percentile(ttft, 90)) if ttft else None,
            p90_tpot_s=float(np.percentile(tpot, 90)) if tpot else None,
        )  # fmt: skip

    def decide(self, now: float) -> None:
        signals = self.signals(now)
        decision = self.scaler.decide(signals)
        self.samples.append(PoolSample(
            now, signals.ready, signals.warming,
            sum(1 for r in self.replicas if r.draining_s is not None and r.gone_s is None),
            signals.arrived / max(signals.period_s, 1e-9), decision.desired, decision.reason,
        ))  # fmt: skip
        self.arrived = 0
        self.last_decision_s = now
        for _ in range(decision.desired - signals.provisioned):
            self.add(now, warm=False)
        for _ in range(signals.provisioned - max(decision.desired, 1)):
            self.remove(now)

    def remove(self, now: float) -> None:
        warming = [r for r in self.replicas if r.warming(now)]
        if warming:
            gone = warming[-1]
            gone.gone_s = now
            return
        serving = [r for r in self.replicas if r.serving(now)]
        if len(serving) <= 1:
            return
        drained = min(serving, key=lambda r: r.engine.outstanding)
        drained.draining_s = now


def run_pool(
    items: Iterable[Workitem],
    new_engine: Callable[[int, GoodputLedger], Engine],
    placer: Placer,
    estimator: LengthEstimator,
    scaler: Scaler,
    *,
    initial: int,
    warmup_s: float,
    end_s: float,
    report_period_s: float = 0.25,
) -> PoolRun:
    """Replay ``items`` (in arrival order, all before ``end_s``) on a pool of ``initial``
    warm replicas that ``scaler`` sizes until ``end_s``; every engine is built by
    ``new_engine(index, ledger)`` on the pool's shared ledger."""
    if initial < 1:
        raise ValueError(f"a pool starts with at least one replica, got {initial}")
    pool = _Pool(new_engine, placer, estimator, scaler, warmup_s)
    for _ in range(initial):
        pool.add(0.0, warm=True)
    next_report, next_decision = 0.0, scaler.period_s

    def tick_to(t: float) -> None:
        nonlocal next_report, next_decision
        while min(next_report, next_decision) <= t:
            now = min(next_report, next_decision)
            pool.advance(now)
            if next_decision <= now:
                pool.decide(now)
                next_decision += scaler.period_s
            if next_report <= now:
                pool.report(now)
                next_report += report_period_s

    for item in items:
        tick_to(item.arrival_s)
        pool.advance(item.arrival_s)
        pool.place(item)
    tick_to(end_s)
    pool.advance(math.inf)
    return PoolRun(pool.ledger, pool.replicas, pool.samples, end_s, pool.refused)
