"""Simulated bench runs: one :class:`Cell` (policy x load x seed x scenario) -> one row.

Who owns what: :func:`run_one` replays a workload through one policy on the engine (or,
for ``upper-bound``, solves :mod:`jitserve.bench.upper_bound` over the same trace) and
returns a plain dict row; :func:`run_cells` runs many, in worker processes when asked,
with a progress bar. The command line (:mod:`jitserve.bench.cli`) and the scenario matrix
(:mod:`jitserve.bench.matrix`) build the cells; :mod:`jitserve.bench.report` reads rows.
"""

from __future__ import annotations

import math
import time
import tracemalloc
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from tqdm import tqdm

from jitserve.bench.fleet import make_placement, scaled_profile
from jitserve.bench.variants import make_engine, make_setup, policy_names
from jitserve.goodput import GoodputLedger
from jitserve.policy import SLOPolicySpec
from jitserve.requests import Request, Workitem
from jitserve.sim.cluster import run_placed
from jitserve.sim.engine_stats import EngineStats
from jitserve.sim.latency import Profile, load_profile
from jitserve.sim.workload import (
    WorkloadSpec,
    generate,
    held_to_contracts,
    offered_tokens_by_tenant,
)
from jitserve.tuning.tuner import AUTO, AutoScheduler, Tuner

C = TypeVar("C")
UPPER_BOUND = "upper-bound"
EXACT_NAMES = ("gmax-exact", "oracle")
"""GMAX with exact lengths: ``gmax-exact`` (``oracle`` before the rename)."""


def known_policies() -> list[str]:
    return [*policy_names(), AUTO, UPPER_BOUND]


def check_policy(name: str, spec: SLOPolicySpec) -> None:
    """Raise ValueError naming the known policies when ``name`` is not one."""
    if name in (UPPER_BOUND, AUTO):
        return
    try:
        make_setup(name, spec)
    except ValueError as err:
        raise ValueError(f"{err}; or {UPPER_BOUND}") from err


def admission_controlled() -> list[str]:
    """The baselines with overload control (``<baseline>-ac``), as the bench has them."""
    return [name for name in policy_names() if name.endswith("-ac")]


def default_policies() -> list[str]:
    """GMAX, every baseline with and without overload control, GMAX with exact lengths,
    and the upper bound: what the bench compares unless told otherwise."""
    names = policy_names()
    # raw and -ac baselines; not the estimator variants (-ac-qrf needs the analyzer extra)
    baselines = [
        n for n in names if not n.startswith("gmax") and ("-" not in n or n.endswith("-ac"))
    ]
    exact = [n for n in EXACT_NAMES if n in names][:1]
    return ["gmax", *baselines, *exact, UPPER_BOUND]


@dataclass(frozen=True)
class Cell:
    policy: str
    load: float
    seed: int
    workload: WorkloadSpec
    capacity_per_s: float
    profile: str
    spec: SLOPolicySpec
    track_memory: bool = False
    replicas: int = 1
    profile_overrides: tuple[tuple[str, float], ...] = ()
    """Engine limits changed from the profile's (``chunk_token_budget``, ``max_running``,
    ``engine_queue``)."""
    scenario: str = ""
    bound_slot_s: float = 2.0
    """Time slot of the ``upper-bound`` LP (longer: smaller LP, slightly looser bound)."""
    placement: str = ""
    """How work is placed across replicas (``--placement``; :mod:`jitserve.bench.fleet`);
    required with more than one replica. The row's ``policy`` is then the placement."""
    replica_speeds: tuple[float, ...] = ()
    """Each replica's speed (1: the profile's; 0.5: every step takes twice as long);
    empty: all 1. Load is relative to the fleet's summed speed."""
    report_period_s: float = 0.25
    placement_weights: tuple[tuple[str, float], ...] = ()
    """power-of-k's scorer weights changed from its defaults (the tuning sweep's knob)."""
    then: WorkloadSpec | None = None
    """A second phase of traffic (a regime change): its arrivals, at its own
    ``rate_per_s`` and seed, follow the first phase's end."""


