"""How much of the gap to a static-peak pool is a planner's to close (issue 28).

On shaped traffic, jitserve's planner against the same planner told the shape's course
(:class:`~jitserve.bench.autoscale.ForesightPlanner`): a warm-up ahead (anticipation),
and only once the rise has begun (``--notice``: seconds after it begins, checked a period
back; -1 is told at a burst's first second, 0 at the first decision after the ramp began,
the earliest a 15 s planner can react). Tokens and requests against static-peak's, each
pool's replica-seconds against static-peak's::

  nice -n 5 .venv/bin/python scripts/autoscale_bounds.py --shape bursts --seeds 101,102,103
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from jitserve.bench.autoscale import (
    FORESIGHT,
    PLANNER,
    STATIC_PEAK,
    AutoscaleCell,
    pool_base,
    run_autoscale_cell,
    start_replicas,
)
from jitserve.bench.runner import run_cells_with
from jitserve.policy import SLOPolicySpec
from jitserve.sim.latency import DEFAULT_PROFILE
from jitserve.sim.traffic import SHAPES, RateShape
from jitserve.sim.workload import WorkloadSpec


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--shape", default="bursts", choices=SHAPES, help="traffic shape")
    parser.add_argument("--seeds", default="101,102,103", help="trace windows")
    parser.add_argument("--notice", default="-1,0", help="seconds, comma-separated")
    parser.add_argument("--static-peak", type=int, default=8,
                        help="static-peak's size (jitserve bench --autoscale prints it)")
    parser.add_argument("--duration", type=float, default=3600.0, help="seconds")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    workload = WorkloadSpec(trace="azure-conv", duration_s=args.duration)
    base = pool_base(workload, DEFAULT_PROFILE, SLOPolicySpec())
    base = replace(base, strategy=PLANNER, shape=args.shape,
                   replicas=start_replicas(base, RateShape(args.shape, args.duration)))
    variants: dict[str, AutoscaleCell] = {
        STATIC_PEAK: replace(base, strategy=STATIC_PEAK, replicas=args.static_peak),
        PLANNER: base,
        "foresight (a warm-up ahead)": replace(base, strategy=FORESIGHT),
    }
    for notice in (float(n) for n in args.notice.split(",") if n.strip()):
        variants[f"told {notice:g} s after a rise begins"] = replace(
            base, strategy=FORESIGHT, notice_s=notice)
    names = [name for name in variants for _ in seeds]
    cells = [replace(cell, seed=seed) for cell in variants.values() for seed in seeds]
    rows = run_cells_with(run_autoscale_cell, cells, args.jobs, desc="bounds")
    sums: dict[str, list[float]] = {}
    for name, row in zip(names, rows, strict=True):
        total = sums.setdefault(name, [0.0, 0.0, 0.0])
        total[0] += row["token_goodput"]
        total[1] += row["request_goodput"]
        total[2] += row["replica_seconds"]
    peak = sums[STATIC_PEAK]
    print(f"{args.shape}, seeds {args.seeds}; against static-peak ({args.static_peak} replicas)")
    print("\n| pool | tokens | requests | replica-s |\n|---|---|---|---|")
    for name, (tokens, requests, replica_s) in sums.items():
        print(f"| {name} | {tokens / peak[0]:.3f}x | {requests / peak[1]:.3f}x "
              f"| {replica_s / peak[2]:.3f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
