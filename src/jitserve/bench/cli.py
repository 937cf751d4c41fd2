"""``jitserve bench``: replay workloads through every policy in the simulator.

Who owns what: this module parses the command line, expands the run matrix (policy x
load x seed), runs each cell in a worker process (:func:`run_one`, pure apart from its
return value), and hands the rows to :mod:`jitserve.bench.report` for the table, the JSON
and the plots. The scheduler micro-benchmark (``--micro``) times one GMAX frame.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import tracemalloc
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from jitserve.bench.capacity import measure_capacity
from jitserve.bench.variants import make_setup, policy_names
from jitserve.errors import CLIError
from jitserve.goodput import GoodputLedger
from jitserve.policy import PolicyError, SLOPolicySpec, load_policy_file
from jitserve.sim.cluster import run_cluster
from jitserve.sim.engine import Engine, EngineStats
from jitserve.sim.latency import DEFAULT_PROFILE, available_profiles, load_profile
from jitserve.sim.workload import ARRIVALS, TRACES, WorkloadSpec, generate, parse_mix

WORKLOAD_MIXES = {
    "mixed": None,
    "latency": (1.0, 0.0, 0.0),
    "deadline": (0.0, 1.0, 0.0),
    "compound": (0.0, 0.0, 1.0),
}
DEFAULT_POLICIES = "gmax,fcfs,sarathi,edf,lsf,sjf,plas,gmax-exact"


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


def run_one(cell: Cell) -> dict[str, Any]:
    """Simulate one (policy, load, seed) cell and return its row of results."""
    profile = load_profile(cell.profile)
    ledger = GoodputLedger()
    engines = []
    for replica in range(cell.replicas):
        setup = make_setup(cell.policy, cell.spec, seed=cell.seed * 1000 + replica)
        engines.append(
            Engine(
                profile,
                setup.policy,
                setup.estimator,
                setup.stage_share,
                ledger=ledger,
                refine_every=cell.spec.scheduler.refine_every,
            )
        )
    rate = cell.load * cell.capacity_per_s * cell.replicas
    workload = replace(cell.workload, rate_per_s=rate, seed=cell.seed)
    if cell.track_memory:
        tracemalloc.start()
    started, cpu_started = time.perf_counter(), time.process_time()
    run_cluster(engines, generate(workload))
    wall_s = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_started
    peak_bytes = tracemalloc.get_traced_memory()[1] if cell.track_memory else None
    if cell.track_memory:
        tracemalloc.stop()
    duration = workload.duration_s
    stats = EngineStats()
    for engine in engines:
        stats.merge(engine.stats)
    return {
        "policy": cell.policy,
        "load": cell.load,
        "seed": cell.seed,
        "requests": ledger.overall.requests,
        "token_goodput": ledger.overall.goodput_tokens / duration,
        "request_goodput": ledger.overall.met / duration,
        "attainment": {k: v for k, v in ledger.attainment().items()},
        "goodput_tokens_by_kind": {k.value: t.goodput_tokens for k, t in ledger.by_kind.items()},
        "attainment_by_tenant": {k: t.attainment for k, t in sorted(ledger.by_tenant.items())},
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
    }


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="replay a workload through GMAX and the baselines in the simulator",
        description=(
            "Simulate each policy on the same engine and trace, and print goodput, SLO "
            "attainment per kind, latency percentiles, throughput and scheduler cost. "
            "Load is relative to the engine's measured capacity for the workload "
            "(work items/s Sarathi-Serve sustains when saturated)."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--workload",
        choices=sorted(WORKLOAD_MIXES),
        default="mixed",
        help="request patterns: mixed uses --mix",
    )
    parser.add_argument("--mix", default="1:1:1", help="latency:deadline:compound shares")
    parser.add_argument(
        "--trace",
        choices=[*TRACES, "synthetic"],
        default="azure-conv",
        help="lengths (and, with --arrival trace, arrival times) from this trace",
    )
    parser.add_argument(
        "--arrival",
        choices=ARRIVALS,
        default="trace",
        help="arrival process; trace = the trace's timestamps rescaled to the load",
    )
    parser.add_argument("--load", default="0.8,1.0,1.5", help="comma-separated loads (x capacity)")
    parser.add_argument(
        "--rate",
        type=float,
        help="absolute arrival rate (work items/s) instead of --load; e.g. 5.53 replays "
        "azure-conv at its recorded pace",
    )
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of arrivals")
    parser.add_argument(
        "--policies",
        default=DEFAULT_POLICIES,
        help=f"comma-separated; known: {', '.join(policy_names())}",
    )
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated seeds")
    parser.add_argument(
        "--profile",
        default=DEFAULT_PROFILE,
        help=f"engine profile name ({', '.join(available_profiles())}) or JSON path",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="engine replicas behind a least-outstanding-work router (load is per replica)",
    )
    parser.add_argument("--config", help="SLOPolicy spec (YAML) for GMAX settings and SLO defaults")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--out", default="bench-out", help="directory for results.json and plots")
    parser.add_argument("--memory", action="store_true", help="track peak Python memory per run")
    parser.add_argument(
        "--live",
        metavar="URL",
        help="replay the workload against a live endpoint (e.g. jitserve up) instead of the "
        "simulator; uses --duration, --rate (default 2/s), --mix, --trace and the first seed",
    )
    parser.add_argument(
        "--live-bare",
        metavar="BACKEND_URL",
        help="with --live: also replay the workload directly against this vLLM (the sidecar's "
        "backend), alternating sidecar / bare runs, and write one comparison table",
    )
    parser.add_argument("--live-rounds", type=int, default=2, help="with --live-bare: A/B rounds")
    parser.add_argument(
        "--live-slo",
        choices=("body", "headers", "none"),
        default="body",
        help="with --live: send each request's SLO as the body's slo object, as x-slo-* "
        "headers, or not at all (it is scored the same either way; the bare vLLM never gets it)",
    )
    parser.add_argument(
        "--live-workload",
        choices=("mixed", "uniform"),
        default="mixed",
        help="with --live-bare: the mixed SLO workload (--mix, --trace), or equal requests "
        "with a latency SLO (TTFT 2 s, TBT 100 ms) like vLLM's random dataset",
    )
    parser.add_argument("--live-prompt", type=int, help="prompt tokens (cap for mixed)")
    parser.add_argument("--live-output", type=int, help="output tokens (cap for mixed)")
    parser.add_argument(
        "--live-policy-file",
        type=Path,
        help="with --live and --policies: the sidecar's hot-reloaded policy file, rewritten to "
        "switch policy between runs",
    )
    parser.add_argument(
        "--proxy-overhead",
        action="store_true",
        help="measure the latency the sidecar adds per streamed token (100 streams x 100 tokens "
        "against a fast local token source)",
    )
    parser.add_argument(
        "--micro",
        action="store_true",
        help="only time one GMAX decision over 2,000 and 10,000 live requests",
    )
    parser.set_defaults(handler=main)


def _floats(text: str, what: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as err:
        raise CLIError(f"--{what}: expected comma-separated numbers, got {text!r}") from err
    if not values or any(v <= 0 for v in values):
        raise CLIError(f"--{what}: values must be positive, got {text!r}")
    return values


def main(args: argparse.Namespace) -> int:
    from jitserve.bench import micro, report

    if args.micro:
        micro.main()
        return 0
    if args.live or args.proxy_overhead:
        return _live(args)
    try:
        spec = load_policy_file(args.config) if args.config else SLOPolicySpec()
    except PolicyError as err:
        raise CLIError(str(err)) from err
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for name in policies:
        try:
            make_setup(name, spec)
        except ValueError as err:
            raise CLIError(str(err)) from err
    loads = _floats(args.load, "load")
    seeds = [int(s) for s in _floats(args.seeds, "seeds")]
    try:
        mix = WORKLOAD_MIXES[args.workload] or parse_mix(args.mix)
        workload = WorkloadSpec(
            trace=args.trace,
            mix=mix,
            arrival=args.arrival,
            duration_s=args.duration,
            slo=spec.slo_defaults,
        )
        profile = load_profile(args.profile)
    except ValueError as err:
        raise CLIError(str(err)) from err
    print(
        f"measuring capacity of profile {profile.name} on {args.trace} ({args.workload})...",
        flush=True,
    )
    capacity = measure_capacity(profile, workload)
    print(f"capacity: {capacity:.3f} work items/s (load 1.0)", flush=True)
    if args.replicas < 1:
        raise CLIError(f"--replicas must be >= 1, got {args.replicas}")
    if args.rate is not None:
        if args.rate <= 0:
            raise CLIError(f"--rate must be positive, got {args.rate}")
        loads = [args.rate / (capacity * args.replicas)]
    cells = [
        Cell(p, load, seed, workload, capacity, args.profile, spec, args.memory, args.replicas)
        for load in loads
        for p in policies
        for seed in seeds
    ]
    rows = _run_cells(cells, args.jobs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "workload": args.workload,
        "mix": list(mix),
        "trace": args.trace,
        "arrival": args.arrival,
        "duration_s": args.duration,
        "profile": profile.name,
        "capacity_items_per_s": capacity,
        "policies": policies,
        "loads": loads,
        "seeds": seeds,
    }
    summary = report.summarize(rows)
    (out / "results.json").write_text(
        json.dumps({"meta": meta, "runs": rows, "summary": summary}, indent=2)
    )
    (out / "report.md").write_text(report.markdown(summary) + "\n")
    print(report.table(summary))
    try:
        for path in report.plots(summary, out):
            print(f"wrote {path}")
    except ImportError as err:
        print(f"plots skipped: {err.name} is not installed (pip install 'jitserve[bench]')")
    print(f"wrote {out / 'results.json'}")
    return 0


def _live(args: argparse.Namespace) -> int:
    """``--live`` and ``--proxy-overhead`` are the sidecar's load tools (aiohttp)."""
    try:
        from jitserve.bench import live, overhead
    except ImportError as err:
        raise CLIError(
            f"--live needs the sidecar extra: pip install 'jitserve[sidecar]' ({err})"
        ) from err
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.proxy_overhead:
        return overhead.proxy_overhead_main(
            argparse.Namespace(
                streams=100,
                tokens=100,
                interval_ms=30.0,
                policy="gmax",
                emit="step",
                out=out / "proxy_overhead.json",
            )
        )
    if args.live_bare:
        from jitserve.bench.compare import compare_main

        return compare_main(
            args.live, args.live_bare, workload=args.live_workload, duration_s=args.duration,
            rate=args.rate or 2.0, rounds=args.live_rounds, carrier=args.live_slo,
            seed=int(args.seeds.split(",")[0]), mix=args.mix, trace=args.trace,
            prompt_tokens=args.live_prompt, output_tokens=args.live_output, out_dir=out)
    live_policies = args.policies if args.live_policy_file else None
    return live.bench_live_main(
        argparse.Namespace(
            url=args.live,
            duration=args.duration,
            rate=args.rate or 2.0,
            mix=args.mix,
            trace=args.trace,
            seed=int(args.seeds.split(",")[0]),
            max_prompt=128,
            max_output=96,
            model=None,
            slo_via=args.live_slo,
            policies=live_policies,
            policy_file=args.live_policy_file,
            out=out / "live.json",
            markdown=True,
        )
    )


def _run_cells(cells: list[Cell], jobs: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tqdm(total=len(cells), desc="simulating", unit="run") as bar:
        if jobs <= 1 or len(cells) == 1:
            for cell in cells:
                rows.append(run_one(cell))
                bar.update()
        else:
            with ProcessPoolExecutor(max_workers=jobs) as pool:
                for row in pool.map(run_one, cells):
                    rows.append(row)
                    bar.update()
    return rows


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")
