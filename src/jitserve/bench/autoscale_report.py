"""The autoscaling bench's table, JSON and plot (:mod:`jitserve.bench.autoscale`'s rows).

Per shape and strategy, over the seeds: replica-seconds, goodput, attainment (pooled over
the seeds: met / ended) overall and by kind, and the count changes; then jitserve's
planner against the KEDA rule (attainment, replica-seconds) and against the static-peak
deployment (goodput, replica-seconds) — the issue's acceptance figures.
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import mean
from typing import Any

from jitserve.bench.autoscale import KEDA, PLANNER, STATIC_PEAK, STRATEGIES
from jitserve.slo import SLOKind


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for shape in dict.fromkeys(r["shape"] for r in rows):
        for strategy in STRATEGIES:
            runs = [r for r in rows if r["shape"] == shape and r["strategy"] == strategy]
            if not runs:
                continue
            kinds = {k.value: mean(r["attainment_by_kind"].get(k.value, float("nan"))
                                   for r in runs) for k in SLOKind}  # fmt: skip
            out.append({
                "shape": shape, "strategy": strategy, "seeds": len(runs),
                "replicas": runs[0]["start_replicas"] if strategy.startswith("static") else None,
                "replica_seconds": mean(r["replica_seconds"] for r in runs),
                "mean_replicas": mean(r["mean_replicas"] for r in runs),
                "max_replicas": max(r["max_replicas"] for r in runs),
                "token_goodput": mean(r["token_goodput"] for r in runs),
                "request_goodput": mean(r["request_goodput"] for r in runs),
                "attainment": sum(r["met"] for r in runs)
                / max(sum(r["requests"] for r in runs), 1),
                "attainment_by_kind": kinds,
                "changes": mean(r["changes"] for r in runs),
            })  # fmt: skip
    return out


def verdicts(summary: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per shape: the planner against the KEDA rule and against static-peak."""
    out = []
    by = {(s["shape"], s["strategy"]): s for s in summary}
    for shape in dict.fromkeys(s["shape"] for s in summary):
        mine, keda, peak = by.get((shape, PLANNER)), by.get((shape, KEDA)), by.get(
            (shape, STATIC_PEAK)
        )
        if mine is None:
            continue
        entry: dict[str, Any] = {"shape": shape}
        if keda is not None:
            entry["attainment_minus_keda"] = mine["attainment"] - keda["attainment"]
            entry["replica_seconds_vs_keda"] = mine["replica_seconds"] / keda["replica_seconds"]
        if peak is not None:
            entry["token_goodput_vs_peak"] = mine["token_goodput"] / peak["token_goodput"]
            entry["request_goodput_vs_peak"] = mine["request_goodput"] / peak["request_goodput"]
            entry["replica_seconds_vs_peak"] = mine["replica_seconds"] / peak["replica_seconds"]
        out.append(entry)
    return out


def markdown(meta: dict[str, Any], summary: list[dict[str, Any]]) -> str:
    lines = [
        f"trace {meta['trace']}, {meta['duration_s']:g} s, peak {meta['peak_replicas']:g} "
        f"replicas' capacity ({meta['peak_rate_per_s']:.2f} items/s), warm-up "
        f"{meta['warmup_s']:g} s, target attainment {meta['target_attainment']:g}, seeds "
        f"{','.join(str(s) for s in meta['seeds'])}",
        "",
        "| shape | strategy | replica-s | mean replicas | max | tok goodput/s | req goodput/s "
        "| attainment | latency | deadline | compound | changes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        k = s["attainment_by_kind"]
        lines.append(
            f"| {s['shape']} | {s['strategy']} | {s['replica_seconds']:.0f} | "
            f"{s['mean_replicas']:.2f} | {s['max_replicas']} | {s['token_goodput']:.0f} | "
            f"{s['request_goodput']:.3f} | {s['attainment']:.3f} | {k['latency']:.3f} | "
            f"{k['deadline']:.3f} | {k['compound']:.3f} | {s['changes']:.1f} |"
        )
    lines += ["", "| shape | attainment − KEDA | replica-s / KEDA | tokens / static-peak "
              "| requests / static-peak | replica-s / static-peak |", "|---|---|---|---|---|---|"]
    for v in verdicts(summary):
        lines.append(
            f"| {v['shape']} | {v.get('attainment_minus_keda', float('nan')):+.3f} | "
            f"{v.get('replica_seconds_vs_keda', float('nan')):.3f}x | "
            f"{v.get('token_goodput_vs_peak', float('nan')):.3f}x | "
            f"{v.get('request_goodput_vs_peak', float('nan')):.3f}x | "
            f"{v.get('replica_seconds_vs_peak', float('nan')):.3f}x |"
        )
    return "\n".join(lines)


def plot(path: Path, rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    fig, axes = plt.subplots(len(shapes), 1, figsize=(9, 3.2 * len(shapes)), squeeze=False)
    for ax, shape in zip(axes[:, 0], shapes, strict=True):
        first = min(r["seed"] for r in rows if r["shape"] == shape)
        runs = [r for r in rows if r["shape"] == shape and r["seed"] == first]
        for r in runs:
            t = [p[0] for p in r["timeline"]]
            ax.step(t, [p[1] + p[2] for p in r["timeline"]], where="post", label=r["strategy"])
        rate = ax.twinx()
        if runs:
            rate.plot([p[0] for p in runs[0]["timeline"]], [p[4] for p in runs[0]["timeline"]],
                      color="grey", alpha=0.35, linewidth=0.8)  # fmt: skip
        rate.set_ylabel("arrivals / s")
        ax.set_title(f"{shape} (seed {first})")
        ax.set_xlabel("time (s)")
        ax.set_ylabel("replicas (ready + warming)")
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(out: Path, meta: dict[str, Any], rows: list[dict[str, Any]],
          sizing: list[dict[str, Any]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(rows)
    text = markdown(meta, summary)
    print(text)
    (out / "autoscale.md").write_text(text + "\n")
    light = [{k: v for k, v in r.items() if k != "timeline"} for r in sizing]
    (out / "autoscale.json").write_text(json.dumps(
        {"meta": meta, "summary": summary, "verdicts": verdicts(summary), "rows": rows,
         "sizing": light}, indent=1))  # fmt: skip
    plot(out / "autoscale.png", rows)
    print(f"wrote {out / 'autoscale.md'}, {out / 'autoscale.json'} and {out / 'autoscale.png'}")
