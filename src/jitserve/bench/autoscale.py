"""``jitserve bench --autoscale``: pools sized by jitserve's planner, by llm-d's SLO-aware
KEDA rule and statically, on traffic whose rate moves (:mod:`jitserve.sim.traffic`); and,
as a ceiling, by the planner told the traffic's shape ahead (:class:`ForesightPlanner`).

Who owns what: :func:`add_autoscale_flags` / :func:`main` parse and run; :func:`size_static`
finds a static deployment's size (the fewest replicas that hold the attainment target at
a constant rate, on the validation windows, as an SRE sizes from past traffic);
:func:`run_autoscale_cell` runs one (strategy, shape, seed) on
:func:`jitserve.sim.autoscale.run_pool`; :mod:`jitserve.bench.autoscale_report` writes the
table, the JSON and the plot. Every strategy runs the same engines (the policy's
scheduler), the same placer (power-of-k) and drains the replicas it removes.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from jitserve.bench.capacity import measure_capacity
from jitserve.bench.matrix import VALIDATION_SEEDS
from jitserve.bench.runner import cell_profile, run_cells_with
from jitserve.bench.variants import make_engine, make_setup
from jitserve.errors import CLIError
from jitserve.goodput import GoodputLedger
from jitserve.placement.power_of_k import PowerOfK
from jitserve.policy import SLOPolicySpec
from jitserve.policy.autoscaling import AutoscalingSettings
from jitserve.scaling.keda import KedaSLORule, KedaSLOSettings
from jitserve.scaling.planner import SLOPlanner
from jitserve.scaling.signals import Scaler, Static
from jitserve.sim.autoscale import PoolRun, run_pool
from jitserve.sim.engine import Engine
from jitserve.sim.traffic import SHAPES, RateShape
from jitserve.sim.workload import WorkloadSpec, generate
from jitserve.slo import SLOKind

STATIC_PEAK = "static-peak"
STATIC_MEAN = "static-mean"
KEDA = "keda-slo"
PLANNER = "jitserve"
FORESIGHT = "foresight"
STRATEGIES = (STATIC_PEAK, STATIC_MEAN, KEDA, PLANNER, FORESIGHT)
SIZING_S = 600.0
"""Seconds of constant-rate traffic a static size is checked on."""
PEAK_REPLICAS = 6.0
WARMUP_S = 60.0
TARGET_ATTAINMENT = 0.95


def add_autoscale_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--autoscale",
        metavar="SHAPES",
        help=f"compare pool sizing ({', '.join(STRATEGIES)}) on traffic of these shapes "
        f"(comma-separated: {', '.join(SHAPES)}) over --duration seconds; docs/autoscaling.md",
    )
    parser.add_argument(
        "--peak-replicas", type=float, default=PEAK_REPLICAS,
        help="with --autoscale: the peak arrival rate, in replicas' capacity",
    )
    parser.add_argument(
        "--warmup", type=float, default=WARMUP_S,
        help="with --autoscale: seconds from a replica's creation to its first request",
    )
    parser.add_argument(
        "--target-attainment", type=float, default=TARGET_ATTAINMENT,
        help="with --autoscale: the attainment every kind must hold (the planner's target "
        "and the static sizes' test)",
    )


@dataclass(frozen=True)
class AutoscaleCell:
    strategy: str
    shape: str
    """A :data:`~jitserve.sim.traffic.SHAPES` name; "" for a constant rate (sizing)."""
    seed: int
    workload: WorkloadSpec
    rate_per_s: float
    """The peak rate (shaped traffic) or the constant rate."""
    profile: str
    """The engine profile's name; with ``profile_overrides``, what every replica runs."""
    spec: SLOPolicySpec
    settings: AutoscalingSettings
    warmup_s: float
    replicas: int = 1
    """Static strategies' size, and every pool's starting size."""
    notice_s: float | None = None
    """Foresight only: told of a rise this long after it begins (None: a warm-up ahead)."""
    profile_overrides: tuple[tuple[str, float], ...] = ()
    """The command line's changes to the profile (``--budget``, ``--max-num-seqs``): the
    pools run the engine one replica's capacity was measured on."""

    @property
    def capacity_per_s(self) -> float:
        """One replica's measured capacity (work items/s), which the bench's settings carry."""
        capacity = self.settings.replica_capacity
        assert capacity is not None, "the bench's settings carry the measured capacity"
        return capacity


