"""scheduler.policy auto against fixed schedulers, live (issue 31).

    # vLLM pinned to a core of its own, the control plane and this script on the other:
    taskset -c 1 <vllm> --max-num-seqs 16 --max-model-len 2048 ... --port 8011 &
    taskset -c 0 jitserve up --backend http://127.0.0.1:8011 --max-num-seqs 16 \\
        --no-analyzer --config policy.yaml --port 8090 &
    taskset -c 0 python scripts/auto_live.py --url http://127.0.0.1:8090 \\
        --policy-file policy.yaml --objective requests --out auto-live

One workload (``jitserve.bench.live.live_spec``, as scripts/sim_vs_live.py) replayed
through the sidecar once per policy per round, the policies' order rotated each round,
each run's prompts new. ``auto`` starts each run on its first candidate (gmax) with an
empty history, its tuner replaying on ``--profile``; the sidecar's own metrics say how
often it switched and to what. Prints and writes a table: goodput (tokens and requests)
per policy, mean and spread over the rounds, auto over the better fixed one, and what
auto ran.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp

from jitserve.bench import live as live_bench
from jitserve.bench.capacity import measure_capacity
from jitserve.bench.live import (
    live_row,
    live_spec,
    metric_total,
    run_live,
    scheduler_state,
    switch_policy,
)
from jitserve.policy import AUTO
from jitserve.sim.latency import load_profile

COUNTERS = {"switches": "jitserve_policy_switches_total",
            "comparisons": "jitserve_tuner_comparisons_total",
            "tuner_cpu_s": "jitserve_tuner_cpu_seconds_total"}


async def counters(url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as session:
        return {k: await metric_total(session, url, name) for k, name in COUNTERS.items()}


def auto_settings(args: argparse.Namespace, policy: str) -> dict[str, Any]:
    """``auto`` (the flags' settings) or ``auto:PERIOD/WINDOW/WARMUP`` (seconds)."""
    period, window, warmup = args.period, args.window, args.warmup
    if ":" in policy:
        period, window, warmup = (float(x) for x in policy.split(":")[1].split("/"))
    return {"candidates": args.candidates.split(","), "periodSeconds": period,
            "windowSeconds": window, "warmupSeconds": warmup, "profile": args.profile}


async def one_run(args: argparse.Namespace, policy: str, items: list[Any],
                  duration_s: float) -> dict[str, Any]:
    auto = auto_settings(args, policy)
    if policy.startswith(AUTO):  # from its first candidate, with an empty history
        await switch_policy(args.url, args.policy_file, auto["candidates"][0], 120)
    await switch_policy(args.url, args.policy_file, policy.split(":")[0], 120, auto=auto)
    before = await counters(args.url)
    live_bench.RUN_ID = f"{time.time_ns():x}"
    ledger, stats, wall = await run_live(args.url, items, seed=args.seed,
                                         prompt_seed=time.time_ns())
    async with aiohttp.ClientSession() as session:
        state = await scheduler_state(session, args.url)
    row = live_row(policy, ledger, stats, duration_s, wall, load=args.load, seed=args.seed,
                   scheduler=state)
    after = await counters(args.url)
    row.update({k: after[k] - before[k] for k in COUNTERS})
    row["auto"] = (state or {}).get("auto")
    row["in_effect"] = (state or {}).get("in_effect")
    return row


async def rounds(args: argparse.Namespace, items: list[Any], duration_s: float,
                 policies: list[str]) -> list[dict[str, Any]]:
    rows = []
    for round_ in range(args.rounds):
        order = policies[round_ % len(policies):] + policies[:round_ % len(policies)]
        for policy in order:
            row = await one_run(args, policy, items, duration_s)
            row["round"] = round_ + 1
            rows.append(row)
            ran = row["auto"]["in_effect"] if row["auto"] else ""
            print(f"round {round_ + 1} {policy}: tokens/s {row['token_goodput']:.0f}, "
                  f"requests/s {row['request_goodput']:.2f}, errors {row['errors']}, "
                  f"switches {row['switches']:.0f}, comparisons {row['comparisons']:.0f} "
                  f"({row['tuner_cpu_s']:.1f} s CPU), at the end {ran or policy}", flush=True)
            Path(args.out, "rows.json").write_text(json.dumps(rows, indent=1, default=str))
    return rows


def sd(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def markdown(rows: list[dict[str, Any]], policies: list[str]) -> str:
    lines = ["| policy | tokens/s (sd) | requests/s (sd) | TBT p99 s | switches per run | "
             "tuner CPU s per comparison | in effect at the end |",
             "|---|---|---|---|---|---|---|"]
    means: dict[str, dict[str, float]] = {}
    for policy in policies:
        mine = [r for r in rows if r["policy"] == policy]
        tokens = [r["token_goodput"] for r in mine]
        requests = [r["request_goodput"] for r in mine]
        means[policy] = {"tokens": statistics.fmean(tokens),
                         "requests": statistics.fmean(requests)}
        ends = ", ".join(r["auto"]["in_effect"] for r in mine if r["auto"]) or "-"
        comparisons = sum(r["comparisons"] for r in mine)
        cpu = (f"{sum(r['tuner_cpu_s'] for r in mine) / comparisons:.2f}" if comparisons
               else "-")
        tbt = statistics.fmean(r["tbt_s"]["p99"] for r in mine)
        lines.append(f"| {policy} | {means[policy]['tokens']:.0f} ({sd(tokens):.0f}) | "
                     f"{means[policy]['requests']:.2f} ({sd(requests):.2f}) | {tbt:.3f} | "
                     f"{statistics.fmean(r['switches'] for r in mine):.1f} | {cpu} | "
                     f"{ends} |")
    fixed = [p for p in policies if not p.startswith(AUTO)]
    for auto in (p for p in policies if p.startswith(AUTO) and fixed):
        lines.append("")
        for metric in ("tokens", "requests"):
            best = max(fixed, key=lambda p: means[p][metric])
            lines.append(f"{auto} / the better fixed ({best}) on {metric}: "
                         f"{means[auto][metric] / max(means[best][metric], 1e-12):.3f}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    live_bench.add_sidecar_twin_arguments(p)
    p.add_argument("--load", type=float, default=1.5, help="x the simulator's capacity")
    p.add_argument("--policies", default="gmax,edf-ac,auto",
                   help="fixed names, auto (the flags' settings) or auto:PERIOD/WINDOW/WARMUP")
    p.add_argument("--candidates", default="gmax,fcfs-ac,sarathi-ac,edf-ac,lsf-ac,sjf-ac,"
                   "plas-ac,slidingserve-ac", help="auto's, the first where each run starts")
    p.add_argument("--period", type=float, default=30.0)
    p.add_argument("--window", type=float, default=60.0)
    p.add_argument("--warmup", type=float, default=30.0)
    p.add_argument("--rounds", type=int, default=2, help="live runs of each policy")
    p.add_argument("--duration", type=float, default=300.0, help="seconds of arrivals")
    p.add_argument("--seed", type=int, default=1, help="of the workload")
    p.add_argument("--mix", default="1:1:1")
    p.add_argument("--trace", default="azure-conv")
    p.add_argument("--out", type=Path, default=Path("auto-live"))
    args = p.parse_args()
    policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    args.out.mkdir(parents=True, exist_ok=True)
    base = live_spec(args.duration, 1.0, args.seed, args.mix, args.trace)
    capacity = measure_capacity(load_profile(args.profile), base)
    spec = live_spec(args.duration, args.load * capacity, args.seed, args.mix, args.trace)
    from jitserve.sim.workload import generate

    items = list(generate(spec))
    print(f"{len(items)} work items over {args.duration:.0f} s at {args.load}x the simulator's "
          f"capacity of {args.profile} ({capacity:.2f}/s)", flush=True)
    rows = asyncio.run(rounds(args, items, spec.duration_s, policies))
    table = markdown(rows, policies)
    print(table)
    (args.out / "auto_live.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
