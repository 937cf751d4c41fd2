"""Two runs of the scenario matrix that differ in one setting (e.g. the overload layer's
``admission.maxWaitingRetires``: A = all, B = late), compared per policy and for GMAX
against the best ``-ac`` baseline under either setting (each at its strongest)
(docs/benchmarks.md, "Which waiting requests overload control retires").

    .venv/bin/python scripts/matrix_rules.py bench-out/matrix/matrix.json \
        bench-out/matrix-late/matrix.json
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path

Key = tuple[str, float, str, str]  # scenario, load, objective, policy
METRIC = {"tokens": "token_goodput", "requests": "request_goodput"}


def means(path: Path) -> dict[Key, float]:
    """Each cell's mean over its windows of the goodput its objective is judged by."""
    runs: dict[Key, list[float]] = defaultdict(list)
    for run in json.loads(path.read_text())["runs"]:
        if run["load"] >= 1.0:
            key = (run["scenario"], run["load"], run["objective"], run["policy"])
            runs[key].append(run[METRIC[run["objective"]]])
    return {key: sum(v) / len(v) for key, v in runs.items()}


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def summary(ratios: list[float]) -> str:
    below = sum(r < 0.98 for r in ratios)
    return (f"{geomean(ratios):.3f} | {min(ratios):.3f} | {max(ratios):.3f} | "
            f"{below} of {len(ratios)}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", type=Path, help="matrix.json with setting A")
    p.add_argument("b", type=Path, help="matrix.json with setting B")
    args = p.parse_args()
    a, b = means(args.a), means(args.b)
    shared = sorted(set(a) & set(b))
    if not shared:
        p.error("the two runs share no overload cell")
    print("| policy | objective | B / A: geometric mean | min | max | cells below 0.98x |")
    print("|---|---|---|---|---|---|")
    by_policy: dict[tuple[str, str], list[float]] = defaultdict(list)
    for key in shared:
        if a[key] > 0 and b[key] > 0:
            by_policy[(key[3], key[2])].append(b[key] / a[key])
    for (policy, objective), ratios in sorted(by_policy.items()):
        print(f"| {policy} | {objective} | {summary(ratios)} |")
    print()
    print("| GMAX against the best -ac | objective | geometric mean | min | max "
          "| cells below 0.98x |")
    print("|---|---|---|---|---|---|")
    cells = sorted({k[:3] for k in shared})
    for label, gmax_run, rivals in (
        ("A vs A", a, (a,)), ("B vs B", b, (b,)), ("B vs either", b, (a, b))
    ):
        for objective in METRIC:
            ratios = [
                gmax_run[(*cell, "gmax")]
                / max(run[k] for run in rivals for k in shared
                      if k[:3] == cell and k[3].endswith("-ac"))
                for cell in cells if cell[2] == objective
            ]  # fmt: skip
            print(f"| {label} | {objective} | {summary(ratios)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
