"""Engine capacity for a workload: the denominator of ``--load``.

Capacity is measured, not assumed: the workload's first ``items`` work items all arrive
at t=0 on an idle engine running Sarathi-Serve (chunked prefill, FCFS: the throughput
baseline), and capacity is the rate at which work items complete while the engine is
saturated (between the 10th and 90th percentile of completion times, to leave out the
ramp-up and the drain). Load 1.0 means work items arrive at exactly that rate.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jitserve.bench.variants import make_setup
from jitserve.policy import SLOPolicySpec
from jitserve.requests import Program, Request, Workitem
from jitserve.sim.engine import Engine
from jitserve.sim.latency import Profile
from jitserve.sim.workload import WorkloadSpec, generate

_CACHE: dict[tuple[str, str, int], float] = {}


def measure_capacity(profile: Profile, spec: WorkloadSpec, items: int = 1500) -> float:
    """Work items per second the engine sustains on this workload (cached per process)."""
    key = (
        profile.model_dump_json(),
        repr(dataclasses.replace(spec, duration_s=1.0, rate_per_s=None)),
        items,
    )
    if key not in _CACHE:
        _CACHE[key] = _measure(profile, spec, items)
    return _CACHE[key]


def _measure(profile: Profile, spec: WorkloadSpec, items: int) -> float:
    source = generate(
        dataclasses.replace(
            spec,
            duration_s=1e9,
            rate_per_s=None,
            arrival="poisson" if spec.trace == "synthetic" else spec.arrival,
        )
    )
    batch: list[Workitem] = []
    for item in source:
        if isinstance(item, Program | Request):
            item = dataclasses.replace(item, arrival_s=0.0)
        batch.append(item)
        if len(batch) >= items:
            break
    setup = make_setup("sarathi", SLOPolicySpec())
    engine = Engine(profile, setup.policy, setup.estimator, setup.stage_share)
    for item in batch:
        engine.submit(item)
    times: list[float] = []
    while engine.advance():
        done = engine.ledger.overall.requests
        times.extend([engine.now] * (done - len(times)))
    lo, hi = np.quantile(np.array(times), [0.1, 0.9])
    lo, hi = np.quantile(times, [0.1, 0.9])
    completed = sum(1 for t in times if lo <= t <= hi)
    return float(completed / max(hi - lo, 1e-9))
