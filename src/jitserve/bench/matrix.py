"""``jitserve bench --matrix``: GMAX against the best ``-ac`` baseline and the upper bound,
over a fixed matrix of scenarios, in one command.

Who owns what: this module names the scenarios (:data:`LOADS`, :func:`scenarios`) and
the policies (GMAX, every baseline with overload control as :mod:`jitserve.bench.variants`
has them at run time, ``upper-bound``), runs them through :mod:`jitserve.bench.runner`,
and writes ``matrix.md``, ``matrix.json`` and ``matrix_heatmap.png``. Ratios come from
:func:`jitserve.bench.report.ratios`.

The matrix is sized for a 2-core machine (~20-30 CPU minutes with ``--jobs 1``): every
scenario replays :data:`DURATION_S` seconds of arrivals with seeds 1 and 2 at each load.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from jitserve.bench import report
from jitserve.bench.capacity import measure_capacity
from jitserve.bench.runner import UPPER_BOUND, Cell, admission_controlled, cell_profile, run_cells
from jitserve.bench.variants import policy_names
from jitserve.policy import SLOPolicySpec
from jitserve.sim.workload import WorkloadSpec, parse_mix, parse_tenant_mix

LOADS = (0.6, 1.0, 1.5, 2.0)
MIXES = ("1:1:1", "2:1:0", "0:1:2", "1:0:0")
TRACES = ("azure-conv", "azure-code")
BUDGETS = (2048, 8192)
TENANT_SKEW = "a=3,b=1,c=1"
DURATION_S = 240.0
SEEDS = (1, 2)
BOUND_SLOT_S = 4.0
"""Coarser than the bench's 2 s: the LPs are ~2x smaller and the bound ~0.2% looser."""


@dataclass(frozen=True)
class Scenario:
    trace: str
    mix: str
    budget: int
    tenant_mix: str | None = None

    @property
    def name(self) -> str:
        skew = f" tenants {self.tenant_mix}" if self.tenant_mix else ""
        return f"{self.trace} {self.mix} B{self.budget}{skew}"

    def workload(self, spec: SLOPolicySpec) -> WorkloadSpec:
        workload = WorkloadSpec(
            trace=self.trace, mix=parse_mix(self.mix), duration_s=DURATION_S, slo=spec.slo_defaults
        )
        if self.tenant_mix:
            tenants, demand = parse_tenant_mix(self.tenant_mix)
            workload = replace(workload, tenants=tenants, tenant_demand=demand)
        return workload


def scenarios() -> list[Scenario]:
    """Every mix on both traces at the default budget; the other budget and skewed tenant
    demand on the headline mix."""
    grid = [Scenario(trace, mix, BUDGETS[0]) for trace in TRACES for mix in MIXES]
    grid += [Scenario(trace, MIXES[0], BUDGETS[1]) for trace in TRACES]
    grid.append(Scenario(TRACES[0], MIXES[0], BUDGETS[0], TENANT_SKEW))
    return grid


def matrix_policies() -> list[str]:
    """GMAX, the overload-controlled baselines (the raw ones until the bench has ``-ac``
    variants), and the upper bound."""
    baselines = admission_controlled()
    if not baselines:
        baselines, _ = report.best_baseline(set(policy_names()))
    return ["gmax", *baselines, UPPER_BOUND]


def cells(spec: SLOPolicySpec, profile: str) -> tuple[list[Cell], dict[str, float]]:
    policies = matrix_policies()
    out: list[Cell] = []
    capacities: dict[str, float] = {}
    for scenario in scenarios():
        overrides = (("chunk_token_budget", scenario.budget),)
        workload = scenario.workload(spec)
        capacity = measure_capacity(cell_profile(profile, overrides), workload)
        capacities[scenario.name] = capacity
        out += [
            Cell(
                policy,
                load,
                seed,
                workload,
                capacity,
                profile,
                spec,
                profile_overrides=overrides,
                scenario=scenario.name,
                bound_slot_s=BOUND_SLOT_S,
            )
            for load in LOADS
            for policy in policies
            for seed in SEEDS
        ]
    return out, capacities


def tenant_shares(
    summary: list[dict[str, Any]], ratios: list[dict[str, Any]], spec: SLOPolicySpec
) -> list[dict[str, Any]]:
    """Goodput share per tenant in the skewed scenarios, beside demand and entitlement,
    for GMAX and the baseline with the best token goodput there."""
    best = {(r["scenario"], r["load"]): r.get("token_goodput_best_baseline") for r in ratios}
    rows = []
    for entry in summary:
        by_tenant = entry.get("goodput_tokens_by_tenant") or {}
        total = sum(by_tenant.values())
        if not total or "tenants" not in entry["scenario"]:
            continue
        if entry["policy"] not in ("gmax", best.get((entry["scenario"], entry["load"]))):
            continue
        weights = {t: spec.fairness.weight_of(t) for t in by_tenant}
        _, demand = parse_tenant_mix(entry["scenario"].split("tenants ")[1])
        for (tenant, tokens), wanted in zip(sorted(by_tenant.items()), demand, strict=False):
            rows.append(
                {
                    "scenario": entry["scenario"],
                    "load": entry["load"],
                    "policy": entry["policy"],
                    "tenant": tenant,
                    "demand_share": wanted,
                    "entitlement": weights[tenant] / sum(weights.values()),
                    "goodput_share": tokens / total,
                }
            )
    return rows


