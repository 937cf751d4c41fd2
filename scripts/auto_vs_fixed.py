"""Auto against every fixed candidate (issue 31): the matrix's scenarios, each candidate
and ``auto`` run on the same windows, per objective; per cell auto over the best
candidate in hindsight, and over the geometric means the single best fixed candidate
and the hindsight oracle reach across cells.

    python scripts/auto_vs_fixed.py --split validation --loads 1.0,1.5,2.0 --duration 300 --jobs 2
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from statistics import fmean
from typing import Any

from jitserve.bench.capacity import measure_capacity
from jitserve.bench.matrix import SPLITS, MatrixSize, scenarios
from jitserve.bench.matrix_report import geomean
from jitserve.bench.runner import Cell, cell_profile, run_cells
from jitserve.policy import AUTO_CANDIDATES, AutoSettings, Objective, SLOPolicySpec
from jitserve.tuning.tuner import AUTO, with_auto

METRIC = {"tokens": "token_goodput", "requests": "request_goodput"}


def grid(objective: str, split: str, loads: list[float], duration_s: float,
         seeds: tuple[int, ...], base: SLOPolicySpec, profile: str,
         only: str) -> list[Cell]:
    spec = base.model_copy(update={"objective": Objective(objective)})
    settings = spec.scheduler.auto
    cells = []
    for scenario in scenarios(split):
        if only and not scenario.name.startswith(only):
            continue
        workload = scenario.workload(spec, duration_s)
        capacity = measure_capacity(cell_profile(profile, scenario.overrides), workload)
        for load in loads:
            for policy in [*settings.candidates, AUTO]:
                for seed in seeds:
                    cells.append(Cell(policy, load, seed, workload, capacity, profile, spec,
                                      profile_overrides=scenario.overrides,
                                      scenario=scenario.name))
    return cells


def regime_grid(objective: str, first: str, second: str, loads: list[float], duration_s: float,
                seeds: tuple[int, ...], base: SLOPolicySpec, profile: str) -> list[Cell]:
    """``first`` (a scenario name: trace, mix, budget) for ``duration_s``, then ``second``
    for as long, each at ``load`` x its own capacity: the traffic changes regime halfway."""
    spec = base.model_copy(update={"objective": Objective(objective)})
    settings = spec.scheduler.auto
    named = {s.name: s for split in SPLITS for s in scenarios(split)}
    one, two = named[first], named[second]
    if one.overrides != two.overrides:
        raise SystemExit("both phases must run on the same engine (budget and slots)")
    phases = [s.workload(spec, duration_s) for s in (one, two)]
    capacities = [measure_capacity(cell_profile(profile, one.overrides), w) for w in phases]
    cells = []
    for load in loads:
        for policy in [*settings.candidates, AUTO]:
            for seed in seeds:
                then = replace(phases[1], rate_per_s=load * capacities[1], seed=seed)
                cells.append(Cell(policy, load, seed, phases[0], capacities[0], profile, spec,
                                  profile_overrides=one.overrides,
                                  scenario=f"{first} -> {second}", then=then))
    return cells


def table(rows: list[dict[str, Any]], objective: str, candidates: list[str]) -> str:
    metric = METRIC[objective]
    by_cell: dict[tuple[str, float], dict[str, list[float]]] = {}
    for row in rows:
        cell = by_cell.setdefault((row["scenario"], row["load"]), {})
        cell.setdefault(row["policy"], []).append(row[metric])
    means = {k: {p: fmean(v) for p, v in c.items()} for k, c in by_cell.items()}
    lines = [f"objective {objective}: auto / best candidate in hindsight, per cell",
             "| scenario | load | best in hindsight | auto / best | auto / gmax | in effect |",
             "|---|---|---|---|---|---|"]
    effect: dict[tuple[str, float], dict[str, float]] = {}
    for row in rows:
        if row["policy"] == AUTO:
            held = effect.setdefault((row["scenario"], row["load"]), {})
            for name, s in row["auto"]["seconds_in_effect"].items():
                held[name] = held.get(name, 0.0) + s
    for key in sorted(means):
        m = means[key]
        best = max(candidates, key=lambda p: m[p])
        held = effect.get(key, {})
        total = sum(held.values()) or 1.0
        shown = ", ".join(f"{n} {s / total:.0%}" for n, s in
                          sorted(held.items(), key=lambda kv: -kv[1])[:3])
        lines.append(f"| {key[0]} | {key[1]:.2f} | {best} | {m[AUTO] / max(m[best], 1e-12):.3f} "
                     f"| {m[AUTO] / max(m['gmax'], 1e-12):.3f} | {shown} |")
    fixed = {p: geomean([means[k][p] for k in means]) for p in candidates}
    best_fixed = max(fixed, key=lambda p: fixed[p])
    oracle = geomean([max(means[k][p] for p in candidates) for k in means])
    auto = geomean([means[k][AUTO] for k in means])
    worst = min(means[k][AUTO] / max(max(means[k][p] for p in candidates), 1e-12) for k in means)
    lines.append("")
    lines.append(f"geometric mean over {len(means)} cells: auto / best fixed ({best_fixed}) "
                 f"{auto / fixed[best_fixed]:.3f}; oracle / best fixed "
                 f"{oracle / fixed[best_fixed]:.3f}; auto / gmax {auto / fixed['gmax']:.3f}; "
                 f"worst cell auto / hindsight best {worst:.3f}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--split", choices=SPLITS, default="validation")
    parser.add_argument("--loads", default="1.0,1.5,2.0")
    parser.add_argument("--duration", type=float, default=300.0)
    parser.add_argument("--seeds", default="", help="default: the split's windows")
    parser.add_argument("--objectives", default="tokens,requests")
    defaults = AutoSettings()
    parser.add_argument("--candidates", default=",".join(AUTO_CANDIDATES))
    parser.add_argument("--period", type=float, default=defaults.period_seconds)
    parser.add_argument("--window", type=float, default=defaults.window_seconds)
    parser.add_argument("--margin", type=float, default=defaults.margin)
    parser.add_argument("--memory", type=int, default=defaults.memory)
    parser.add_argument("--warmup", type=float, default=defaults.warmup_seconds)
    parser.add_argument("--scenario", default="", help="only scenarios whose name starts so")
    parser.add_argument("--regime", metavar="FIRST->SECOND", default="",
                        help="instead of the split: one run per cell whose traffic is scenario "
                        "FIRST, then SECOND (e.g. 'azure-conv 1:0:0 B2048->azure-code 0:1:2 "
                        "B2048'), each for --duration")
    parser.add_argument("--profile", default="a100-llama3-8b")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = parser.parse_args()
    spec = with_auto(SLOPolicySpec(), candidates=args.candidates.split(","),
                     period_seconds=args.period, window_seconds=args.window,
                     margin=args.margin, memory=args.memory, warmup_seconds=args.warmup)
    settings = spec.scheduler.auto
    seeds = (tuple(int(s) for s in args.seeds.split(",")) if args.seeds
             else MatrixSize(split=args.split).windows)
    loads = [float(x) for x in args.loads.split(",")]
    everything = []
    for objective in args.objectives.split(","):
        if args.regime:
            first, second = (part.strip() for part in args.regime.split("->"))
            cells = regime_grid(objective, first, second, loads, args.duration, seeds,
                                spec, args.profile)
        else:
            cells = grid(objective, args.split, loads, args.duration, seeds, spec,
                         args.profile, args.scenario)
        rows = run_cells(cells, args.jobs, desc=f"auto vs fixed ({objective})")
        print(table(rows, objective, settings.candidates), flush=True)
        everything += [{**row, "objective": objective} for row in rows]
    if args.out is not None:
        args.out.write_text(json.dumps(everything, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
