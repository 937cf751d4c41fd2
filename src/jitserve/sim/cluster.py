"""Several engine replicas behind a placer, on one simulated clock.

Who owns what: :func:`run_cluster` replays the workload; each work item, at its arrival
time, goes where a :class:`~jitserve.placement.base.Placer` (the same code the gateway
runs) picks, from :class:`~jitserve.placement.base.ReplicaReport` s built from every
engine's state (:mod:`jitserve.sim.reports`) and refreshed every ``report_period_s``
(0.25 s by default: the staleness a live gateway has; between reports the placer counts
what it sent, :meth:`~jitserve.placement.base.Placer.placed`). Each replica is an
independent :class:`~jitserve.sim.engine.Engine` with its own policy instance and speed;
all report to one :class:`~jitserve.goodput.GoodputLedger`.

A compound program is one work item placed once, at its arrival: all its calls run on
the replica that got it (sticky by construction), so one book scores it.

With ``Placement.late`` (``power-of-k-late``) a request is not placed at arrival: a copy
waits on K replicas and the first to start it keeps it (:mod:`jitserve.sim.late`); the
engines then advance in clock order. Programs are still placed whole at arrival.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from jitserve.goodput import GoodputLedger
from jitserve.placement.base import Placer, Refusal
from jitserve.requests import Request, Workitem
from jitserve.scheduling.estimators import LengthEstimator
from jitserve.sim.engine import Engine
from jitserve.sim.late import LateBinder, advance_in_step
from jitserve.sim.reports import EngineReporter, ask_of, report_all

DEFAULT_REPORT_PERIOD_S = 0.25


@dataclass
class Placement:
    """How a cluster places: the placer, the estimator the router reads lengths from
    (the gateway's: never the true length), and the report period."""

    placer: Placer
    estimator: LengthEstimator
    report_period_s: float = DEFAULT_REPORT_PERIOD_S
    late: LateBinding | None = None
    """Late binding of requests (the placer then places compound programs only)."""


@dataclass(frozen=True)
class LateBinding:
    k: int | None = None
    """Copies per request (default: one on every replica)."""
    seed: int = 0


@dataclass
class PlacementStats:
    placed: list[int]
    """Work items sent to each replica (late binding: programs placed there plus requests
    it started first; a request retired everywhere before any start is in none)."""
    refused: int = 0
    """Work items the placer refused (none in the simulator: every replica is ready and
    none sheds); counted, then sent to replica 0 so the ledger still scores them."""
    withdrawn: int = 0
    """Late binding: copies that left a replica unstarted and without an outcome."""


def run_cluster(
    engines: list[Engine],
    workload: Iterable[Workitem],
    placement: Placement | None = None,
) -> GoodputLedger:
    """Replay ``workload`` over ``engines`` (which must share one ledger); one engine
    needs no ``placement``."""
    run_placed(engines, workload, placement)
    return engines[0].ledger


def run_placed(
    engines: list[Engine],
    workload: Iterable[Workitem],
    placement: Placement | None = None,
) -> PlacementStats:
    if not engines:
        raise ValueError("a cluster needs at least one replica")
    ledger = engines[0].ledger
    if any(e.ledger is not ledger for e in engines):
        raise ValueError("replicas of one cluster must share a ledger")
    if placement is None and len(engines) > 1:
        raise ValueError("a cluster of several replicas needs a placement")
    stats = PlacementStats([0] * len(engines))
    reporters = [EngineReporter(f"r{i}", e) for i, e in enumerate(engines)]
    index = {r.name: i for i, r in enumerate(reporters)}
    reports = []
    next_report_s = 0.0
    binder = None
    if placement is not None and placement.late is not None:
        binder = LateBinder(engines, placement.late.k, placement.late.seed)

    def advance(until_s: float) -> None:
        if binder is not None:
            advance_in_step(engines, until_s)
            return
        for engine in engines:
            engine.advance_until(until_s)

    for item in workload:
        if placement is None:
            engines[0].advance_until(item.arrival_s)
            engines[0].submit(item)
            stats.placed[0] += 1
            continue
        while next_report_s <= item.arrival_s:
            advance(next_report_s)
            reports = report_all(reporters, placement.placer, next_report_s)
            next_report_s += placement.report_period_s
        advance(item.arrival_s)
        if binder is not None and isinstance(item, Request):
            binder.submit(item)
            continue
        ask = ask_of(item, placement.estimator)
        choice = placement.placer.place(ask, reports, item.arrival_s)
        if isinstance(choice, Refusal):
            stats.refused += 1
            target = 0
        else:
            target = index[choice.replica]
            placement.placer.placed(ask, choice.replica)
        engines[target].submit(item)
        stats.placed[target] += 1
    advance(math.inf)
    if binder is not None:
        assert binder.waiting_copies() == 0, "a late-bound request was left waiting"
        stats.placed = [p + s for p, s in zip(stats.placed, binder.started_on, strict=True)]
        stats.withdrawn = binder.withdrawn
    return stats
