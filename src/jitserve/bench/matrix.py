"""``jitserve bench --matrix``: GMAX against the best ``-ac`` baseline and the upper bound,
over a fixed matrix of scenarios, in one command.

Who owns what: this module names the scenarios (:data:`LOADS`, :func:`scenarios`) and
the policies (GMAX, every baseline with overload control as :mod:`jitserve.bench.variants`
has them at run time, ``upper-bound``), runs them through :mod:`jitserve.bench.runner`,
and writes ``matrix.md``, ``matrix.json`` and ``matrix_heatmap.png``. Ratios come from
:func:`jitserve.bench.report.ratios`.

Two splits, kept apart (issue 16): ``validation`` is what GMAX's settings were tuned on
(the headline cell and the starved-latency cell, windows of seeds :data:`VALIDATION_SEEDS`),
``report`` is every scenario on windows of seeds :data:`REPORT_SEEDS`, never tuned on;
docs/benchmarks.md reports the second and names the first as such. A seed picks the trace
window (:func:`jitserve.sim.workload.window_offset`), so every cell samples
``len(seeds)`` different stretches of traffic. Each split runs twice: with the default
``objective: tokens`` (token goodput, per-kind attainment against ``edf-ac``) and with
``objective: requests`` for GMAX and the baselines alike (request goodput).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from jitserve.bench import report
from jitserve.bench.capacity import measure_capacity
from jitserve.bench.matrix_report import acceptance, attainment_gaps, markdown
from jitserve.bench.runner import UPPER_BOUND, Cell, admission_controlled, cell_profile, run_cells
from jitserve.bench.tenants import tenant_fairness
from jitserve.bench.variants import policy_names
from jitserve.policy import Objective, SLOPolicySpec
from jitserve.sim.workload import WorkloadSpec, parse_mix, parse_tenant_mix

LOADS = (0.6, 1.0, 1.5, 2.0)
OVERLOAD_LOADS = (1.0, 1.5, 2.0)
MIXES = ("1:1:1", "2:1:0", "0:1:2", "1:0:0")
TRACES = ("azure-conv", "azure-code")
BUDGETS = (2048, 8192)
TENANT_SKEW = "a=3,b=1,c=1"
DURATION_S = 240.0
VALIDATION_SEEDS = (1, 2, 3)
REPORT_SEEDS = (101, 102, 103)
SPLITS = ("report", "validation")
BOUND_SLOT_S = 4.0
"""Coarser than the bench's 2 s: the LPs are ~2x smaller and the bound ~0.2% looser."""


@dataclass(frozen=True)
class MatrixSize:
    """How much of the matrix to run (docs/benchmarks.md names the sizes it used)."""

    split: str = "report"
    duration_s: float = DURATION_S
    loads: tuple[float, ...] = LOADS
    bound: bool = True
    seeds: tuple[int, ...] = field(default=())
    """Empty: the split's own seeds."""

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"unknown split {self.split!r}; known: {', '.join(SPLITS)}")

    @property
    def windows(self) -> tuple[int, ...]:
        if self.seeds:
            return self.seeds
        return REPORT_SEEDS if self.split == "report" else VALIDATION_SEEDS


@dataclass(frozen=True)
class Scenario:
    trace: str
    mix: str
    budget: int
    tenant_mix: str | None = None
    slots: int | None = None

    @property
    def name(self) -> str:
        skew = f" tenants {self.tenant_mix}" if self.tenant_mix else ""
        slots = f" S{self.slots}" if self.slots else ""
        return f"{self.trace} {self.mix} B{self.budget}{slots}{skew}"

    @property
    def overrides(self) -> tuple[tuple[str, float], ...]:
        slots = (("max_running", self.slots),) if self.slots else ()
        return (("chunk_token_budget", self.budget), *slots)

    def workload(self, spec: SLOPolicySpec, duration_s: float = DURATION_S) -> WorkloadSpec:
        workload = WorkloadSpec(
            trace=self.trace, mix=parse_mix(self.mix), duration_s=duration_s, slo=spec.slo_defaults
        )
        if self.tenant_mix:
            tenants, demand = parse_tenant_mix(self.tenant_mix)
            workload = replace(workload, tenants=tenants, tenant_demand=demand)
        return workload


