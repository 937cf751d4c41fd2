"""Scheduler micro-benchmark: wall time of one GMAX frame (overload control included)
over N live requests."""

from __future__ import annotations

import time

import numpy as np

from jitserve.policy import SLOPolicySpec
from jitserve.requests import LiveRequest, Phase, Request
from jitserve.scheduling.base import EngineView
from jitserve.scheduling.registry import make_policy
from jitserve.slo import DeadlineSLO, LatencySLO

BATCH = 256


def live_requests(n: int, seed: int = 0) -> list[LiveRequest]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        slo = LatencySLO(2.0, 0.1) if i % 2 else DeadlineSLO(20.0)
        req = Request(
            f"r{i}", f"t{i % 3}", slo, int(rng.integers(10, 4000)), float(rng.uniform(0, 10))
        )
        r = LiveRequest(req)
        r.bound = int(rng.integers(50, 1500))
        out.append(r)
    return out


def time_frame(n: int, repeats: int = 20) -> float:
    """Median milliseconds of one frame with ``n`` live requests (256 of them running)."""
    policy = make_policy(SLOPolicySpec(), name="gmax")  # GMAX inside its overload control
    rs = live_requests(n)
    running = rs[:BATCH]
    for r in running:
        r.phase = Phase.RUNNING
        r.generated = r.bound // 2
        r.prefilled = r.prefill_target
    for r in rs[BATCH:]:
        policy.enqueue(r, 10.0)
    view = EngineView(10.0, BATCH, running, 0.04, 1e-4)
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        plan = policy.frame(view)
        samples.append(time.perf_counter() - started)
        for retirement in plan.retire:
            policy.enqueue(retirement.request, 10.0)
    return float(np.median(samples) * 1e3)


def main() -> None:
    for n in (2000, 10000):
        print(f"GMAX decision over {n:>6} live requests: {time_frame(n):7.2f} ms (median of 20)")
