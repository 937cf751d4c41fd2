"""Late binding across simulated replicas: the paper's power-of-K (owner: simulator).

JITServe's multi-replica form (paper, "Supporting Multiple Models"): a request gets K
dummy copies on K sampled replicas; each replica's GMAX scores its copy at that
replica's speeds and queue (a replica-specific priority) and schedules over the enlarged
set; the first replica that *starts* a copy wins and the other copies vanish.

Who owns what: :class:`LateBinder` is the fleet's
:class:`~jitserve.serving.interface.Copies`: it puts a copy of each request in K
engines' lifecycles at arrival and, when one lifecycle starts a copy, withdraws the
others (:meth:`~jitserve.serving.lifecycle.Lifecycle.withdraw`, no outcome). A copy
that a replica retires while another still waits is withdrawn there only; the last
copy's retirement is the request's one outcome. :func:`advance_in_step` moves every
engine to a time in the order of their clocks, so a replica's start happens before
another replica, later on the clock, could start the same request.

Compound programs are not copied: the cluster places each at arrival, whole, on one
replica (its book and stages stay on one engine).
"""

from __future__ import annotations

import heapq
import math
import random

from jitserve.requests import LiveRequest, Phase, Request
from jitserve.serving.lifecycle import Lifecycle
from jitserve.sim.engine import Engine


class LateBinder:
    """The copies of each waiting, not yet started request, across ``engines``."""

    def __init__(self, engines: list[Engine], k: int | None = None, seed: int = 0) -> None:
        if k is not None and k < 1:
            raise ValueError(f"K must be >= 1, got {k}")
        self.engines = engines
        self.k = len(engines) if k is None else min(k, len(engines))
        self._rng = random.Random(seed)
        self._index = {id(e.lifecycle): i for i, e in enumerate(engines)}
        self._copies: dict[LiveRequest, list[tuple[Lifecycle, LiveRequest]]] = {}
        self.started_on = [0] * len(engines)
        """Requests each replica won (started first)."""
        self.withdrawn = 0
        """Copies withdrawn (another replica started the request, or retired here while
        another copy waited)."""
        for e in engines:
            e.lifecycle.copies = self

    def submit(self, req: Request) -> list[LiveRequest]:
        """``req`` arrives now: a copy waits on K replicas (all of them by default)."""
        n = len(self.engines)
        targets = range(n) if self.k == n else sorted(self._rng.sample(range(n), self.k))
        group: list[tuple[Lifecycle, LiveRequest]] = []
        for i in targets:
            engine = self.engines[i]
            assert engine.now >= req.arrival_s, "a replica's clock is behind the arrival"
            group.append((engine.lifecycle, engine.lifecycle.arrive(req, engine.now)))
        for _, r in group:
            self._copies[r] = group
        return [r for _, r in group]

    # ---- Copies -------------------------------------------------------------------
    def started(self, r: LiveRequest, now_s: float) -> None:
        group = self._copies.pop(r, None)
        if group is None:  # not a copy, or bound already (resumed after a preemption)
            return
        for lc, other in group:
            if other is r:
                self.started_on[self._index[id(lc)]] += 1
                continue
            self._copies.pop(other, None)
            if other.phase is Phase.WAITING:
                lc.withdraw(other)
                self.withdrawn += 1

    def leaving(self, r: LiveRequest) -> bool:
        group = self._copies.get(r)
        if group is None:
            return False
        del self._copies[r]
        group[:] = [(lc, o) for lc, o in group if o is not r]
        if any(o.phase is Phase.WAITING for _, o in group):
            self.withdrawn += 1
            return True
        return False

    def waiting_copies(self) -> int:
        """Copies still waiting for a start (0 once a run is over)."""
        return len(self._copies)


def advance_in_step(engines: list[Engine], until_s: float) -> None:
    """Advance every engine to ``until_s``, always the one furthest behind first: each
    replica starts work (its fill, at an iteration boundary) in global clock order. An
    engine with nothing to do waits at ``until_s``."""
    heap = [(e.now, i) for i, e in enumerate(engines) if e.now < until_s]
    heapq.heapify(heap)
    while heap:
        _, i = heapq.heappop(heap)
        engine = engines[i]
        if not engine.advance(until_s=until_s):
            if not math.isinf(until_s):
                engine.now = max(engine.now, until_s)
            continue
        if engine.now < until_s:
            heapq.heappush(heap, (engine.now, i))