def scenarios(split: str = "report") -> list[Scenario]:
    """``report``: every mix on both traces at the default budget; the other budget and
    skewed tenant demand on the headline mix. ``validation``: the headline cell and the
    cell where GMAX starved latency work (32 slots, budget 1024)."""
    if split == "validation":
        return [
            Scenario(TRACES[0], MIXES[0], BUDGETS[0]),
            Scenario(TRACES[0], MIXES[0], 1024, slots=32),
        ]
    grid = [Scenario(trace, mix, BUDGETS[0]) for trace in TRACES for mix in MIXES]
    grid += [Scenario(trace, MIXES[0], BUDGETS[1]) for trace in TRACES]
    grid.append(Scenario(TRACES[0], MIXES[0], BUDGETS[0], TENANT_SKEW))
    return grid


def matrix_policies(bound: bool = True) -> list[str]:
    """GMAX, the overload-controlled baselines (the raw ones until the bench has ``-ac``
    variants), and the upper bound."""
    baselines = admission_controlled()
    if not baselines:
        baselines, _ = report.best_baseline(set(policy_names()))
    return ["gmax", *baselines, *([UPPER_BOUND] if bound else [])]


def cells(
    spec: SLOPolicySpec, profile: str, size: MatrixSize | None = None
) -> tuple[list[Cell], dict[str, float]]:
    size = size or MatrixSize()
    policies = matrix_policies(size.bound)
    out: list[Cell] = []
    capacities: dict[str, float] = {}
    for scenario in scenarios(size.split):
        overrides = scenario.overrides
        workload = scenario.workload(spec, size.duration_s)
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
            for load in size.loads
            for policy in policies
            for seed in size.windows
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
        figures = tenant_fairness(entry, spec.fairness.weight_of)
        max_min = {r["tenant"]: r["max_min_share"] for r in figures[0]} if figures else {}
        for (tenant, tokens), wanted in zip(sorted(by_tenant.items()), demand, strict=False):
            rows.append(
                {
                    "scenario": entry["scenario"],
                    "load": entry["load"],
                    "policy": entry["policy"],
                    "tenant": tenant,
                    "demand_share": wanted,
                    "entitlement": weights[tenant] / sum(weights.values()),
                    "max_min_share": max_min.get(tenant, math.nan),
                    "goodput_share": tokens / total,
                    "jain_index": figures[1] if figures else math.nan,
                }
            )
    return rows


def main(spec: SLOPolicySpec, out: Path, jobs: int, profile: str, size: MatrixSize) -> int:
    objectives = {
        "tokens": spec.model_copy(update={"objective": Objective.TOKENS}),
        "requests": spec.model_copy(update={"objective": Objective.REQUESTS}),
    }
    print(
        f"matrix ({size.split} split): {len(scenarios(size.split))} scenarios x "
        f"{len(size.loads)} loads x {len(matrix_policies(size.bound))} policies x "
        f"{len(size.windows)} windows x {len(objectives)} objectives, {size.duration_s:.0f} s each",
        flush=True,
    )
    runs: dict[str, list[dict[str, Any]]] = {}
    for objective, objective_spec in objectives.items():
        grid, capacities = cells(objective_spec, profile, size)
        runs[objective] = rows = run_cells(grid, jobs, desc=f"matrix ({objective})")
        for row in rows:
            row["objective"] = objective
    summaries = {objective: report.summarize(rows) for objective, rows in runs.items()}
    token_ratios = report.ratios(summaries["tokens"])
    request_ratios = report.ratios(summaries["requests"])
    gaps = attainment_gaps(summaries["tokens"])
    shares = tenant_shares(summaries["tokens"], token_ratios, spec)
    verdict = acceptance(token_ratios, request_ratios, gaps)
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "split": size.split,
        "loads": list(size.loads),
        "duration_s": size.duration_s,
        "seeds": list(size.windows),
        "profile": profile,
        "policies": matrix_policies(size.bound),
        "capacity_items_per_s": capacities,
    }
    document = {
        "meta": meta,
        "runs": [row for rows in runs.values() for row in rows],
        "summary": summaries,
        "ratios": {"tokens": token_ratios, "requests": request_ratios},
        "attainment_vs_edf_ac": gaps,
        "acceptance": verdict,
        "tenant_shares": shares,
    }
    (out / "matrix.json").write_text(json.dumps(document, indent=2))
    text = markdown(token_ratios, request_ratios, gaps, verdict, shares, capacities)
    (out / "matrix.md").write_text(text + "\n")
    print(text)
    try:
        print(f"wrote {heatmap(token_ratios, out / 'matrix_heatmap.png')}")
    except ImportError as err:
        print(f"heatmap skipped: {err.name} is not installed (pip install 'jitserve[bench]')")
    print(f"wrote {out / 'matrix.json'} and {out / 'matrix.md'}")
    return 0


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
