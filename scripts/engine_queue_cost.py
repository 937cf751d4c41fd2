"""What the sidecar stack's engine queue costs, in the simulator (issue 25's finding).

Each policy on the A100 profile with the engine alone (engine queue 0: the policy picks
at the step a slot frees, as every matrix table) and with the sidecar's queue inside
vLLM at several depths (the sidecar's rule: up to B + Q dispatched), and with the rule
it does not have yet (``--unstarted-queues``: at most Q dispatched without a token), on
the same arrivals (the rate is load x the capacity measured with queue 0). Prints a
markdown table: tokens / requests per second at queue 0, then each variant's ratio to
it, seeds averaged.

  .venv/bin/python scripts/engine_queue_cost.py --seeds 1,2 --policies gmax,edf-ac
"""

from __future__ import annotations

import argparse

from jitserve.bench.capacity import measure_capacity
from jitserve.bench.runner import Cell, run_one
from jitserve.policy import SLOPolicySpec
from jitserve.sim.latency import load_profile
from jitserve.sim.workload import WorkloadSpec, parse_mix

SCENARIOS = (("azure-conv", "1:1:1"), ("azure-conv", "1:0:0"), ("azure-code", "1:1:1"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--policies", default="gmax,edf-ac")
    p.add_argument("--queues", default="8,32,128", help="engine queue depths against 0")
    p.add_argument("--unstarted-queues", default="4,8",
                   help="depths of the rule that bounds the dispatched without a token")
    p.add_argument("--loads", default="1.0,1.5,2.0")
    p.add_argument("--duration", type=float, default=120.0)
    p.add_argument("--profile", default="a100-llama3-8b")
    args = p.parse_args()
    seeds = [int(x) for x in args.seeds.split(",")]
    variants = [(0, False), *((int(x), False) for x in args.queues.split(",") if x),
                *((int(x), True) for x in args.unstarted_queues.split(",") if x)]
    profile = load_profile(args.profile)
    print("| scenario | load | policy | queue 0: tok/s / req/s | "
          + " | ".join(f"unstarted {q}" if u else f"queue {q}" for q, u in variants[1:]) + " |")
    print("|---|---|---|---|" + "---|" * (len(variants) - 1))
    for trace, mix in SCENARIOS:
        base = WorkloadSpec(trace=trace, mix=parse_mix(mix), duration_s=args.duration)
        capacity = measure_capacity(profile, base)
        for load in (float(x) for x in args.loads.split(",")):
            for policy in args.policies.split(","):
                means = []
                for q, unstarted in variants:
                    overrides = (("engine_queue", q), ("engine_queue_unstarted", unstarted))
                    rows = [run_one(Cell(policy, load, seed, base, capacity, args.profile,
                                         SLOPolicySpec(), profile_overrides=overrides))
                            for seed in seeds]
                    means.append((sum(r["token_goodput"] for r in rows) / len(rows),
                                  sum(r["request_goodput"] for r in rows) / len(rows)))
                (tok0, req0), rest = means[0], means[1:]
                ratios = " | ".join(f"{t / tok0:.3f} / {r / req0:.3f}" for t, r in rest)
                print(f"| {trace} {mix} | {load:.1f} | {policy} | {tok0:.0f} / {req0:.2f} | "
                      f"{ratios} |", flush=True)


if __name__ == "__main__":
    main()
