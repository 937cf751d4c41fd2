"""Bench results: average over seeds, print the table, draw the plots."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

KINDS = ("latency", "deadline", "compound", "overall")


def _mean(values: list[float]) -> float:
    finite = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.fmean(finite) if finite else math.nan


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (policy, load): every metric averaged over seeds."""
    cells: dict[tuple[str, float], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        cells[(row["policy"], row["load"])].append(row)
    summary = []
    for (policy, load), group in cells.items():
        entry: dict[str, Any] = {"policy": policy, "load": load, "seeds": len(group)}
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
        summary.append(entry)
    return summary


def table(summary: list[dict[str, Any]]) -> str:
    header = (
        f"{'load':>5} {'policy':<10} {'tok_gp/s':>9} {'req_gp/s':>8} {'att_L':>6} {'att_D':>6} "
        f"{'att_C':>6} {'att':>6} {'ttft50':>7} {'ttft99':>7} {'tbt50':>6} {'tbt99':>6} "
        f"{'e2e50':>6} {'e2e99':>6} {'tok/s':>7} {'preempt':>7} {'retired':>7} {'sch_ms99':>8}"
    )
    lines = [header, "-" * len(header)]
    for e in sorted(summary, key=lambda e: (e["load"], -e["token_goodput"])):
        a = e["attainment"]
        lines.append(
            f"{e['load']:>5.2f} {e['policy']:<10} {e['token_goodput']:>9.0f} "
            f"{e['request_goodput']:>8.3f} {a['latency']:>6.3f} {a['deadline']:>6.3f} "
            f"{a['compound']:>6.3f} {a['overall']:>6.3f} "
            f"{e['ttft_s']['p50']:>7.2f} {e['ttft_s']['p99']:>7.2f} {e['tbt_s']['p50']:>6.3f} "
            f"{e['tbt_s']['p99']:>6.3f} {e['e2el_s']['p50']:>6.1f} {e['e2el_s']['p99']:>6.1f} "
            f"{e['throughput_tokens_per_s']:>7.0f} {e['preemptions']:>7.0f} {e['retired']:>7.0f} "
            f"{e['sched_ms_p99']:>8.2f}"
        )
    return "\n".join(lines)


def markdown(summary: list[dict[str, Any]]) -> str:
    """The summary as a Markdown table (for docs/benchmarks.md)."""
    header = (
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
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for e in sorted(summary, key=lambda e: (e["load"], -e["token_goodput"])):
        a = e["attainment"]
        cells = (
            f"{e['load']:.2f}",
            e["policy"],
            f"{e['token_goodput']:.0f}",
            f"{e['request_goodput']:.3f}",
            " / ".join(f"{a[k]:.3f}" for k in KINDS),
            f"{e['ttft_s']['p50']:.2f} / {e['ttft_s']['p99']:.2f}",
            f"{e['tbt_s']['p99']:.3f}",
            f"{e['e2el_s']['p50']:.1f} / {e['e2el_s']['p99']:.1f}",
            f"{e['throughput_tokens_per_s']:.0f}",
            f"{e['preemptions']:.0f}",
            f"{e['retired']:.0f}",
            f"{e['sched_ms_p99']:.2f}",
        )
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def plots(summary: list[dict[str, Any]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = sorted({e["policy"] for e in summary})
    loads = sorted({e["load"] for e in summary})
    by = {(e["policy"], e["load"]): e for e in summary}
    written = []

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for policy in policies:
        xs = [x for x in loads if (policy, x) in by]
        style = "-o" if policy.startswith("gmax") else ("--" if policy == "gmax-exact" else ":s")
        for ax, key in zip(axes, ("token_goodput", "request_goodput"), strict=True):
            ax.plot(xs, [by[(policy, x)][key] for x in xs], style, label=policy)
    axes[0].set(
        xlabel="load (x capacity)", ylabel="token goodput (tokens/s)", title="Token goodput"
    )
    axes[1].set(
        xlabel="load (x capacity)", ylabel="request goodput (requests/s)", title="Request goodput"
    )
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    path = out / "goodput_vs_load.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

    fig, axes = plt.subplots(1, len(loads), figsize=(4.5 * len(loads), 4), squeeze=False)
    width = 0.8 / max(len(policies), 1)
    for ax, load in zip(axes[0], loads, strict=True):
        for i, policy in enumerate(policies):
            if (policy, load) not in by:
                continue
            att = by[(policy, load)]["attainment"]
            ax.bar(
                [k + i * width for k in range(len(KINDS))],
                [att[k] for k in KINDS],
                width,
                label=policy,
            )
        ax.set_xticks([k + 0.4 - width / 2 for k in range(len(KINDS))], KINDS)
        ax.set(ylim=(0, 1), title=f"SLO attainment at load {load}")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    path = out / "attainment_by_kind.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    return written