def main(spec: SLOPolicySpec, out: Path, jobs: int, profile: str) -> int:
    grid, capacities = cells(spec, profile)
    print(
        f"matrix: {len(scenarios())} scenarios x {len(LOADS)} loads x "
        f"{len(matrix_policies())} policies, {DURATION_S:.0f} s each",
        flush=True,
    )
    rows = run_cells(grid, jobs, desc="matrix")
    summary = report.summarize(rows)
    ratios = report.ratios(summary)
    shares = tenant_shares(summary, ratios, spec)
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "loads": list(LOADS),
        "duration_s": DURATION_S,
        "seeds": list(SEEDS),
        "profile": profile,
        "policies": matrix_policies(),
        "capacity_items_per_s": capacities,
    }
    document = {
        "meta": meta,
        "runs": rows,
        "summary": summary,
        "ratios": ratios,
        "tenant_shares": shares,
    }
    (out / "matrix.json").write_text(json.dumps(document, indent=2))
    text = markdown(ratios, shares, capacities)
    (out / "matrix.md").write_text(text + "\n")
    print(text)
    try:
        print(f"wrote {heatmap(ratios, out / 'matrix_heatmap.png')}")
    except ImportError as err:
        print(f"heatmap skipped: {err.name} is not installed (pip install 'jitserve[bench]')")
    print(f"wrote {out / 'matrix.json'} and {out / 'matrix.md'}")
    return 0


def markdown(
    ratios: list[dict[str, Any]], shares: list[dict[str, Any]], capacities: dict[str, float]
) -> str:
    parts = [report.ratios_markdown_rows(ratios)]
    overload = [r for r in ratios if r["load"] >= 1.0 and "token_goodput_vs_baseline" in r]
    if overload:
        token = [r["token_goodput_vs_baseline"] for r in overload]
        request = [r["request_goodput_vs_baseline"] for r in overload]
        below = sum(t < 0.98 for t in token), sum(r < 0.98 for r in request)
        parts.append(
            f"Overload cells (load >= 1.0): {len(overload)}; GMAX / {overload[0]['baselines']}, "
            f"below 0.98x: {below[0]} (tokens), {below[1]} (requests); tokens: "
            f"min {min(token):.3f}, geometric mean {_geomean(token):.3f}; requests: "
            f"min {min(request):.3f}, geometric mean {_geomean(request):.3f}."
        )
    if shares:
        lines = [
            "| scenario | load | policy | tenant | demand | entitlement | goodput share |",
            "|---|---|---|---|---|---|---|",
        ]
        for s in shares:
            lines.append(
                f"| {s['scenario']} | {s['load']:.2f} | {s['policy']} | {s['tenant']} | "
                f"{s['demand_share']:.2f} | {s['entitlement']:.2f} | {s['goodput_share']:.3f} |"
            )
        parts.append("\n".join(lines))
    parts.append(
        "Capacity (load 1.0, work items/s): "
        + "; ".join(f"{name}: {value:.3f}" for name, value in capacities.items())
    )
    return "\n\n".join(parts)


def _geomean(values: list[float]) -> float:
    finite = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in finite) / len(finite)) if finite else math.nan


def heatmap(ratios: list[dict[str, Any]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = list(dict.fromkeys(r["scenario"] for r in ratios))
    loads = sorted({r["load"] for r in ratios})
    panels = (
        ("token_goodput_vs_baseline", f"GMAX / {ratios[0]['baselines']} (token goodput)", 2.0),
        ("token_goodput_vs_bound", "GMAX / upper-bound (token goodput)", 1.0),
    )
    fig, axes = plt.subplots(1, 2, figsize=(13, 0.45 * len(names) + 2), squeeze=False)
    for ax, (key, title, top) in zip(axes[0], panels, strict=True):
        grid = np.full((len(names), len(loads)), np.nan)
        for r in ratios:
            grid[names.index(r["scenario"]), loads.index(r["load"])] = r.get(key, np.nan)
        image = ax.imshow(grid, cmap="RdYlGn", vmin=0.0, vmax=top, aspect="auto")
        for (i, j), value in np.ndenumerate(grid):
            if not np.isnan(value):
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(loads)), [f"{x:g}" for x in loads])
        ax.set_yticks(range(len(names)), names, fontsize=8)
        ax.set(xlabel="load (x capacity)", title=title)
        fig.colorbar(image, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