class ForesightPlanner(SLOPlanner):
    """A ceiling, not a strategy one could deploy: jitserve's planner told how far the
    traffic's shape will rise within one warm-up and period — what knowing each burst
    before it begins is worth. With ``notice_s`` it is told only once the shape has been
    rising for that long (checked a period back): the ceiling of reacting, by a detector
    that knows a burst's whole size the moment it sees it."""

    name = FORESIGHT

    def __init__(
        self, settings: AutoscalingSettings, shape: RateShape, notice_s: float | None = None
    ) -> None:
        super().__init__(settings)
        self.shape = shape
        self.notice_s = notice_s

    def forecast(self, now: float) -> tuple[float, float]:
        level, forecast = super().forecast(now)
        if self.notice_s is not None:
            seen = now - self.notice_s
            if self.shape.relative_at(seen) <= self.shape.relative_at(seen - self.period_s):
                return level, forecast
        ahead = np.linspace(now, now + self.settings.warmup_seconds + self.period_s, 16)
        rise = float(self.shape.relative(ahead).max()) / self.shape.relative_at(now)
        return level, max(forecast, level * rise)


def _scaler(cell: AutoscaleCell, shape: RateShape | None) -> Scaler:
    k = cell.settings
    if cell.strategy == PLANNER:
        return SLOPlanner(k)
    if cell.strategy == FORESIGHT:
        assert shape is not None, "foresight runs on shaped traffic"
        return ForesightPlanner(k, shape, cell.notice_s)
    if cell.strategy == KEDA:
        latency = cell.spec.slo_defaults.latency
        return KedaSLORule(KedaSLOSettings(
            latency.ttft_seconds, latency.tbt_seconds, k.min_replicas, k.max_replicas,
        ))  # fmt: skip
    return Static(cell.replicas, cell.strategy)


def run_autoscale_cell(cell: AutoscaleCell) -> dict[str, Any]:
    profile = cell_profile(cell.profile, cell.profile_overrides)
    duration = cell.workload.duration_s
    shape = RateShape(cell.shape, duration) if cell.shape else None
    mean_rate = cell.rate_per_s * (shape.mean if shape else 1.0)
    workload = replace(cell.workload, rate_per_s=mean_rate, seed=cell.seed)
    items = generate(workload)
    if shape is not None:
        items = shape.warp(items)

    def new_engine(index: int, ledger: GoodputLedger) -> Engine:
        return make_engine(cell.spec.scheduler.policy, cell.spec, profile,
                           cell.seed * 1000 + index, ledger)

    gateway = make_setup(cell.spec.scheduler.policy, cell.spec, seed=cell.seed * 1000 - 1)
    started = time.perf_counter()
    run = run_pool(
        items, new_engine, PowerOfK(cell.seed, None, cell.spec), gateway.estimator,
        _scaler(cell, shape), initial=cell.replicas, warmup_s=cell.warmup_s, end_s=duration,
    )  # fmt: skip
    return row_of(cell, run, time.perf_counter() - started)


def row_of(cell: AutoscaleCell, run: PoolRun, wall_s: float) -> dict[str, Any]:
    ledger = run.ledger
    duration = run.end_s
    by_kind = {k.value: t.attainment for k, t in ledger.by_kind.items()}
    held = all(
        ledger.by_kind[kind].attainment >= cell.settings.target(kind)
        for kind in SLOKind if kind in ledger.by_kind and ledger.by_kind[kind].requests
    )  # fmt: skip
    return {
        "strategy": cell.strategy, "shape": cell.shape, "seed": cell.seed,
        "rate_per_s": cell.rate_per_s, "start_replicas": cell.replicas,
        "replica_seconds": run.replica_seconds(),
        "mean_replicas": run.replica_seconds() / duration,
        "max_replicas": max((s.ready + s.warming for s in run.samples), default=cell.replicas),
        "changes": run.changes, "requests": ledger.overall.requests,
        "met": ledger.overall.met, "token_goodput": ledger.overall.goodput_tokens / duration,
        "request_goodput": ledger.overall.met / duration,
        "attainment": ledger.overall.attainment, "attainment_by_kind": by_kind,
        "held_target": held, "refused": run.refused, "wall_s": wall_s,
        "timeline": [[s.at_s, s.ready, s.warming, s.draining, round(s.arrivals_per_s, 3)]
                     for s in run.samples],
        "last_reason": run.samples[-1].reason if run.samples else "",
    }  # fmt: skip


def size_static(
    base: AutoscaleCell, rate_per_s: float, jobs: int, max_replicas: int
) -> tuple[int, list[dict[str, Any]]]:
    """The fewest replicas that hold every kind's target at ``rate_per_s`` on every
    validation window (constant rate, :data:`SIZING_S` seconds); the rows it ran."""
    workload = replace(base.workload, duration_s=SIZING_S)
    n = max(1, math.ceil(rate_per_s / base.capacity_per_s))
    tried: list[dict[str, Any]] = []
    while n < max_replicas:
        cells = [replace(base, strategy=f"static-{n}", shape="", seed=seed, workload=workload,
                         rate_per_s=rate_per_s, replicas=n)
                 for seed in VALIDATION_SEEDS]  # fmt: skip
        rows = run_cells_with(run_autoscale_cell, cells, jobs, desc=f"sizing {n} replicas")
        tried.extend(rows)
        if all(r["held_target"] for r in rows):
            break
        n += 1
    return n, tried


