"""The simulator against the live engine on one workload (issue 25: does the simulator
order the policies as the engine does?).

    # vLLM pinned to a core of its own, the control plane and this script on the other:
    taskset -c 1 <vllm> --max-num-seqs 16 --max-model-len 2048 ... --port 8011 &
    taskset -c 0 jitserve up --backend http://127.0.0.1:8011 --max-num-seqs 16 \
        --config policy.yaml --port 8090 &
    taskset -c 0 python scripts/sim_vs_live.py --url http://127.0.0.1:8090 \
        --policy-file policy.yaml --profile cpu-tiny-llama --out sim-vs-live

One workload (``jitserve.bench.live.live_spec``: Poisson arrivals, lengths capped for a
CPU model) at each load, in units of the simulator's capacity for the profile; the same
items are replayed live through the sidecar (policies switched through its hot-reloaded
policy file, their order rotated each round, each round's prompts new so no run reads
another's prefix cache) and simulated on the measured profile. Prints and writes a table:
live mean and spread over the rounds, the simulator's figure and its ratio to live, and
whether every pair of policies whose live gap exceeds twice the live noise is ordered
the same by the simulator.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import time
from pathlib import Path
from typing import Any

from jitserve.bench import live as live_bench
from jitserve.bench.capacity import measure_capacity
from jitserve.bench.live import live_row, live_spec, run_live, scheduler_state, switch_policy
from jitserve.bench.runner import Cell, run_one
from jitserve.policy import SLOPolicySpec
from jitserve.sim.latency import load_profile
from jitserve.sim.workload import generate

METRICS = ("token_goodput", "request_goodput", "ttft_p50", "ttft_p99")


def flat(row: dict[str, Any]) -> dict[str, float]:
    return {"token_goodput": row["token_goodput"], "request_goodput": row["request_goodput"],
            "ttft_p50": row["ttft_s"]["p50"], "ttft_p99": row["ttft_s"]["p99"]}


async def live_rounds(args: argparse.Namespace, load: float, spec: Any,
                      policies: list[str]) -> dict[str, list[dict[str, float]]]:
    import aiohttp

    items = list(generate(spec))
    out: dict[str, list[dict[str, float]]] = {p: [] for p in policies}
    for round_ in range(args.rounds):
        order = policies[round_ % len(policies):] + policies[:round_ % len(policies)]
        for policy in order:
            await switch_policy(args.url, args.policy_file, policy, timeout_s=120)
            live_bench.RUN_ID = f"{time.time_ns():x}"  # programs of one run are its own
            ledger, stats, wall = await run_live(args.url, items, seed=args.seed,
                                                 prompt_seed=time.time_ns())
            async with aiohttp.ClientSession() as session:
                state = await scheduler_state(session, args.url)
            row = live_row(policy, ledger, stats, spec.duration_s, wall, load=load,
                           seed=args.seed, scheduler=state)
            out[policy].append(flat(row))
            print(f"live load {load} round {round_ + 1} {policy}: tokens/s "
                  f"{row['token_goodput']:.0f}, requests/s {row['request_goodput']:.2f}, "
                  f"errors {row['errors']}", flush=True)
    return out


def pairs_ordered(live: dict[str, list[dict[str, float]]], sim: dict[str, dict[str, float]],
                  metric: str) -> list[dict[str, Any]]:
    """Each pair whose live gap exceeds twice the live noise (the larger of the two
    policies' standard deviations over rounds), and whether the simulator orders it so."""
    out = []
    for a, b in itertools.combinations(sorted(live), 2):
        la = [r[metric] for r in live[a]]
        lb = [r[metric] for r in live[b]]
        noise = max(statistics.stdev(la) if len(la) > 1 else 0.0,
                    statistics.stdev(lb) if len(lb) > 1 else 0.0)
        gap = statistics.mean(la) - statistics.mean(lb)
        if abs(gap) > 2 * noise:
            same = (sim[a][metric] - sim[b][metric]) * gap > 0
            out.append({"pair": f"{a} vs {b}", "live_gap": gap, "noise": noise,
                        "sim_gap": sim[a][metric] - sim[b][metric], "same_order": same})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    live_bench.add_sidecar_twin_arguments(p)
    p.add_argument("--loads", default="0.7,1.5", help="x the simulator's capacity")
    p.add_argument("--policies", default="gmax,edf-ac,sarathi-ac,lsf-ac,fcfs")
    p.add_argument("--rounds", type=int, default=3, help="live runs of each policy")
    p.add_argument("--duration", type=float, default=40.0, help="seconds of arrivals")
    p.add_argument("--seed", type=int, default=1, help="of the workload")
    p.add_argument("--mix", default="1:1:1")
    p.add_argument("--trace", default="azure-conv")
    p.add_argument("--out", type=Path, default=Path("sim-vs-live"))
    args = p.parse_args()
    policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    profile = load_profile(args.profile)
    args.out.mkdir(parents=True, exist_ok=True)
    base = live_spec(args.duration, 1.0, args.seed, args.mix, args.trace)
    capacity = measure_capacity(profile, base)
    print(f"simulator capacity of {profile.name}: {capacity:.2f} work items/s", flush=True)
    results: list[dict[str, Any]] = []
    for load in (float(x) for x in args.loads.split(",")):
        spec = live_spec(args.duration, load * capacity, args.seed, args.mix, args.trace)
        sim = {policy: flat(run_one(Cell(policy, load, args.seed, spec, capacity, args.profile,
                                         SLOPolicySpec())))
               for policy in policies}
        live = asyncio.run(live_rounds(args, load, spec, policies))
        results.append({"load": load, "rate": load * capacity, "sim": sim, "live": live,
                        "pairs": {m: pairs_ordered(live, sim, m) for m in METRICS[:2]}})
        (args.out / "sim_vs_live.json").write_text(json.dumps(results, indent=2))
    print(markdown(results))
    (args.out / "sim_vs_live.md").write_text(markdown(results) + "\n")
    return 0


def markdown(results: list[dict[str, Any]]) -> str:
    lines = ["| load | policy | tokens/s live (sd) | sim / live | requests/s live (sd) | "
             "sim / live | TTFT p50 s live | sim / live | TTFT p99 s live | sim / live |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for policy, rows in r["live"].items():
            cells = [f"{r['load']:.1f}", policy]
            for metric in METRICS:
                values = [row[metric] for row in rows]
                mean = statistics.mean(values)
                sd = statistics.stdev(values) if len(values) > 1 else 0.0
                ratio = r["sim"][policy][metric] / mean if mean else float("nan")
                shown = f"{mean:.3g} ({sd:.2g})" if metric in METRICS[:2] else f"{mean:.3g}"
                cells += [shown, f"{ratio:.2f}"]
            lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for r in results:
        for metric, pairs in r["pairs"].items():
            same = sum(1 for x in pairs if x["same_order"])
            wrong = [x["pair"] for x in pairs if not x["same_order"]]
            lines.append(f"load {r['load']:.1f}, {metric}: {len(pairs)} pairs apart by more "
                         f"than twice the live noise, {same} ordered the same by the simulator"
                         + (f"; not: {', '.join(wrong)}" if wrong else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
