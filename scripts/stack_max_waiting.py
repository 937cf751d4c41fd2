"""Policies on the sim-vs-live workload, in the simulator's model of the sidecar stack
(engine queue 8, the stack's path, the door), at several ``admission.maxWaitingSeconds``
and ``admission.maxWaitingRetires`` (docs/benchmarks.md, "On this workload raw fcfs ..."
and "Rerun with ``admission.maxWaitingRetires: late``").

    .venv/bin/python scripts/stack_max_waiting.py --loads 1.5,2.0 --seeds 1,2
    .venv/bin/python scripts/stack_max_waiting.py --loads 1.5,2.0,3.0 --max-waiting 5 \
        --retires all,late --policies gmax,edf-ac,lsf-ac,fcfs
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools

from jitserve.bench.capacity import measure_capacity
from jitserve.bench.live import live_spec
from jitserve.bench.runner import Cell, run_one
from jitserve.policy import SLOPolicySpec
from jitserve.sim.latency import load_profile

STACK = (("engine_queue", 8), ("request_path_s", 0.006), ("door", True))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--profile", default="cpu-tiny-llama")
    p.add_argument("--loads", default="1.5,2.0", help="x the simulator's capacity")
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--max-waiting", default="5,10,30", help="seconds")
    p.add_argument("--retires", default="all", help="admission.maxWaitingRetires values")
    p.add_argument("--policies", default="gmax,fcfs")
    p.add_argument("--duration", type=float, default=40.0, help="seconds of arrivals")
    args = p.parse_args()
    capacity = measure_capacity(load_profile(args.profile),
                                live_spec(args.duration, 1.0, 1, "1:1:1", "azure-conv"))
    print("| load | seed | maxWaitingSeconds | maxWaitingRetires | policy | tok/s | req/s "
          "| retired |")
    print("|---|---|---|---|---|---|---|---|")
    for load in (float(x) for x in args.loads.split(",")):
        for seed in (int(x) for x in args.seeds.split(",")):
            workload = live_spec(args.duration, load * capacity, seed, "1:1:1", "azure-conv")
            for wait, retires in itertools.product(
                    (float(x) for x in args.max_waiting.split(",")), args.retires.split(",")):
                spec = SLOPolicySpec.model_validate(
                    {"admission": {"maxWaitingSeconds": wait, "maxWaitingRetires": retires}})
                for policy in args.policies.split(","):
                    cell = Cell(policy, load, seed, workload, capacity, args.profile, spec)
                    row = run_one(dataclasses.replace(cell, profile_overrides=STACK))
                    print(f"| {load:g} | {seed} | {wait:g} | {retires} | {policy} | "
                          f"{row['token_goodput']:.0f} | {row['request_goodput']:.2f} | "
                          f"{row['retired']} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