def cell_profile(name: str, overrides: tuple[tuple[str, float], ...]) -> Profile:
    return load_profile(name).model_copy(update=dict(overrides))


def run_one(cell: Cell) -> dict[str, Any]:
    """Simulate one cell (or bound it) and return its row of results."""
    profile = cell_profile(cell.profile, cell.profile_overrides)
    speeds = cell.replica_speeds or (1.0,) * cell.replicas
    rate = cell.load * cell.capacity_per_s * sum(speeds)
    workload = replace(cell.workload, rate_per_s=rate, seed=cell.seed)
    if cell.policy == UPPER_BOUND:
        return _bound_row(cell, profile, workload)
    ledger = GoodputLedger()
    engines = []
    auto = cell.policy == AUTO
    if auto and cell.replicas != 1:
        raise ValueError(f"{AUTO} tunes one replica; run it with --replicas 1")
    for replica in range(cell.replicas):
        name = cell.spec.scheduler.auto.candidates[0] if auto else cell.policy
        engines.append(make_engine(name, cell.spec, scaled_profile(profile, speeds[replica]),
                                   cell.seed * 1000 + replica, ledger))
    if cell.track_memory:
        tracemalloc.start()
    started, cpu_started = time.perf_counter(), time.process_time()
    placement = (
        make_placement(cell.placement, cell.seed, cell.spec, engines, cell.report_period_s,
                       dict(cell.placement_weights))
        if cell.placement else None
    )
    beyond: dict[str, int] = {}
    items = held_to_contracts(_workitems(cell, workload), cell.spec.fairness, beyond)
    tuned = None
    if auto:
        tuner = Tuner(cell.spec, engines[0].profile, seed=cell.seed * 1000)
        tuned = AutoScheduler(engines[0], tuner)
        items = tuned.items(items)
    placed = run_placed(engines, items, placement)
    wall_s = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_started
    peak_bytes = tracemalloc.get_traced_memory()[1] if cell.track_memory else None
    if cell.track_memory:
        tracemalloc.stop()
    duration = workload.duration_s + (cell.then.duration_s if cell.then is not None else 0.0)
    stats = EngineStats()
    for engine in engines:
        stats.merge(engine.stats)
    return {
        "policy": cell.placement or cell.policy,
        "scheduler": cell.policy,
        "placement": cell.placement,
        "placed": placed.placed,
        "withdrawn": placed.withdrawn,
        "refused": placed.refused,
        "replica_speeds": list(speeds),
        "scenario": cell.scenario,
        "load": cell.load,
        "seed": cell.seed,
        "requests": ledger.overall.requests,
        "token_goodput": ledger.overall.goodput_tokens / duration,
        "request_goodput": ledger.overall.met / duration,
        "attainment": {k: v for k, v in ledger.attainment().items()},
        "goodput_tokens_by_kind": {k.value: t.goodput_tokens for k, t in ledger.by_kind.items()},
        "attainment_by_tenant": {k: t.attainment for k, t in sorted(ledger.by_tenant.items())},
        "goodput_tokens_by_tenant": {
            k: t.goodput_tokens for k, t in sorted(ledger.by_tenant.items())
        },
        "demand_tokens_by_tenant": offered_tokens_by_tenant(_workitems(cell, workload)),
        "claims_beyond_contract_by_tenant": dict(sorted(beyond.items())),
        "throughput_tokens_per_s": (stats.prefill_tokens + stats.output_tokens)
        / max(stats.busy_s, 1e-9),
        "output_tokens_per_s": stats.output_tokens / max(stats.busy_s, 1e-9),
        "ttft_s": {"p50": ledger.ttft.percentile(50), "p99": ledger.ttft.percentile(99)},
        "tbt_s": {"p50": ledger.tbt.percentile(50), "p99": ledger.tbt.percentile(99)},
        "e2el_s": {"p50": ledger.e2el.percentile(50), "p99": ledger.e2el.percentile(99)},
        "preemptions": stats.preemptions,
        "kv_preemptions": stats.kv_preemptions,
        "retired": stats.retired,
        "sched_ms_p50": stats.frame_seconds.percentile(50) * 1e3,
        "sched_ms_p99": stats.frame_seconds.percentile(99) * 1e3,
        "frames": stats.frames,
        "sim_end_s": max(e.now for e in engines),
        "replicas": cell.replicas,
        "wall_s": wall_s,
        "cpu_s": cpu_s,
        "peak_memory_bytes": peak_bytes,
        "effective": engines[0].policy.describe(),
        "auto": tuned.summary() if tuned is not None else None,
    }


