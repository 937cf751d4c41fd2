"""``jitserve bench`` across replicas: the placement flags, the placers they name, the
replicas' speeds, and the table of each placement against the best other one.

Who owns what: :func:`add_fleet_flags` / :func:`fleet_from_args` parse ``--replicas``,
``--placement``, ``--replica-speeds`` and ``--report-period`` (a clear error, exit 2, on
bad values); :func:`make_placement` builds the cluster's
:class:`~jitserve.sim.cluster.Placement` for one cell (every placement reads the same
reports, at the same period, with the same length estimator);
:func:`placement_ratios_markdown` compares ``power-of-k`` (and ``power-of-k-late``, the
simulator-only late-binding form, :mod:`jitserve.sim.late`) with the best of the others.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from jitserve.errors import CLIError
from jitserve.placement.base import Placer
from jitserve.placement.power_of_k import PowerOfK
from jitserve.placement.registry import PLACERS, make_placer
from jitserve.policy import SLOPolicySpec
from jitserve.sim.cluster import DEFAULT_REPORT_PERIOD_S, LateBinding, Placement
from jitserve.sim.engine import Engine
from jitserve.sim.latency import Profile

POWER_OF_K = "power-of-k"
POWER_OF_K_LATE = "power-of-k-late"
"""Simulator only: a request waits as a copy on K replicas until one starts it (the
paper's form); compound programs are placed at arrival by power-of-k."""


@dataclass(frozen=True)
class Fleet:
    replicas: int
    placements: tuple[str, ...]
    """Empty with one replica (no placement)."""
    speeds: tuple[float, ...]
    """Empty: every replica at speed 1."""
    report_period_s: float

    @property
    def scenario(self) -> str:
        if self.replicas == 1:
            return ""
        speeds = ",".join(f"{s:g}" for s in self.speeds) if self.speeds else "equal"
        return f"{self.replicas} replicas, speeds {speeds}"


def add_fleet_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="engine replicas, each running the policy, behind --placement (load is per "
        "unit of replica speed)",
    )
    parser.add_argument(
        "--placement",
        default=POWER_OF_K,
        help="with --replicas > 1: comma-separated placements compared side by side; known: "
        f"{', '.join(sorted(PLACERS))}, {POWER_OF_K_LATE} (simulator only: late binding, "
        "a copy of each request waits on K replicas until one starts it); power-of-k:K "
        "and power-of-k-late:K sample K replicas (default K = all)",
    )
    parser.add_argument(
        "--replica-speeds",
        metavar="S1,S2,...",
        help="one speed per replica (1 = the profile's; 0.5 takes twice as long per step); "
        "default: all 1",
    )
    parser.add_argument(
        "--report-period",
        type=float,
        default=DEFAULT_REPORT_PERIOD_S,
        help="seconds between the replicas' reports to placement (their staleness)",
    )


def fleet_from_args(args: argparse.Namespace) -> Fleet:
    if args.replicas < 1:
        raise CLIError(f"--replicas must be >= 1, got {args.replicas}")
    if not args.report_period > 0:
        raise CLIError(f"--report-period must be > 0, got {args.report_period}")
    speeds: tuple[float, ...] = ()
    if args.replica_speeds is not None:
        try:
            speeds = tuple(float(x) for x in args.replica_speeds.split(","))
        except ValueError:
            raise CLIError(
                f"--replica-speeds: expected comma-separated numbers, got "
                f"{args.replica_speeds!r}"
            ) from None
        if len(speeds) != args.replicas:
            raise CLIError(
                f"--replica-speeds: {len(speeds)} speed(s) for --replicas {args.replicas}; "
                "give one per replica"
            )
        if any(not s > 0 or s == float("inf") for s in speeds):
            raise CLIError(f"--replica-speeds: speeds must be > 0, got {args.replica_speeds!r}")
    placements: tuple[str, ...] = ()
    if args.replicas > 1:
        placements = tuple(p.strip() for p in args.placement.split(",") if p.strip())
        if not placements:
            raise CLIError("--placement: name at least one placement")
        for name in placements:
            check_placement(name)
    return Fleet(args.replicas, placements, speeds, args.report_period)


