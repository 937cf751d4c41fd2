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
the same by the simulator. TTFT's live figure is each percentile over every request of
the rounds pooled (the simulator's figure is over the same arrivals once), the rounds'
own percentiles beside it as the range.

The simulator runs twice: as the stack runs (``sim``) and as the engine alone with an
in-engine scheduler would (``in-engine``: the policy picks at the step a slot frees, no
time outside the engine: the simulator's defaults). As the stack runs means two things
measured on the stack, not fitted to the table: the sidecar's engine queue (read from its
``/debug/scheduler``: requests dispatched beyond the slots wait in vLLM in dispatch
order), the sidecar's door (a latency arrival forecast to start late is refused at once,
for every policy, raw ``fcfs`` included) and the stack's fixed path per call
(``--path-requests`` lone requests through the stack, before any round: their median
time to first token less the profile's step for their prompt), plus, with ``--engine-url``,
what vLLM's own front end adds under the load: vLLM's histograms (its time to first token
less its queue and prefill time, over the load's live runs) against the same for the lone
requests. On this 2-core VM vLLM's API server shares the engine's core, so a request
under load waits for its turn there; the lone requests do not show it. ``--live-from`` reuses
the live rounds of an earlier run's ``sim_vs_live.json``, with its engine queue and lone
requests: the simulator side alone, no stack needed (``--url`` unused). Both sides run
the settings of ``--policy-file`` (e.g. ``admission.maxWaitingRetires``), each policy by
its name; an absent file is the defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import statistics
import time
from pathlib import Path
from typing import Any

from jitserve.bench import live as live_bench
from jitserve.bench.calibrate_engine import EngineClient, front_end_s
from jitserve.bench.capacity import measure_capacity
from jitserve.bench.live import live_row, live_spec, run_live, scheduler_state, switch_policy
from jitserve.bench.runner import Cell, run_one
from jitserve.bench.stream import stream_completion
from jitserve.goodput import LogHistogram
from jitserve.policy import SLOPolicySpec, load_policy_file
from jitserve.sim.latency import load_profile
from jitserve.sim.workload import generate

METRICS = ("token_goodput", "request_goodput", "ttft_p50", "ttft_p99")


def flat(row: dict[str, Any]) -> dict[str, float]:
    return {"token_goodput": row["token_goodput"], "request_goodput": row["request_goodput"],
            "ttft_p50": row["ttft_s"]["p50"], "ttft_p99": row["ttft_s"]["p99"]}


def engine_totals(engine: EngineClient | None) -> dict[str, float]:
    """vLLM's own metric totals (empty without ``--engine-url``)."""
    return engine.totals() if engine else {}


Rounds = dict[str, list[dict[str, float]]]


async def live_rounds(args: argparse.Namespace, load: float, spec: Any, policies: list[str],
                      engine: EngineClient | None,
                      ) -> tuple[Rounds, dict[str, dict[str, float]], float | None]:
    """Each policy's rounds, its TTFT percentiles over the rounds pooled, and the mean
    of what vLLM's front end added over all runs (:func:`front_end_s`)."""
    import aiohttp

    items = list(generate(spec))
    out: Rounds = {p: [] for p in policies}
    pooled = {p: LogHistogram() for p in policies}
    front: list[float] = []
    for round_ in range(args.rounds):
        order = policies[round_ % len(policies):] + policies[:round_ % len(policies)]
        for policy in order:
            await switch_policy(args.url, args.policy_file, policy, timeout_s=120)
            live_bench.RUN_ID = f"{time.time_ns():x}"  # programs of one run are its own
            before = engine_totals(engine)
            ledger, stats, wall = await run_live(args.url, items, seed=args.seed,
                                                 prompt_seed=time.time_ns())
            added = front_end_s(before, engine_totals(engine))
            if added is not None:
                front.append(added)
            pooled[policy].merge(ledger.ttft)
            async with aiohttp.ClientSession() as session:
                state = await scheduler_state(session, args.url)
            row = live_row(policy, ledger, stats, spec.duration_s, wall, load=load,
                           seed=args.seed, scheduler=state)
            out[policy].append(flat(row))
            print(f"live load {load} round {round_ + 1} {policy}: tokens/s "
                  f"{row['token_goodput']:.0f}, requests/s {row['request_goodput']:.2f}, "
                  f"errors {row['errors']}", flush=True)
    return (out, {p: {"ttft_p50": h.percentile(50), "ttft_p99": h.percentile(99)}
                  for p, h in pooled.items()}, statistics.mean(front) if front else None)


def simulated(cell: Cell, stack: tuple[tuple[str, float], ...]) -> dict[str, float]:
    """``cell`` on the profile with ``stack``'s fields (none: the engine alone)."""
    return flat(run_one(dataclasses.replace(cell, profile_overrides=stack)))


async def lone_ttfts(url: str, n: int, prompt_tokens: int) -> list[float]:
    """Time to first token of ``n`` requests sent one at a time (fresh random prompts, so
    none reads another's prefix cache), each after the last has ended."""
    import random

    import aiohttp

    rng = random.Random(time.time_ns())
    out = []
    async with aiohttp.ClientSession() as session:
        for _ in range(n):
            body = {"prompt": [rng.randrange(10, 1000) for _ in range(prompt_tokens)],
                    "max_tokens": 2, "ignore_eos": True}
            result = await stream_completion(session, url, body)
            if result.status != 200 or not result.token_times:
                raise SystemExit(f"a lone request to {url} failed: {result.error}")
            out.append(result.token_times[0] - result.start_s)
    return out


def live_engine_queue(url: str) -> int:
    """The live sidecar's engine queue (its ``/debug/scheduler``)."""
    import aiohttp

    async def read() -> dict[str, Any] | None:
        async with aiohttp.ClientSession() as session:
            return await scheduler_state(session, url)

    state = asyncio.run(read())
    if not state or "engine_queue" not in state:
        raise SystemExit(f"no engine_queue in {url}/debug/scheduler: pass --engine-queue")
    return int(state["engine_queue"])


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
    p.add_argument("--live-from", type=Path, default=None,
                   help="an earlier run's sim_vs_live.json: its live rounds, not new ones")
    p.add_argument("--engine-queue", type=int, default=None,
                   help="the sidecar's engine queue (default: read from --url)")
    p.add_argument("--path-requests", type=int, default=30,
                   help="lone requests that measure the stack's path")
    p.add_argument("--path-prompt", type=int, default=64, help="their prompt tokens")
    p.add_argument("--engine-url", default=None,
                   help="vLLM itself (e.g. http://127.0.0.1:8011), whose /metrics give what "
                   "its front end adds under load (default: not measured, the lone path)")
    args = p.parse_args()
    policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    engine = EngineClient(args.engine_url) if args.engine_url else None
    profile = load_profile(args.profile)
    args.out.mkdir(parents=True, exist_ok=True)
    base = live_spec(args.duration, 1.0, args.seed, args.mix, args.trace)
    capacity = measure_capacity(profile, base)
    print(f"simulator capacity of {profile.name}: {capacity:.2f} work items/s", flush=True)
    saved = json.loads(args.live_from.read_text()) if args.live_from else []
    earlier = {r["load"]: r for r in saved}
    if saved:  # the stack as it was measured then: its queue and lone requests
        queue, lone = saved[0]["engine_queue"], saved[0]["lone_ttft_s"]
        lone_front = saved[0].get("front_end_lone_s")
    else:
        queue = (args.engine_queue if args.engine_queue is not None
                 else live_engine_queue(args.url))
        before = engine_totals(engine)
        lone = asyncio.run(lone_ttfts(args.url, args.path_requests, args.path_prompt))
        lone_front = front_end_s(before, engine_totals(engine))
    engine_s = profile.step_s(args.path_prompt, args.path_prompt ** 2 / 2, 0, 0, 1)
    path = max(0.0, statistics.median(lone) - engine_s)
    print(f"the sidecar's engine queue: {queue}; lone requests' time to first token: median "
          f"{statistics.median(lone) * 1e3:.2f} ms, the profile's step "
          f"{engine_s * 1e3:.2f} ms: the stack's path {path * 1e3:.2f} ms"
          + (f" (vLLM's front end {lone_front * 1e3:.2f} ms of it)"
             if lone_front is not None else ""),
          flush=True)
    settings = (load_policy_file(args.policy_file) if args.policy_file.exists()
                else SLOPolicySpec())
    results: list[dict[str, Any]] = []
    for load in (float(x) for x in args.loads.split(",")):
        spec = live_spec(args.duration, load * capacity, args.seed, args.mix, args.trace)
        if load in earlier:
            live, pooled, front = (earlier[load]["live"], earlier[load].get("live_pooled"),
                                   earlier[load].get("front_end_s"))
        else:
            live, pooled, front = asyncio.run(live_rounds(args, load, spec, policies, engine))
        # the front end's wait under this load, beyond what the lone requests' path holds
        extra = (max(0.0, front - lone_front)
                 if front is not None and lone_front is not None else 0.0)
        # the sidecar always runs its door, whatever its queue and path
        stack = (("engine_queue", queue), ("request_path_s", path + extra), ("door", True))
        cells = {policy: Cell(policy, load, args.seed, spec, capacity, args.profile, settings)
                 for policy in policies}
        sim = {policy: simulated(cell, stack) for policy, cell in cells.items()}
        in_engine = {policy: simulated(cell, ()) for policy, cell in cells.items()}
        results.append({"load": load, "rate": load * capacity, "engine_queue": queue,
                        "path_s": path, "lone_ttft_s": lone, "front_end_lone_s": lone_front,
                        "front_end_s": front, "path_under_load_s": path + extra,
                        "sim": sim, "in_engine": in_engine, "live": live,
                        "live_pooled": pooled,
                        "pairs": {m: pairs_ordered(live, sim, m) for m in METRICS[:2]}})
        (args.out / "sim_vs_live.json").write_text(json.dumps(results, indent=2))
    print(markdown(results))
    (args.out / "sim_vs_live.md").write_text(markdown(results) + "\n")
    return 0


def markdown(results: list[dict[str, Any]]) -> str:
    lines = ["| load | policy | tokens/s live (sd) | sim / live | requests/s live (sd) | "
             "sim / live | TTFT p50 s live (range) | sim / live | TTFT p99 s live (range) | "
             "sim / live |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for policy, rows in r["live"].items():
            cells = [f"{r['load']:.1f}", policy]
            for metric in METRICS:
                values = [row[metric] for row in rows]
                pooled = (r.get("live_pooled") or {}).get(policy, {}).get(metric)
                live = pooled if pooled is not None else statistics.mean(values)
                sd = statistics.stdev(values) if len(values) > 1 else 0.0
                ratios = [r[side][policy][metric] / live if live else float("nan")
                          for side in ("sim", "in_engine")]
                shown = (f"{live:.3g} ({sd:.2g})" if metric in METRICS[:2]
                         else f"{live:.3g} ({min(values):.2g}-{max(values):.2g})")
                cells += [shown, f"{ratios[0]:.2f} ({ratios[1]:.2f})"]
            lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if results:
        lines.append(f"sim / live: the simulator as the stack runs (engine queue "
                     f"{results[0]['engine_queue']}, path per call "
                     + ", ".join(f"{r.get('path_under_load_s', r['path_s']) * 1e3:.1f} ms "
                                 f"at {r['load']:g}x" for r in results)
                     + ", the sidecar's door); in brackets the engine alone with an "
                     "in-engine scheduler (no door). TTFT live: over the rounds' requests "
                     "pooled (the rounds' own in brackets).")
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
