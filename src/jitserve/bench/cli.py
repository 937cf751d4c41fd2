"""``jitserve bench``: replay workloads through every policy in the simulator.

Who owns what: this module parses the command line and expands the runs (policy x load
x seed) into cells for :mod:`jitserve.bench.runner`, then hands the rows to
:mod:`jitserve.bench.report` for the table, the JSON and the plots. ``--matrix`` runs
the scenario matrix (:mod:`jitserve.bench.matrix`); ``--micro`` times one GMAX frame.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jitserve.bench.autoscale import add_autoscale_flags
from jitserve.bench.capacity import measure_capacity
from jitserve.bench.fleet import add_fleet_flags, fleet_from_args, placement_ratios_markdown
from jitserve.bench.live_cli import add_live_arguments, run_live_tools
from jitserve.bench.runner import (
    Cell,
    cell_profile,
    check_policy,
    default_policies,
    known_policies,
    run_cells,
)
from jitserve.errors import CLIError
from jitserve.policy import AutoSettings, BudgetRule, PolicyError, SLOPolicySpec, load_policy_file
from jitserve.sim.latency import DEFAULT_PROFILE, available_profiles
from jitserve.sim.workload import (
    ARRIVALS,
    TRACES,
    WorkloadSpec,
    parse_claims,
    parse_mix,
    parse_tenant_mix,
)
from jitserve.tuning.tuner import with_auto

if TYPE_CHECKING:
    from jitserve.bench.matrix import MatrixSize

WORKLOAD_MIXES = {
    "mixed": None,
    "latency": (1.0, 0.0, 0.0),
    "deadline": (0.0, 1.0, 0.0),
    "compound": (0.0, 0.0, 1.0),
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
        help="comma-separated (default: gmax, every baseline, gmax with exact lengths and "
        f"the upper bound); known: {', '.join(known_policies())}",
    )
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated seeds")
    parser.add_argument(
        "--profile",
        default=DEFAULT_PROFILE,
        help=f"engine profile name ({', '.join(available_profiles())}) or JSON path",
    )
    parser.add_argument(
        "--budget",
        type=int,
        help="engine token budget per iteration (vLLM max_num_batched_tokens); default: the "
        "profile's (2048, vLLM v1 on an A100)",
    )
    parser.add_argument(
        "--budget-rule",
        choices=[r.value for r in BudgetRule],
        help="per-iteration token budget rule, for every policy (default: --config's "
        "scheduler.budgetRule, fixed): fixed = --budget each step, greedy = the largest chunk "
        "keeping the tightest decode within its TBT, sliding = SlidingChunker",
    )
    parser.add_argument(
        "--max-num-seqs",
        type=int,
        help="engine batch slots B (vLLM max_num_seqs); default: the profile's (256)",
    )
    parser.add_argument(
        "--engine-queue",
        type=int,
        metavar="N",
        help="model the sidecar stack: N requests dispatched beyond the B slots wait inside "
        "the engine in dispatch order, as the sidecar's --engine-queue keeps them in vLLM, "
        "and latency arrivals are judged at the sidecar's door (admission.onTimeQuantile) "
        "(default: none, the policy picks at the step a slot frees, as an in-engine "
        "scheduler, and there is no door)",
    )
    parser.add_argument("--max-prompt", type=int, metavar="TOKENS",
                        help="cap every prompt at this many tokens (as --live's workload on a "
                        "CPU model; default: none)")
    parser.add_argument("--max-output", type=int, metavar="TOKENS",
                        help="cap every output at this many tokens (default: none)")
    parser.add_argument("--tool-scale", type=float, default=1.0,
                        help="multiply compound programs' tool time by this (--live's workload: "
                        "0.1)")
    parser.add_argument(
        "--tenant-mix",
        metavar="NAME=W,...",
        help="skewed tenant demand, e.g. a=3,b=1,c=1 (share of work items per tenant); the "
        "fair-share weights come from --config's fairness section",
    )
    parser.add_argument(
        "--claims",
        metavar="NAME=FACTOR,...",
        help="tenants that claim tighter SLOs than the policy's defaults, each target times "
        "FACTOR (e.g. a=0.25: four times tighter); held to --config's "
        "fairness.tenants[].tightest as the sidecar holds them",
    )
    parser.add_argument(
        "--matrix",
        action="store_true",
        help="run the scenario matrix (loads x mixes x traces x budgets x tenant skew; "
        "docs/benchmarks.md) and write matrix.md, matrix.json and a heatmap to --out",
    )
    parser.add_argument(
        "--split",
        choices=("report", "validation"),
        default="report",
        help="with --matrix: the reported scenarios and windows, or the validation split "
        "(the cells and windows settings are tuned on)",
    )
    parser.add_argument(
        "--matrix-size",
        metavar="DURATION:LOADS[:nobound]",
        help="with --matrix: seconds per run and loads, e.g. 120:1.0,1.5,2.0:nobound "
        "(default 240 s at 0.6,1.0,1.5,2.0 with the upper bound)",
    )
    add_fleet_flags(parser)
    add_autoscale_flags(parser)
    _add_auto_flags(parser)
    parser.add_argument("--config", help="SLOPolicy spec (YAML) for GMAX settings and SLO defaults")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--out", default="bench-out", help="directory for results.json and plots")
    parser.add_argument("--memory", action="store_true", help="track peak Python memory per run")
    add_live_arguments(parser)
    parser.add_argument(
        "--micro",
        action="store_true",
        help="only time one GMAX decision over 2,000 and 10,000 live requests",
    )
    parser.set_defaults(handler=main)


def _add_auto_flags(parser: argparse.ArgumentParser) -> None:
    defaults = AutoSettings()
    group = parser.add_argument_group(
        "auto (--policies auto: the tuner picks the scheduler; each flag overrides the "
        "policy file's scheduler.auto, whose defaults are shown)")
    group.add_argument("--auto-candidates", default=None,
                       help="the policies the tuner replays; the first starts (default: "
                       f"{','.join(defaults.candidates)})")
    group.add_argument("--auto-period", type=float, default=None, metavar="SECONDS",
                       help=f"seconds between comparisons (default: {defaults.period_seconds})")
    group.add_argument("--auto-window", type=float, default=None, metavar="SECONDS",
                       help="seconds of past traffic each comparison scores (default: "
                       f"{defaults.window_seconds})")
    group.add_argument("--auto-margin", type=float, default=None,
                       help="a candidate takes over when it earns more than (1 + margin) x "
                       f"the policy in effect (default: {defaults.margin})")


def _auto_settings(args: argparse.Namespace, spec: SLOPolicySpec) -> SLOPolicySpec:
    flags = {"candidates": args.auto_candidates, "period_seconds": args.auto_period,
             "window_seconds": args.auto_window, "margin": args.auto_margin}
    changes: dict[str, object] = {k: v for k, v in flags.items() if v is not None}
    if args.auto_candidates is not None:
        changes["candidates"] = [c.strip() for c in args.auto_candidates.split(",") if c.strip()]
    try:
        return with_auto(spec, **changes)
    except ValueError as err:  # pydantic's names the field; say which flag set it
        raise CLIError(f"--auto-*: {err}") from err


def _floats(text: str, what: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as err:
        raise CLIError(f"--{what}: expected comma-separated numbers, got {text!r}") from err
    if not values or any(v <= 0 for v in values):
        raise CLIError(f"--{what}: values must be positive, got {text!r}")
    return values


def _matrix_size(args: argparse.Namespace) -> MatrixSize:
    from jitserve.bench import matrix

    if not args.matrix_size:
        return matrix.MatrixSize(split=args.split)
    duration, _, rest = args.matrix_size.partition(":")
    loads, _, flag = rest.partition(":")
    if flag not in ("", "nobound"):
        raise CLIError(f"--matrix-size: the third part can only be 'nobound', got {flag!r}")
    return matrix.MatrixSize(
        split=args.split,
        duration_s=_floats(duration, "matrix-size")[0],
        loads=tuple(_floats(loads, "matrix-size")) if loads else matrix.LOADS,
        bound=flag != "nobound",
    )


def main(args: argparse.Namespace) -> int:
    from jitserve.bench import matrix, micro

    if args.micro:
        micro.main()
        return 0
    if args.live or args.proxy_overhead:
        return run_live_tools(args)
    try:
        spec = load_policy_file(args.config) if args.config else SLOPolicySpec()
    except PolicyError as err:
        raise CLIError(str(err)) from err
    if args.budget_rule:
        rule = BudgetRule(args.budget_rule)
        spec = spec.with_scheduler(budget_rule=rule)
    if args.matrix:
        return matrix.main(spec, Path(args.out), args.jobs, args.profile, _matrix_size(args))
    policies = [p.strip() for p in (args.policies or ",".join(default_policies())).split(",")]
    policies = [p for p in policies if p]
    overrides = _profile_overrides(args)
    spec = _auto_settings(args, spec)
    try:
        for name in policies:
            check_policy(name, spec)
        mix = WORKLOAD_MIXES[args.workload] or parse_mix(args.mix)
        tenants = parse_tenant_mix(args.tenant_mix) if args.tenant_mix else None
        workload = WorkloadSpec(
            trace=args.trace,
            mix=mix,
            arrival=args.arrival,
            duration_s=args.duration,
            slo=spec.slo_defaults,
            max_prompt=args.max_prompt,
            max_output=args.max_output,
            tool_scale=args.tool_scale,
        )
        if tenants:
            workload = replace(workload, tenants=tenants[0], tenant_demand=tenants[1])
        if args.claims:
            workload = replace(workload, claim_scale=parse_claims(args.claims))
        profile = cell_profile(args.profile, overrides)
    except ValueError as err:
        raise CLIError(str(err)) from err
    loads = _floats(args.load, "load")
    seeds = [int(s) for s in _floats(args.seeds, "seeds")]
    if args.autoscale:
        from jitserve.bench import autoscale

        return autoscale.main(args, spec, workload, overrides, seeds)
    fleet = fleet_from_args(args)
    print(
        f"measuring capacity of profile {profile.name} (budget {profile.chunk_token_budget}, "
        f"{profile.max_running} sequences) on {args.trace} ({args.workload})...",
        flush=True,
    )
    capacity = measure_capacity(profile, workload)
    print(f"capacity: {capacity:.3f} work items/s (load 1.0)", flush=True)
    if args.rate is not None:
        if args.rate <= 0:
            raise CLIError(f"--rate must be positive, got {args.rate}")
        loads = [args.rate / (capacity * (sum(fleet.speeds) or args.replicas))]
    cells = [
        Cell(p, load, seed, workload, capacity, args.profile, spec, args.memory,
             args.replicas, overrides, scenario=fleet.scenario, placement=placement,
             replica_speeds=fleet.speeds, report_period_s=fleet.report_period_s)
        for load in loads
        for p in policies
        for placement in (fleet.placements or ("",))
        for seed in seeds
    ]
    rows = run_cells(cells, args.jobs)
    meta = {
        "workload": args.workload,
        "mix": list(mix),
        "trace": args.trace,
        "arrival": args.arrival,
        "duration_s": args.duration,
        "profile": profile.name,
        "chunk_token_budget": profile.chunk_token_budget,
        "budget_rule": spec.scheduler.budget_rule.value,
        "max_running": profile.max_running,
        "engine_queue": profile.engine_queue,
        "tenant_mix": args.tenant_mix,
        "capacity_items_per_s": capacity,
        "policies": policies,
        "loads": loads,
        "seeds": seeds,
        "replicas": args.replicas,
        "placements": list(fleet.placements),
        "replica_speeds": list(fleet.speeds),
        "report_period_s": fleet.report_period_s,
    }
    _write(Path(args.out), meta, rows, spec)
    return 0


def _profile_overrides(args: argparse.Namespace) -> tuple[tuple[str, float], ...]:
    overrides = []
    for value, field, flag in (
        (args.budget, "chunk_token_budget", "--budget"),
        (args.max_num_seqs, "max_running", "--max-num-seqs"),
    ):
        if value is not None:
            if value < 1:
                raise CLIError(f"{flag} must be >= 1, got {value}")
            overrides.append((field, value))
    if args.engine_queue is not None:
        if args.engine_queue < 0:
            raise CLIError(f"--engine-queue must be >= 0, got {args.engine_queue}")
        overrides += [("engine_queue", args.engine_queue), ("door", True)]
    return tuple(overrides)


def _write(out: Path, meta: dict[str, Any], rows: list[dict[str, Any]],
           spec: SLOPolicySpec) -> None:
    from jitserve.bench import report
    from jitserve.bench.save_result import write_runs
    from jitserve.bench.tenants import tenants_markdown

    out.mkdir(parents=True, exist_ok=True)
    summary = report.summarize(rows)
    (out / "results.json").write_text(
        json.dumps({"meta": meta, "runs": rows, "summary": summary}, indent=2)
    )
    ratios = placement_ratios_markdown(summary) or report.ratios_markdown(summary)
    tenants = tenants_markdown(summary, spec.fairness.weight_of)
    (out / "report.md").write_text(
        "\n\n".join(x for x in (report.markdown(summary), ratios, tenants) if x) + "\n")
    print(report.table(summary))
    print(ratios)
    if tenants:
        print(tenants)
    try:
        for path in report.plots(summary, out):
            print(f"wrote {path}")
    except ImportError as err:
        print(f"plots skipped: {err.name} is not installed (pip install 'jitserve[bench]')")
    runs = write_runs(out, rows, meta)
    print(f"wrote {out / 'results.json'}, {out / 'report.md'} and {runs}/ (one file per run, "
          "in the shape of vllm bench serve --save-result)")
