"""Bench results: average over seeds, print the table and the GMAX ratios, draw the plots."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from jitserve.tuning.tuner import AUTO

KINDS = ("latency", "deadline", "compound", "overall")
UPPER_BOUND = "upper-bound"
EXACT_NAMES = ("gmax-exact", "oracle")


def _mean(values: list[float]) -> float:
    finite = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.fmean(finite) if finite else math.nan


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (scenario, policy, load): every metric averaged over seeds."""
    cells: dict[tuple[str, str, float], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        cells[(row.get("scenario", ""), row["policy"], row["load"])].append(row)
    summary = []
    for (scenario, policy, load), group in cells.items():
        entry: dict[str, Any] = {
            "scenario": scenario,
            "policy": policy,
            "load": load,
            "seeds": len(group),
        }
        for key in (
            "token_goodput",
            "request_goodput",
            "throughput_tokens_per_s",
            "output_tokens_per_s",
            "preemptions",
            "retired",
            "sched_ms_p99",
            "wall_s",
        ):
            entry[key] = _mean([r[key] for r in group])
        entry["attainment"] = {
            k: _mean([r["attainment"].get(k, math.nan) for r in group]) for k in KINDS
        }
        for metric in ("ttft_s", "tbt_s", "e2el_s"):
            entry[metric] = {q: _mean([r[metric][q] for r in group]) for q in ("p50", "p99")}
        tenants = sorted({t for r in group for field in ("goodput_tokens_by_tenant",
                                                         "demand_tokens_by_tenant")
                          for t in r.get(field, {})})
        for field in ("goodput_tokens_by_tenant", "demand_tokens_by_tenant"):
            entry[field] = {t: _mean([r.get(field, {}).get(t, 0) for r in group])
                            for t in tenants}
        summary.append(entry)
    return summary


def best_baseline(names: set[str]) -> tuple[list[str], str]:
    """The baselines GMAX's headline is against: those with overload control (``-ac``)
    when the bench has them, else the raw ones; and how to call them in a table."""
    controlled = sorted(n for n in names if n.endswith("-ac"))
    if controlled:
        return controlled, "best -ac baseline"
    raw = sorted(
        n for n in names
        if not n.startswith("gmax") and n not in (*EXACT_NAMES, UPPER_BOUND, AUTO)
    )
    return raw, "best baseline (no -ac variants in this run)"


def ratios(summary: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (scenario, load): GMAX's token and request goodput over the best baseline's
    (each metric's own best) and over the upper bound."""
    by = {(e["scenario"], e["load"], e["policy"]): e for e in summary}
    names = {e["policy"] for e in summary}
    baselines, label = best_baseline(names)
    out = []
    for scenario, load in sorted({(e["scenario"], e["load"]) for e in summary}):
        gmax = by.get((scenario, load, "gmax"))
        if gmax is None:
            continue
        entry: dict[str, Any] = {"scenario": scenario, "load": load, "baselines": label}
        for metric in ("token_goodput", "request_goodput"):
            present = [by[(scenario, load, b)] for b in baselines if (scenario, load, b) in by]
            if present:
                best = max(present, key=lambda e: e[metric])
                entry[f"{metric}_best_baseline"] = best["policy"]
                entry[f"{metric}_vs_baseline"] = _ratio(gmax[metric], best[metric])
            bound = by.get((scenario, load, UPPER_BOUND))
            if bound is not None:
                entry[f"{metric}_vs_bound"] = _ratio(gmax[metric], bound[metric])
        out.append(entry)
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan


def ratios_markdown(summary: list[dict[str, Any]]) -> str:
    return ratios_markdown_rows(ratios(summary))


def ratios_markdown_rows(rows: list[dict[str, Any]]) -> str:
    """The :func:`ratios` rows as a Markdown table."""
    if not rows:
        return ""
    label = rows[0]["baselines"]
    lines = [
        f"| scenario | load | GMAX / {label} (tokens) | (requests) | GMAX / upper-bound "
        "(tokens) | (requests) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [r["scenario"] or "-", f"{r['load']:.2f}"]
        for metric in ("token_goodput", "request_goodput"):
            value = r.get(f"{metric}_vs_baseline", math.nan)
            who = r.get(f"{metric}_best_baseline", "")
            cells.append(f"{_num(value, '.3f')} ({who})" if who else "-")
        for metric in ("token_goodput", "request_goodput"):
            cells.append(_num(r.get(f"{metric}_vs_bound", math.nan), ".3f"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _num(value: float | None, fmt: str, width: int = 0) -> str:
    """A number, or "-" where there is none (e.g. the upper bound's latencies)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return f"{'-':>{width}}"
    return f"{value:>{width}{fmt}}"


TABLE_LEGEND = (
    "tok_gp/s: token goodput, tokens/s; req_gp/s: request goodput, requests/s; "
    "att_L / att_D / att_C / att: SLO attainment (0-1) of latency / deadline / compound "
    "requests / all; ttft, tbt, e2e: p50 and p99, seconds; tok/s: output throughput, "
    "tokens/s; preempt: preemptions; retired: requests retired by overload control; "
    "sch_ms99: the scheduler's decision time p99, ms; '-': not measured"
)


def table(summary: list[dict[str, Any]]) -> str:
    """The summary as an aligned text table (columns as wide as the longest policy name),
    with the legend of its columns and units under it."""
    width = max([12, *(len(str(e["policy"])) for e in summary)])
    header = (
        f"{'load':>5} {'policy':<{width}} {'tok_gp/s':>9} {'req_gp/s':>8} {'att_L':>6} "
        f"{'att_D':>6} {'att_C':>6} {'att':>6} {'ttft50':>7} {'ttft99':>7} {'tbt50':>6} "
        f"{'tbt99':>6} {'e2e50':>6} {'e2e99':>6} {'tok/s':>7} {'preempt':>7} {'retired':>7} "
        f"{'sch_ms99':>8}"
    )
    lines = []
    for scenario in sorted({e["scenario"] for e in summary}):
        if scenario:
            lines.append(f"scenario: {scenario}")
        lines.extend([header, "-" * len(header)])
        picked = [e for e in summary if e["scenario"] == scenario]
        for e in sorted(picked, key=lambda e: (e["load"], -e["token_goodput"])):
            a = e["attainment"]
            lines.append(
                f"{e['load']:>5.2f} {e['policy']:<{width}} {e['token_goodput']:>9.0f} "
                f"{e['request_goodput']:>8.3f} "
                + " ".join(_num(a.get(k), ".3f", 6) for k in KINDS)
                + f" {_num(e['ttft_s']['p50'], '.2f', 7)} {_num(e['ttft_s']['p99'], '.2f', 7)}"
                f" {_num(e['tbt_s']['p50'], '.3f', 6)} {_num(e['tbt_s']['p99'], '.3f', 6)}"
                f" {_num(e['e2el_s']['p50'], '.1f', 6)} {_num(e['e2el_s']['p99'], '.1f', 6)}"
                f" {_num(e['throughput_tokens_per_s'], '.0f', 7)}"
                f" {_num(e['preemptions'], '.0f', 7)} {_num(e['retired'], '.0f', 7)}"
                f" {_num(e['sched_ms_p99'], '.2f', 8)}"
            )
    if summary:
        lines.append(TABLE_LEGEND)
    return "\n".join(lines)


def markdown(summary: list[dict[str, Any]]) -> str:
    """The summary as a Markdown table (for docs/benchmarks.md)."""
    header: tuple[str, ...] = (
        "load",
        "policy",
        "token goodput (tok/s)",
        "request goodput (req/s)",
        "attainment L / D / C / all",
        "TTFT p50 / p99 (s)",
        "TBT p99 (s)",
        "E2EL p50 / p99 (s)",
        "throughput (tok/s)",
        "preemptions",
        "retired",
        "sched p99 (ms)",
    )
    scenarios = sorted({e["scenario"] for e in summary})
    if any(scenarios):
        header = ("scenario", *header)
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for e in sorted(summary, key=lambda e: (e["scenario"], e["load"], -e["token_goodput"])):
        a = e["attainment"]
        cells: tuple[str, ...] = (
            f"{e['load']:.2f}",
            e["policy"],
            f"{e['token_goodput']:.0f}",
            f"{e['request_goodput']:.3f}",
            " / ".join(_num(a.get(k), ".3f") for k in KINDS),
            f"{_num(e['ttft_s']['p50'], '.2f')} / {_num(e['ttft_s']['p99'], '.2f')}",
            _num(e["tbt_s"]["p99"], ".3f"),
            f"{_num(e['e2el_s']['p50'], '.1f')} / {_num(e['e2el_s']['p99'], '.1f')}",
            _num(e["throughput_tokens_per_s"], ".0f"),
            _num(e["preemptions"], ".0f"),
            _num(e["retired"], ".0f"),
            _num(e["sched_ms_p99"], ".2f"),
        )
        if any(scenarios):
            cells = (e["scenario"], *cells)
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


MARKERS = "osD^v<>pXh*P"
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896",
           "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5", "#393b79")
"""Twenty distinct colours (matplotlib's tab10 then tab20's light ones, and one more)."""


def policy_styles(policies: list[str]) -> dict[str, dict[str, str]]:
    """A colour, marker and line style per policy, no two policies alike: the upper bound
    black dashed, exact variants dashed, GMAX solid, baselines dotted."""
    styles = {}
    for i, policy in enumerate(policies):
        line = "--" if policy in EXACT_NAMES else "-" if policy.startswith("gmax") else ":"
        styles[policy] = {"color": PALETTE[i % len(PALETTE)], "marker": MARKERS[i % len(MARKERS)],
                          "linestyle": line}
        if policy == UPPER_BOUND:
            styles[policy] = {"color": "black", "marker": "", "linestyle": "--"}
    return styles


def plots(summary: list[dict[str, Any]], out: Path) -> list[Path]:
    """goodput_vs_load.png and attainment_by_kind.png; the legends outside the axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = sorted({e["policy"] for e in summary})
    loads = sorted({e["load"] for e in summary})
    by = {(e["policy"], e["load"]): e for e in summary}
    styles = policy_styles(policies)
    written = []

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for policy in policies:
        xs = [x for x in loads if (policy, x) in by]
        for ax, key in zip(axes, ("token_goodput", "request_goodput"), strict=True):
            ax.plot(xs, [by[(policy, x)][key] for x in xs], label=policy, markersize=5,
                    **styles[policy])
    axes[0].set(
        xlabel="load (x capacity)", ylabel="token goodput (tokens/s)", title="Token goodput"
    )
    axes[1].set(
        xlabel="load (x capacity)", ylabel="request goodput (requests/s)", title="Request goodput"
    )
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.tight_layout()
    path = out / "goodput_vs_load.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    written.append(path)

    policies = [p for p in policies if p != UPPER_BOUND]  # a bound has no per-kind attainment
    fig, axes = plt.subplots(1, len(loads), figsize=(4.5 * len(loads), 4), squeeze=False)
    width = 0.8 / max(len(policies), 1)
    for ax, load in zip(axes[0], loads, strict=True):
        for i, policy in enumerate(policies):
            if (policy, load) not in by:
                continue
            att = by[(policy, load)]["attainment"]
            ax.bar(
                [k + i * width for k in range(len(KINDS))],
                [att.get(k, math.nan) for k in KINDS],
                width,
                label=policy,
                color=styles[policy]["color"],
            )
        ax.set_xticks([k + 0.4 - width / 2 for k in range(len(KINDS))], KINDS)
        ax.set(ylim=(0, 1), title=f"SLO attainment at load {load}")
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.tight_layout()
    path = out / "attainment_by_kind.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    written.append(path)
    return written