def pool_base(
    workload: WorkloadSpec, profile_ref: str, spec: SLOPolicySpec,
    overrides: tuple[tuple[str, float], ...] = (), *,
    peak_replicas: float = PEAK_REPLICAS, warmup_s: float = WARMUP_S,
    target_attainment: float = TARGET_ATTAINMENT,
) -> AutoscaleCell:
    """The cell every pool of a run copies: one replica's capacity measured on a validation
    window (on the profile with ``overrides``, which every pool then runs), the peak rate
    ``peak_replicas`` of it, the pool bounded at four times the peak's replicas and four
    more."""
    profile = cell_profile(profile_ref, overrides)
    capacity = measure_capacity(profile, replace(workload, seed=VALIDATION_SEEDS[0]))
    settings = AutoscalingSettings(
        enabled=True, max_replicas=4 * math.ceil(peak_replicas) + 4,
        target_attainment=target_attainment, warmup_seconds=warmup_s,
        replica_capacity=capacity,
    )  # fmt: skip
    return AutoscaleCell(PLANNER, "", VALIDATION_SEEDS[0], workload, peak_replicas * capacity,
                         profile_ref, spec, settings, warmup_s,
                         profile_overrides=overrides)  # fmt: skip


def start_replicas(base: AutoscaleCell, shape: RateShape) -> int:
    """The replicas a sized pool starts with: enough for the shape's rate at t=0."""
    return max(1, math.ceil(base.rate_per_s * shape.relative_at(0.0) / base.capacity_per_s))


def main(
    args: argparse.Namespace, spec: SLOPolicySpec, workload: WorkloadSpec,
    overrides: tuple[tuple[str, float], ...], seeds: list[int],
) -> int:
    from jitserve.bench import autoscale_report

    shapes = [s.strip() for s in args.autoscale.split(",") if s.strip()]
    for shape in shapes:
        if shape not in SHAPES:
            raise CLIError(f"--autoscale: unknown shape {shape!r}; choose from {', '.join(SHAPES)}")
    if not args.peak_replicas > 0:
        raise CLIError(f"--peak-replicas must be > 0, got {args.peak_replicas}")
    if not args.warmup >= 0:
        raise CLIError(f"--warmup must be >= 0, got {args.warmup}")
    if not 0 < args.target_attainment <= 1:
        raise CLIError(f"--target-attainment must be in (0, 1], got {args.target_attainment}")
    print(f"measuring replica capacity on {workload.trace} (validation window)...", flush=True)
    base = pool_base(workload, args.profile, spec, overrides, peak_replicas=args.peak_replicas,
                     warmup_s=args.warmup, target_attainment=args.target_attainment)
    settings, peak_rate = base.settings, base.rate_per_s
    capacity, max_replicas = base.capacity_per_s, settings.max_replicas
    print(f"capacity: {capacity:.3f} work items/s per replica; peak {peak_rate:.2f}/s", flush=True)
    peak_n, sizing = size_static(base, peak_rate, args.jobs, max_replicas)
    print(f"static-peak: {peak_n} replicas", flush=True)
    cells: list[AutoscaleCell] = []
    for shape_name in shapes:
        shape = RateShape(shape_name, workload.duration_s)
        mean_n, rows = size_static(base, peak_rate * shape.mean, args.jobs, max_replicas)
        sizing.extend(rows)
        start = start_replicas(base, shape)
        print(f"{shape_name}: static-mean {mean_n} replicas, pools start at {start}", flush=True)
        sizes = {STATIC_PEAK: peak_n, STATIC_MEAN: mean_n, KEDA: start, PLANNER: start,
                 FORESIGHT: start}
        cells += [replace(base, strategy=strategy, shape=shape_name, seed=seed,
                          replicas=sizes[strategy])
                  for strategy in STRATEGIES for seed in seeds]  # fmt: skip
    rows = run_cells_with(run_autoscale_cell, cells, args.jobs, desc="autoscaling")
    meta = {
        "trace": workload.trace, "mix": list(workload.mix), "duration_s": workload.duration_s,
        "profile": args.profile, "profile_overrides": dict(overrides),
        "capacity_items_per_s": capacity,
        "peak_replicas": args.peak_replicas, "peak_rate_per_s": peak_rate,
        "warmup_s": args.warmup, "target_attainment": args.target_attainment,
        "seeds": seeds, "shapes": shapes, "scheduler": spec.scheduler.policy,
        "settings": settings.model_dump(mode="json", by_alias=True),
    }  # fmt: skip
    autoscale_report.write(Path(args.out), meta, rows, sizing)
    return 0
