"""Budget-rule sweep (issue 17): each policy at fixed budgets 512..4096 and at the greedy
and sliding rules, on the same arrivals (absolute rate: load x the capacity measured at
the default 2048 budget, so a budget does not move the load), and the ratio of the
sliding rule to the best fixed budget per cell. Writes a markdown table to stdout.

  nice -n 5 .venv/bin/python scripts/budget_sweep.py --traces azure-conv \
      --mixes 1:0:0,2:1:0 --loads 1.0,1.5 --seeds 1,2,3 --duration 120

``--ablation``: SlidingServe's parts on Sarathi-EDF (edf-ac at the fixed budget): the
chunker (budget rule sliding), the sorter (policy slidingserve-ac), the constructor
(scheduler.batchConstructor), each added alone and each removed from all three.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from jitserve.bench.capacity import measure_capacity
from jitserve.bench.runner import Cell, cell_profile, run_cells
from jitserve.policy import BudgetRule, SLOPolicySpec
from jitserve.sim.latency import DEFAULT_PROFILE
from jitserve.sim.workload import WorkloadSpec, parse_mix

FIXED = (512, 1024, 2048, 4096)


ABLATION = {  # name: (policy, budget rule, constructor)
    "sarathi-edf": ("edf-ac", BudgetRule.FIXED, False),
    "+chunker": ("edf-ac", BudgetRule.SLIDING, False),
    "+sorter": ("slidingserve-ac", BudgetRule.FIXED, False),
    "+constructor": ("edf-ac", BudgetRule.FIXED, True),
    "all - chunker": ("slidingserve-ac", BudgetRule.FIXED, True),
    "all - sorter": ("edf-ac", BudgetRule.SLIDING, True),
    "all - constructor": ("slidingserve-ac", BudgetRule.SLIDING, False),
    "slidingserve (all)": ("slidingserve-ac", BudgetRule.SLIDING, True),
}


def configs(rule_budget: int) -> list[tuple[str, BudgetRule, int]]:
    fixed = [(f"fixed-{b}", BudgetRule.FIXED, b) for b in FIXED]
    return [*fixed, (f"greedy-{rule_budget}", BudgetRule.GREEDY, rule_budget),
            (f"sliding-{rule_budget}", BudgetRule.SLIDING, rule_budget)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--traces", default="azure-conv")
    ap.add_argument("--mixes", default="1:0:0,2:1:0")
    ap.add_argument("--loads", default="1.0,1.5")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--policies", default="gmax,edf-ac")
    ap.add_argument("--duration", type=float, default=120.0)
    ap.add_argument("--rule-budget", type=int, default=4096,
                    help="the engine maximum the greedy and sliding rules work under")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    ap.add_argument("--ablation", action="store_true")
    args = ap.parse_args()
    base = SLOPolicySpec()
    if args.ablation:
        print(ablation(args, base))
        return
    rows = []
    for trace in args.traces.split(","):
        for mix_text in args.mixes.split(","):
            workload = WorkloadSpec(trace=trace, mix=parse_mix(mix_text), arrival="trace",
                                    duration_s=args.duration, slo=base.slo_defaults)
            capacity = measure_capacity(cell_profile(DEFAULT_PROFILE, ()), workload)
            cells, names = [], []
            for load in (float(x) for x in args.loads.split(",")):
                for policy in args.policies.split(","):
                    for name, rule, budget in configs(args.rule_budget):
                        spec = base.model_copy(update={"scheduler": base.scheduler.model_copy(
                            update={"budget_rule": rule})})
                        for seed in (int(s) for s in args.seeds.split(",")):
                            cells.append(Cell(policy, load, seed, workload, capacity,
                                              DEFAULT_PROFILE, spec,
                                              profile_overrides=(("chunk_token_budget",
                                                                  budget),)))
                            names.append((trace, mix_text, load, policy, name))
            for key, row in zip(names, run_cells(cells, args.jobs, desc=f"{trace} {mix_text}"),
                                strict=True):
                rows.append({"trace": key[0], "mix": key[1], "load": key[2], "policy": key[3],
                             "config": key[4], "token_goodput": row["token_goodput"],
                             "request_goodput": row["request_goodput"]})
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    print(table(rows))


def ablation(args: argparse.Namespace, base: SLOPolicySpec) -> str:
    out = ["| trace | mix | load | variant | tok/s | req/s | tok vs sarathi-edf | req |",
           "|" + "---|" * 8]
    for trace in args.traces.split(","):
        for mix_text in args.mixes.split(","):
            workload = WorkloadSpec(trace=trace, mix=parse_mix(mix_text), arrival="trace",
                                    duration_s=args.duration, slo=base.slo_defaults)
            capacity = measure_capacity(cell_profile(DEFAULT_PROFILE, ()), workload)
            for load in (float(x) for x in args.loads.split(",")):
                cells, names = [], []
                for name, (policy, rule, built) in ABLATION.items():
                    spec = base.model_copy(update={"scheduler": base.scheduler.model_copy(
                        update={"budget_rule": rule, "batch_constructor": built})})
                    for seed in (int(s) for s in args.seeds.split(",")):
                        cells.append(Cell(policy, load, seed, workload, capacity,
                                          DEFAULT_PROFILE, spec, profile_overrides=(
                                              ("chunk_token_budget", args.rule_budget),)))
                        names.append(name)
                means: dict[str, list[tuple[float, float]]] = {}
                for name, row in zip(names, run_cells(cells, args.jobs, desc="ablation"),
                                     strict=True):
                    means.setdefault(name, []).append((row["token_goodput"],
                                                       row["request_goodput"]))
                ref = tuple(statistics.mean(v[k] for v in means["sarathi-edf"]) for k in (0, 1))
                for name, vs in means.items():
                    t, q = (statistics.mean(v[k] for v in vs) for k in (0, 1))
                    out.append(f"| {trace} | {mix_text} | {load} | {name} | {t:.0f} | {q:.2f} "
                               f"| {t / ref[0]:.3f} | {q / ref[1]:.3f} |")
    return "\n".join(out)


def table(rows: list[dict[str, object]]) -> str:
    cells: dict[tuple[object, ...], dict[str, list[tuple[float, float]]]] = {}
    for r in rows:
        key = (r["trace"], r["mix"], r["load"], r["policy"])
        cells.setdefault(key, {}).setdefault(str(r["config"]), []).append(
            (float(r["token_goodput"]), float(r["request_goodput"])))  # type: ignore[arg-type]
    out = ["| trace | mix | load | policy | best fixed (tok) | tok/s | best fixed (req) | req/s "
           "| greedy tok/s | req/s | sliding tok/s | req/s | sliding / best fixed (tok) "
           "| (req) |", "|" + "---|" * 14]
    for cell, by in cells.items():
        mean = {c: (statistics.mean(v[0] for v in vs), statistics.mean(v[1] for v in vs))
                for c, vs in by.items()}
        fixed = {c: m for c, m in mean.items() if c.startswith("fixed-")}
        bt = max(fixed, key=lambda c: fixed[c][0])
        br = max(fixed, key=lambda c: fixed[c][1])
        g = next(m for c, m in mean.items() if c.startswith("greedy-"))
        s = next(m for c, m in mean.items() if c.startswith("sliding-"))
        out.append(f"| {cell[0]} | {cell[1]} | {cell[2]} | {cell[3]} | {bt} | {fixed[bt][0]:.0f} "
                   f"| {br} | {fixed[br][1]:.2f} | {g[0]:.0f} | {g[1]:.2f} | {s[0]:.0f} "
                   f"| {s[1]:.2f} | {s[0] / fixed[bt][0]:.3f} | {s[1] / fixed[br][1]:.3f} |")
    return "\n".join(out)


if __name__ == "__main__":
    main()
