"""Scheduler micro-benchmark: wall time of one steady-state GMAX decision (overload
control included) over N live requests.

Steady state: the queue is already in the policy (every request enqueued, earlier frames
planned), time moves on by a short frame between decisions, and the timed frame retires
almost nothing (the figure printed beside the time must stay under 5%): a frame that
retires half its queue times the retirements, not the decision."""

from __future__ import annotations

import time

import numpy as np

from jitserve.policy import SLOPolicySpec
from jitserve.requests import LiveRequest, Phase, Request
from jitserve.scheduling.base import EngineView
from jitserve.scheduling.registry import make_policy
from jitserve.scheduling.staged import StagedPolicy
from jitserve.slo import DeadlineSLO, LatencySLO

BATCH = 256
NOW_S = 100.0
FRAME_S = 0.02
"""Time between decisions: far under maxWaitingSeconds and the deadlines, so the timed
frames decide over the same queue rather than empty it."""
WARMUP_FRAMES = 3
SIZES = (2_000, 5_000, 10_000, 20_000)


def live_requests(n: int, seed: int = 0) -> list[LiveRequest]:
    """Half latency, half deadline requests over three tenants, arrived in the last 4 s
    (under the default 5 s waiting limit) with 20-120 s deadlines."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        slo = LatencySLO(2.0, 0.1) if i % 2 else DeadlineSLO(float(rng.uniform(20.0, 120.0)))
        arrival = NOW_S - float(rng.uniform(0.0, 4.0))
        req = Request(f"r{i}", f"t{i % 3}", slo, int(rng.integers(10, 4000)), arrival)
        r = LiveRequest(req)
        r.bound = int(rng.integers(50, 1500))
        r.expected = r.bound * 0.6
        out.append(r)
    return out


def time_frames(n: int, repeats: int = 5) -> tuple[float, float, float, dict[str, float]]:
    """(median wall ms of ``repeats`` steady-state frames with ``n`` live requests, 256
    of them running; median CPU ms of this process over them, which other jobs on a
    busy machine do not inflate; the largest share of the queue one timed frame
    retired; each stage's mean wall ms over the timed frames)."""
    policy = make_policy(SLOPolicySpec(), name="gmax")  # GMAX inside its overload control
    assert isinstance(policy, StagedPolicy)
    rs = live_requests(n)
    running = rs[:BATCH]
    for r in running:
        r.phase = Phase.RUNNING
        r.started_s = r.req.arrival_s
        r.generated = r.bound // 2
        r.prefilled = r.prefill_target
    for r in rs[BATCH:]:
        policy.enqueue(r, r.req.arrival_s)
    samples, cpu = [], []
    retired_share = 0.0
    warm: dict[str, float] = {}
    for i in range(WARMUP_FRAMES + repeats):
        if i == WARMUP_FRAMES:
            warm = dict(policy.pipeline.seconds)
        view = EngineView(NOW_S + i * FRAME_S, BATCH, running, 0.04, 1e-4, 1e-4)
        queued = policy.waiting()
        started, started_cpu = time.perf_counter(), time.process_time()
        plan = policy.frame(view)
        elapsed, elapsed_cpu = time.perf_counter() - started, time.process_time() - started_cpu
        if i >= WARMUP_FRAMES:
            samples.append(elapsed)
            cpu.append(elapsed_cpu)
            retired_share = max(retired_share, len(plan.retire) / max(queued, 1))
    stages = {name: (total - warm[name]) / repeats * 1e3
              for name, total in policy.pipeline.seconds.items()}
    return float(np.median(samples) * 1e3), float(np.median(cpu) * 1e3), retired_share, stages


def main() -> None:
    for n in SIZES:
        ms, cpu_ms, share, stages = time_frames(n)
        print(
            f"GMAX decision over {n:>6} live requests: {ms:7.2f} ms wall, {cpu_ms:7.2f} ms "
            f"CPU (median of 5 steady-state frames; retired {share:.1%} of the queue)"
        )
        print("    stages (mean ms): " + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()))