def check_placement(name: str) -> None:
    base, _, k = name.partition(":")
    known = (*sorted(PLACERS), POWER_OF_K_LATE)
    if base not in known or (k and base not in (POWER_OF_K, POWER_OF_K_LATE)):
        raise CLIError(
            f"--placement: unknown placement {name!r}; choose from {', '.join(known)}"
            f" (or {POWER_OF_K}:K, {POWER_OF_K_LATE}:K)"
        )
    if k and (not k.isdigit() or int(k) < 1):
        raise CLIError(f"--placement: K in {name!r} must be an integer >= 1")


def make_placer_named(
    name: str, seed: int, spec: SLOPolicySpec, weights: dict[str, float] | None = None
) -> Placer:
    base, _, k = name.partition(":")
    if base == POWER_OF_K_LATE:
        return PowerOfK(seed, None, spec, weights)  # places compound programs only
    if base == POWER_OF_K:
        # the gateway's power-of-k (registry) at the run's SLOPolicy settings
        return PowerOfK(seed, int(k) if k else None, spec, weights)
    return make_placer(base, seed)


def make_placement(
    name: str,
    seed: int,
    spec: SLOPolicySpec,
    engines: list[Engine],
    period_s: float,
    weights: dict[str, float] | None = None,
) -> Placement:
    """Every placement gets the same reports and period and the same length estimator
    (replica 0's: it learns from that replica's finished requests, as an analyzer fed by
    one replica would)."""
    base, _, k = name.partition(":")
    late = LateBinding(int(k) if k else None, seed) if base == POWER_OF_K_LATE else None
    return Placement(
        make_placer_named(name, seed, spec, weights), engines[0].lifecycle.estimator, period_s,
        late,
    )


def scaled_profile(profile: Profile, speed: float) -> Profile:
    """``profile`` on a replica ``speed`` times as fast (every time coefficient / speed)."""
    if speed == 1.0:
        return profile
    return profile.scaled(speed)


def placement_ratios(summary: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (scenario, load) and power-of-k variant (``power-of-k``, ``power-of-k-late``,
    with or without :K): its token and request goodput over the best placement that is
    not a power-of-k variant (each metric's best picked separately)."""
    out = []
    by = {(e["scenario"], e["load"], e["policy"]): e for e in summary}
    mine_names = sorted({p for _, _, p in by if p.startswith(POWER_OF_K)})
    for (scenario, load), name in [
        (cell, name) for cell in sorted({(e["scenario"], e["load"]) for e in summary})
        for name in mine_names
    ]:
        mine = by.get((scenario, load, name))
        others = [e for (s, lo, p), e in by.items()
                  if s == scenario and lo == load and not p.startswith(POWER_OF_K)]
        if mine is None or not others:
            continue
        entry: dict[str, Any] = {"scenario": scenario, "load": load, "placement": name}
        for metric in ("token_goodput", "request_goodput"):
            best = max(others, key=lambda e: e[metric])
            entry[f"{metric}_best"] = best["policy"]
            entry[f"{metric}_ratio"] = mine[metric] / max(best[metric], 1e-9)
        out.append(entry)
    return out


def placement_ratios_markdown(summary: list[dict[str, Any]]) -> str:
    rows = placement_ratios(summary)
    if not rows:
        return ""
    lines = [
        "| scenario | load | placement | placement / best other (tokens) | best other | (requests) "
        "| best other |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['scenario']} | {r['load']:.2f} | {r['placement']} | "
            f"{r['token_goodput_ratio']:.3f}x | "
            f"{r['token_goodput_best']} | {r['request_goodput_ratio']:.3f}x | "
            f"{r['request_goodput_best']} |"
        )
    return "\n".join(lines)
