"""The scenario matrix's verdict: what :mod:`jitserve.bench.matrix` writes into
``matrix.md`` and checks against issue 16's acceptance lines.

Who owns what: :func:`attainment_gaps` compares GMAX's per-kind SLO attainment with
``edf-ac``'s in each cell (the default objective); :func:`acceptance` reads the token
ratios (default objective), the request ratios (``objective: requests`` for every policy)
and those gaps over the overload cells (load >= 1.0); :func:`markdown` prints them.
Ratios themselves come from :func:`jitserve.bench.report.ratios`.
"""

from __future__ import annotations

import math
from typing import Any

KINDS = ("latency", "deadline", "compound")
REFERENCE = "edf-ac"
OVERLOAD = 1.0
CELL_FLOOR = 0.98
GEOMEAN_TARGET = 1.15
ATTAINMENT_SLACK = 0.05


def attainment_gaps(summary: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (scenario, load): GMAX's attainment minus ``edf-ac``'s for each kind present,
    and the worst of them."""
    by = {(e["scenario"], e["load"], e["policy"]): e for e in summary}
    out = []
    for scenario, load in sorted({(e["scenario"], e["load"]) for e in summary}):
        gmax, ref = by.get((scenario, load, "gmax")), by.get((scenario, load, REFERENCE))
        if gmax is None or ref is None:
            continue
        gaps = {
            kind: gmax["attainment"][kind] - ref["attainment"][kind]
            for kind in KINDS
            if not math.isnan(ref["attainment"].get(kind, math.nan))
            and not math.isnan(gmax["attainment"].get(kind, math.nan))
        }
        worst = min(gaps, key=lambda k: gaps[k]) if gaps else ""
        out.append(
            {
                "scenario": scenario,
                "load": load,
                "gaps": gaps,
                "gmax": {k: gmax["attainment"][k] for k in gaps},
                "edf_ac": {k: ref["attainment"][k] for k in gaps},
                "worst_kind": worst,
                "worst_gap": gaps[worst] if worst else math.nan,
            }
        )
    return out


def acceptance(
    token_ratios: list[dict[str, Any]],
    request_ratios: list[dict[str, Any]],
    gaps: list[dict[str, Any]],
) -> dict[str, Any]:
    """The acceptance lines over the overload cells: every cell >= 0.98x on tokens and on
    requests, >= 1.15x geometric mean on tokens, no kind > 0.05 below ``edf-ac``."""
    tokens = [r["token_goodput_vs_baseline"] for r in _overload(token_ratios)]
    requests = [r["request_goodput_vs_baseline"] for r in _overload(request_ratios)]
    worst = [g["worst_gap"] for g in _overload(gaps) if not math.isnan(g["worst_gap"])]
    return {
        "overload_cells": len(tokens),
        "tokens_below_floor": sum(t < CELL_FLOOR for t in tokens),
        "requests_below_floor": sum(r < CELL_FLOOR for r in requests),
        "tokens_min": min(tokens, default=math.nan),
        "requests_min": min(requests, default=math.nan),
        "tokens_geomean": geomean(tokens),
        "requests_geomean": geomean(requests),
        "attainment_cells_beyond_slack": sum(w < -ATTAINMENT_SLACK for w in worst),
        "attainment_worst_gap": min(worst, default=math.nan),
        "met": {
            "every_cell_tokens": bool(tokens) and min(tokens) >= CELL_FLOOR,
            "every_cell_requests": bool(requests) and min(requests) >= CELL_FLOOR,
            "geomean_tokens": geomean(tokens) >= GEOMEAN_TARGET,
            "attainment": bool(worst) and min(worst) >= -ATTAINMENT_SLACK,
        },
    }


def markdown(
    token_ratios: list[dict[str, Any]],
    request_ratios: list[dict[str, Any]],
    gaps: list[dict[str, Any]],
    verdict: dict[str, Any],
    shares: list[dict[str, Any]],
    capacities: dict[str, float],
) -> str:
    requests = {(r["scenario"], r["load"]): r for r in request_ratios}
    attainment = {(g["scenario"], g["load"]): g for g in gaps}
    lines = [
        "| scenario | load | tokens: GMAX / best -ac | requests (objective: requests) | "
        "worst kind vs edf-ac (attainment GMAX / edf-ac) | GMAX / bound (tokens) |",
        "|---|---|---|---|---|---|",
    ]
    for r in token_ratios:
        key = (r["scenario"], r["load"])
        q, g = requests.get(key, {}), attainment.get(key)
        kind = g["worst_kind"] if g else ""
        gap = (
            f"{kind} {g['worst_gap']:+.3f} ({g['gmax'][kind]:.3f} / {g['edf_ac'][kind]:.3f})"
            if g and kind
            else "-"
        )
        lines.append(
            f"| {r['scenario']} | {r['load']:.2f} | {_ratio(r, 'token_goodput')} | "
            f"{_ratio(q, 'request_goodput')} | {gap} | "
            f"{_num(r.get('token_goodput_vs_bound', math.nan))} |"
        )
    v = verdict
    met = v["met"]
    parts = [
        "\n".join(lines),
        "\n".join([
            f"Overload cells (load >= 1.0): {v['overload_cells']}.",
            "",
            "| GMAX / best -ac baseline | cells below 0.98x | min | geometric mean |",
            "|---|---|---|---|",
            f"| token goodput (default objective) | {v['tokens_below_floor']} | "
            f"{v['tokens_min']:.3f} | {v['tokens_geomean']:.3f} |",
            f"| request goodput (objective: requests) | {v['requests_below_floor']} | "
            f"{v['requests_min']:.3f} | {v['requests_geomean']:.3f} |",
            "",
            f"Targets: geometric mean on tokens >= 1.15: {_yes(met['geomean_tokens'])}; every "
            f"cell >= 0.98x: tokens {_yes(met['every_cell_tokens'])}, requests "
            f"{_yes(met['every_cell_requests'])}. Per-kind attainment more than 0.05 below "
            f"edf-ac's in {v['attainment_cells_beyond_slack']} cells (worst "
            f"{v['attainment_worst_gap']:+.3f}): {_yes(met['attainment'])}.",
        ]),
    ]
    if shares:
        rows = [
            "| scenario | load | policy | tenant | demand | entitlement | max-min share "
            "| goodput share | Jain's index |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for s in shares:
            rows.append(
                f"| {s['scenario']} | {s['load']:.2f} | {s['policy']} | {s['tenant']} | "
                f"{s['demand_share']:.2f} | {s['entitlement']:.2f} | "
                f"{s['max_min_share']:.3f} | {s['goodput_share']:.3f} | {s['jain_index']:.3f} |"
            )
        parts.append("\n".join(rows))
    parts.append(
        "Capacity (load 1.0, work items/s): "
        + "; ".join(f"{name}: {value:.3f}" for name, value in capacities.items())
    )
    return "\n\n".join(parts)


def geomean(values: list[float]) -> float:
    finite = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in finite) / len(finite)) if finite else math.nan


def _overload(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["load"] >= OVERLOAD and _has(r)]


def _has(r: dict[str, Any]) -> bool:
    return "token_goodput_vs_baseline" in r or "worst_gap" in r


def _ratio(r: dict[str, Any], metric: str) -> str:
    value, who = r.get(f"{metric}_vs_baseline"), r.get(f"{metric}_best_baseline")
    return f"{value:.3f} ({who})" if value is not None and who else "-"


def _num(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.3f}"


def _yes(flag: bool) -> str:
    return "met" if flag else "not met"
