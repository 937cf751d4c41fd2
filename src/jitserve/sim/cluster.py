"""Several engine replicas behind a router, on one simulated clock.

Who owns what: the router (:func:`run_cluster`) sends each work item, at its arrival
time, to the replica with the least outstanding work (queued and running prompt tokens
plus work items not yet finished); each replica is an independent
:class:`~jitserve.sim.engine.Engine` with its own policy instance; all replicas report to
one :class:`~jitserve.goodput.GoodputLedger`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from jitserve.goodput import GoodputLedger
from jitserve.requests import Workitem
from jitserve.sim.engine import Engine


def run_cluster(engines: list[Engine], workload: Iterable[Workitem]) -> GoodputLedger:
    """Replay ``workload`` over ``engines`` (which must share one ledger)."""
    if not engines:
        raise ValueError("a cluster needs at least one replica")
    ledger = engines[0].ledger
    if any(e.ledger is not ledger for e in engines):
        raise ValueError("replicas of one cluster must share a ledger")
    for item in workload:
        for engine in engines:
            _advance_until(engine, item.arrival_s)
        least_loaded(engines).submit(item)
    for engine in engines:
        _advance_until(engine, math.inf)
    return ledger


def least_loaded(engines: list[Engine], load: Callable[[Engine], float] | None = None) -> Engine:
    measure = load or (lambda e: e.outstanding + e.running)
    return min(engines, key=measure)


def _advance_until(engine: Engine, until_s: float) -> None:
    while engine.now < until_s and engine.advance(until_s=until_s):
        pass
