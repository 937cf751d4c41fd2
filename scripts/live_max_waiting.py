"""Live: one policy under ``admission.maxWaitingRetires`` all or late, on the sim-vs-live
workload (azure-conv 1:1:1, 40 s, window 1) at a load relative to the simulator's
capacity, through a running stack; per-kind outcomes as one JSON line
(docs/benchmarks.md, "Which waiting requests overload control retires").

    .venv/bin/python scripts/live_max_waiting.py --url http://127.0.0.1:8090 \\
        --policy-file policy.yaml --policy gmax --retires late --load 1.5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import yaml

from jitserve.bench import live as live_bench
from jitserve.bench.capacity import measure_capacity
from jitserve.bench.live import live_spec, run_live, switch_policy
from jitserve.policy import MaxWaitingRetires
from jitserve.sim.latency import load_profile
from jitserve.sim.workload import generate

DURATION_S = 40.0


async def run(url: str, policy_file: Path, policy: str, retires: str,
              load: float) -> dict[str, Any]:
    capacity = measure_capacity(load_profile("cpu-tiny-llama"),
                                live_spec(DURATION_S, 1.0, 1, "1:1:1", "azure-conv"))
    items = list(generate(live_spec(DURATION_S, load * capacity, 1, "1:1:1", "azure-conv")))
    policy_file.write_text(yaml.safe_dump({"admission": {"maxWaitingRetires": retires}}))
    # through another policy, so that the sidecar has reloaded the file before the run
    await switch_policy(url, policy_file, "edf-ac" if policy != "edf-ac" else "gmax", 120.0)
    await switch_policy(url, policy_file, policy, 120.0)
    live_bench.RUN_ID = f"{time.time_ns():x}"
    ledger, stats, _ = await run_live(url, items, seed=1, prompt_seed=time.time_ns())
    return {
        "policy": policy, "retires": retires, "load": load,
        "token_goodput": ledger.overall.goodput_tokens / DURATION_S,
        "request_goodput": ledger.overall.met / DURATION_S,
        "errors": stats.errors,
        "kinds": {kind.value: {"requests": t.requests, "met": t.met, "retired": t.retired}
                  for kind, t in sorted(ledger.by_kind.items())},
    }  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8090", help="the sidecar")
    p.add_argument("--policy-file", type=Path, required=True,
                   help="the sidecar's hot-reloaded --config (rewritten)")
    p.add_argument("--policy", default="gmax")
    p.add_argument("--retires", choices=[m.value for m in MaxWaitingRetires], default="late")
    p.add_argument("--load", type=float, default=1.5, help="x the simulator's capacity")
    args = p.parse_args()
    row = asyncio.run(run(args.url, args.policy_file, args.policy, args.retires, args.load))
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
