"""Power-of-K weight sweep (issue 18): power-of-k at each set of scorer weights against
round-robin, least-loaded and power-of-two, on the headline workload, with GMAX on every
replica; prints the ratio of power-of-k to the best baseline per (speeds, load), each
metric's best picked separately, as a markdown table. Tune on validation seeds only
(1-3); report with `jitserve bench --placement ...` on seeds you did not tune on.

  nice -n 5 .venv/bin/python scripts/placement_sweep.py --seeds 1,2,3 --duration 60 \
      --weights 'gmax-admit=1,least-time=1' --weights 'least-tokens=1,least-time=0'
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from typing import Any

from jitserve.bench.capacity import measure_capacity
from jitserve.bench.runner import Cell, cell_profile, run_cells
from jitserve.policy import SLOPolicySpec
from jitserve.sim.latency import DEFAULT_PROFILE
from jitserve.sim.workload import WorkloadSpec, parse_mix

BASELINES = ("round-robin", "least-loaded", "power-of-two")


def weights_of(text: str) -> tuple[tuple[str, float], ...]:
    pairs = (item.split("=") for item in text.split(",") if item)
    return tuple((name.strip(), float(value)) for name, value in pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", action="append", default=[],
                        help="power-of-k weights, e.g. gmax-admit=1,least-time=1 (repeatable)")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--speeds", action="append", default=[],
                        help="replica speeds (repeatable); default: equal, and one at 0.5")
    parser.add_argument("--loads", default="1.0,1.5")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    spec = SLOPolicySpec()
    workload = WorkloadSpec(trace="azure-conv", mix=parse_mix("1:1:1"),
                            duration_s=args.duration, slo=spec.slo_defaults)
    capacity = measure_capacity(cell_profile(DEFAULT_PROFILE, ()), workload)
    n = args.replicas
    speed_sets = [tuple(float(x) for x in s.split(",")) for s in args.speeds] or [
        (1.0,) * n, (1.0,) * (n - 1) + (0.5,)]
    configs: list[tuple[str, tuple[tuple[str, float], ...]]] = [(b, ()) for b in BASELINES]
    configs += [("power-of-k", weights_of(w)) for w in args.weights or [""]]
    cells = [
        Cell("gmax", load, seed, workload, capacity, DEFAULT_PROFILE, spec,
             replicas=len(speeds), placement=name, replica_speeds=speeds,
             placement_weights=weights)
        for speeds in speed_sets
        for load in (float(x) for x in args.loads.split(","))
        for seed in (int(x) for x in args.seeds.split(","))
        for name, weights in configs
    ]  # fmt: skip
    rows = run_cells(cells, args.jobs, desc="placements")
    means: dict[tuple[Any, ...], list[tuple[float, float]]] = defaultdict(list)
    for cell, row in zip(cells, rows, strict=True):
        key = (cell.replica_speeds, cell.load, cell.placement, cell.placement_weights)
        means[key].append((row["token_goodput"], row["request_goodput"]))
    print("| weights | speeds | load | tokens vs best baseline | requests |")
    print("|---|---|---|---|---|")
    for (speeds, load, name, weights), values in sorted(means.items()):
        if name != "power-of-k":
            continue
        base = [means[(speeds, load, b, ())] for b in BASELINES]
        best_t = max(statistics.mean(v[0] for v in b) for b in base)
        best_r = max(statistics.mean(v[1] for v in b) for b in base)
        label = ",".join(f"{k}={w:g}" for k, w in weights) or "defaults"
        print(f"| {label} | {','.join(f'{s:g}' for s in speeds)} | {load:.1f} | "
              f"{statistics.mean(v[0] for v in values) / best_t:.3f}x | "
              f"{statistics.mean(v[1] for v in values) / best_r:.3f}x |")


if __name__ == "__main__":
    main()