def _workitems(cell: Cell, workload: WorkloadSpec) -> Iterator[Workitem]:
    """The cell's arrivals: ``workload``'s, then its second phase's, if any (ids
    prefixed so the two phases never share one)."""
    yield from generate(workload)
    if cell.then is None:
        return
    offset = workload.duration_s
    for item in generate(cell.then):
        if isinstance(item, Request):
            yield replace(item, request_id=f"then/{item.request_id}",
                          arrival_s=item.arrival_s + offset)
        else:
            yield replace(item, program_id=f"then/{item.program_id}",
                          arrival_s=item.arrival_s + offset)


def _bound_row(cell: Cell, profile: Profile, workload: WorkloadSpec) -> dict[str, Any]:
    """The LP bound in the row format; what a bound has no value for is NaN."""
    from jitserve.bench.upper_bound import upper_bound

    if cell.replicas != 1:
        raise ValueError(f"{UPPER_BOUND} models one engine; run it with --replicas 1")
    started, cpu_started = time.perf_counter(), time.process_time()
    bound = upper_bound(generate(workload), profile, cell.bound_slot_s)
    nan = math.nan
    quantiles = {"p50": nan, "p99": nan}
    return {
        "policy": UPPER_BOUND,
        "scenario": cell.scenario,
        "load": cell.load,
        "seed": cell.seed,
        "requests": bound.items,
        "token_goodput": bound.goodput_tokens / workload.duration_s,
        "request_goodput": bound.met_requests / workload.duration_s,
        "attainment": {"overall": bound.met_requests / max(bound.items, 1)},
        "goodput_tokens_by_kind": {},
        "attainment_by_tenant": {},
        "goodput_tokens_by_tenant": {},
        "throughput_tokens_per_s": nan,
        "output_tokens_per_s": nan,
        "ttft_s": quantiles,
        "tbt_s": quantiles,
        "e2el_s": quantiles,
        "preemptions": nan,
        "kv_preemptions": nan,
        "retired": nan,
        "sched_ms_p50": nan,
        "sched_ms_p99": nan,
        "frames": 0,
        "sim_end_s": nan,
        "replicas": 1,
        "wall_s": time.perf_counter() - started,
        "cpu_s": time.process_time() - cpu_started,
        "peak_memory_bytes": None,
        "effective": {},
    }


def run_cells(cells: list[Cell], jobs: int, desc: str = "simulating") -> list[dict[str, Any]]:
    """Rows in the order of ``cells``; ``jobs`` > 1 runs them in worker processes."""
    return run_cells_with(run_one, cells, jobs, desc)


def run_cells_with(
    run: Callable[[C], dict[str, Any]], cells: list[C], jobs: int, desc: str = "simulating"
) -> list[dict[str, Any]]:
    """``run`` over ``cells`` (picklable, ``run`` module-level) with a progress bar, rows
    in the order of ``cells``; ``jobs`` > 1 runs them in worker processes."""
    rows: list[dict[str, Any]] = []
    with tqdm(total=len(cells), desc=desc, unit="run") as bar:
        if jobs <= 1 or len(cells) == 1:
            for cell in cells:
                rows.append(run(cell))
                bar.update()
        else:
            with ProcessPoolExecutor(max_workers=jobs) as pool:
                for row in pool.map(run, cells):
                    rows.append(row)
                    bar.update()
    return rows
