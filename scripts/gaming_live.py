"""Gaming the SLO claims, live (issue 27): does a tenant buy service by claiming tight
targets, and does its contract stop it?

    # vLLM pinned to a core of its own, the control plane and this script on the other:
    taskset -c 1 <vllm> --max-num-seqs 16 --max-model-len 2048 ... --port 8011 &
    taskset -c 0 jitserve up --backend http://127.0.0.1:8011 --max-num-seqs 16 \
        --no-analyzer --config policy.yaml --port 8090 &
    taskset -c 0 python scripts/gaming_live.py --url http://127.0.0.1:8090 \
        --policy-file policy.yaml --out gaming-live

Tenant ``a`` claims every target ``--claim`` x the policy's defaults, tenant ``b`` the
defaults, equal demand and weights, at ``--load`` x the simulator's capacity for the
measured profile (``jitserve.bench.live.live_spec``'s workload, two tenants). Each setting
(f; ``a``'s contract off or its tightest targets = the defaults, clamp or refuse) is
written to the sidecar's hot-reloaded policy file, the settings' order rotated each
round, each run's prompts new. The figures are the sidecar's own: the differences of its
``jitserve_goodput_tokens_total`` and ``jitserve_tenant_demand_tokens_total`` per tenant
over the run, water-filled as the operator's ``status.fairness`` is
(:func:`jitserve.operator.fairness_status.fairness_status`), and of
``jitserve_slo_claims_beyond_contract_total``. The same items run in the simulator on the
profile, held to the contract as the sidecar holds them, beside.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from jitserve.bench import live as live_bench
from jitserve.bench.capacity import measure_capacity
from jitserve.bench.live import live_spec, metric_total, run_live, scheduler_state
from jitserve.bench.runner import Cell, run_one
from jitserve.fairshare import fair_allocation
from jitserve.operator.fairness_status import fairness_status
from jitserve.operator.sidecar_metrics import OutcomeHistory, parse_metrics
from jitserve.policy import SLOPolicySpec, load_policy
from jitserve.sim.latency import load_profile
from jitserve.sim.workload import generate

SETTINGS = {  # name -> (a's claim factor applies, f, contract: None | clamp | refuse)
    "honest f=0": (False, 0.0, None),
    "gaming f=0": (True, 0.0, None),
    "gaming f=0.5": (True, 0.5, None),
    "gaming f=0 clamp": (True, 0.0, "clamp"),
    "gaming f=0.5 clamp": (True, 0.5, "clamp"),
    "gaming f=0.5 refuse": (True, 0.5, "refuse"),
}


def policy_doc(f: float, contract: str | None) -> dict[str, Any]:
    """The SLOPolicy spec of one setting: a's tightest targets are the defaults."""
    d = SLOPolicySpec().slo_defaults
    tenants: list[dict[str, Any]] = [{"name": "a"}, {"name": "b"}]
    fairness: dict[str, Any] = {"weight": f, "tenants": tenants}
    if contract is not None:
        tenants[0]["tightest"] = {"ttftMs": d.latency.ttft_seconds * 1000,
                                  "tbtMs": d.latency.tbt_seconds * 1000,
                                  "deadlineSeconds": d.deadline_seconds}
        fairness["beyondContract"] = contract
    return {"scheduler": {"policy": "gmax"}, "fairness": fairness}


async def reloads(session: aiohttp.ClientSession, url: str) -> float:
    """How many times the sidecar has reloaded its policy file."""
    return await metric_total(session, url, "jitserve_config_reloads_total")


async def apply(url: str, policy_file: Path, doc: dict[str, Any], timeout_s: float = 120) -> None:
    """Write the policy file; wait until the sidecar reloaded it without error, idle."""
    text = yaml.safe_dump(doc, sort_keys=True)
    async with aiohttp.ClientSession() as session:
        before = await reloads(session, url)
        changed = not policy_file.exists() or policy_file.read_text() != text
        policy_file.write_text(text)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = await scheduler_state(session, url)
            loaded = not changed or await reloads(session, url) > before
            if (loaded and state and state.get("config_error") is None
                    and not state.get("running") and not state.get("waiting")):
                return
            await asyncio.sleep(0.5)
    raise RuntimeError(f"the sidecar at {url} did not load {policy_file} within {timeout_s:.0f} s")


async def counters(url: str) -> tuple[dict[tuple[str, str], float], dict[str, float]]:
    """The sidecar's per-tenant token counters and its claims-beyond-contract counts."""
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
        text = await resp.text()
    beyond: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "jitserve_slo_claims_beyond_contract_total":
                tenant = s.labels["tenant"]
                beyond[tenant] = beyond.get(tenant, 0.0) + float(s.value)
    return parse_metrics(text).tenants, beyond


async def live_run(args: argparse.Namespace, name: str, spec: Any) -> dict[str, Any]:
    gaming, f, contract = SETTINGS[name]
    await apply(args.url, args.policy_file, policy_doc(f, contract))
    items = list(generate(spec if gaming else replace(spec, claim_scale=())))
    history = OutcomeHistory()
    before, beyond0 = await counters(args.url)
    history.add(0.0, {"pod": before}, 1e9)
    live_bench.RUN_ID = f"{time.time_ns():x}"
    _, stats, wall = await run_live(args.url, items, seed=args.seed,
                                    prompt_seed=time.time_ns())
    await asyncio.sleep(1.0)  # the last outcomes are counted
    after, beyond1 = await counters(args.url)
    history.add(1.0, {"pod": after}, 1e9)
    totals, _ = history.recent()
    fairness = load_policy(policy_doc(f, contract)).fairness
    got = fairness_status(totals, fairness, [])
    shares = {t.name: t for t in got.tenants} if got is not None else {}
    goodput = sum(v for (_, what), v in totals.items() if what == "goodput")
    row: dict[str, Any] = {
        "setting": name, "tokens_per_s": goodput / max(wall, 1e-9),
        "share": {t: shares[t].goodput_share if t in shares else 0.0 for t in "ab"},
        "max_min": {t: shares[t].max_min_share if t in shares else 0.0 for t in "ab"},
        "jain": got.jain_index if got is not None else None,
        "beyond_contract": {t: beyond1.get(t, 0.0) - beyond0.get(t, 0.0) for t in "ab"},
        "statuses": stats.statuses, "wall_s": wall,
    }
    print(f"live {name}: {row['tokens_per_s']:.0f} goodput tok/s, share a/b "
          f"{row['share']['a']:.3f}/{row['share']['b']:.3f}, max-min "
          f"{row['max_min']['a']:.3f}/{row['max_min']['b']:.3f}, beyond "
          f"{row['beyond_contract']['a']:.0f}", flush=True)
    return row


def sim_run(args: argparse.Namespace, name: str, spec: Any, capacity: float) -> dict[str, Any]:
    gaming, f, contract = SETTINGS[name]
    policy = load_policy(policy_doc(f, contract))
    cell = Cell("gmax", args.load, args.seed, spec if gaming else replace(spec, claim_scale=()),
                capacity, args.profile, policy)
    row = run_one(cell)
    received = row["goodput_tokens_by_tenant"]
    weights = {t: policy.fairness.weight_of(t) for t in "ab"}
    fair = fair_allocation("ab", row["demand_tokens_by_tenant"], received, weights)
    total = fair[1] if fair is not None else 1.0
    return {"tokens_per_s": row["token_goodput"],
            "share": {t: received.get(t, 0.0) / total for t in "ab"},
            "max_min": {t: fair[0][t] / total if fair is not None else 0.0 for t in "ab"}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    live_bench.add_sidecar_twin_arguments(p)
    p.add_argument("--load", type=float, default=1.5, help="x the simulator's capacity")
    p.add_argument("--claim", type=float, default=0.25, help="a's targets x this")
    p.add_argument("--settings", default=",".join(SETTINGS), help="which, comma-separated")
    p.add_argument("--rounds", type=int, default=2, help="live runs of each setting")
    p.add_argument("--duration", type=float, default=40.0, help="seconds of arrivals")
    p.add_argument("--seed", type=int, default=1, help="of the workload")
    p.add_argument("--mix", default="1:1:0")
    p.add_argument("--out", type=Path, default=Path("gaming-live"))
    args = p.parse_args()
    names = [n.strip() for n in args.settings.split(",") if n.strip()]
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        p.error(f"unknown --settings {unknown}; choose from {list(SETTINGS)}")
    args.url = args.url.rstrip("/")
    args.out.mkdir(parents=True, exist_ok=True)
    profile = load_profile(args.profile)
    base = live_spec(args.duration, 1.0, args.seed, args.mix)
    two = dict(tenants=("a", "b"), tenant_demand=(0.5, 0.5))
    capacity = measure_capacity(profile, replace(base, **two))  # type: ignore[arg-type]
    spec = replace(live_spec(args.duration, args.load * capacity, args.seed, args.mix),
                   claim_scale=(("a", args.claim),), **two)  # type: ignore[arg-type]
    print(f"simulator capacity of {profile.name}: {capacity:.2f} work items/s", flush=True)
    sim = {name: sim_run(args, name, spec, capacity) for name in names}
    live: dict[str, list[dict[str, Any]]] = {name: [] for name in names}

    async def rounds() -> None:
        for round_ in range(args.rounds):
            order = names[round_ % len(names):] + names[:round_ % len(names)]
            for name in order:
                live[name].append(await live_run(args, name, spec))
                (args.out / "gaming_live.json").write_text(
                    json.dumps({"sim": sim, "live": live}, indent=2))

    asyncio.run(rounds())
    table = markdown(sim, live)
    print(table)
    (args.out / "gaming_live.md").write_text(table + "\n")
    return 0


def markdown(sim: dict[str, dict[str, Any]], live: dict[str, list[dict[str, Any]]]) -> str:
    def mean(rows: list[dict[str, Any]], *path: str) -> float:
        values = []
        for row in rows:
            value: Any = row
            for key in path:
                value = value[key]
            values.append(float(value))
        return statistics.mean(values)

    lines = ["| setting | live tok/s | live share a / b | max-min a / b | b / its max-min | "
             "Jain | beyond contract (a, per run) | sim tok/s | sim share a / b | "
             "sim b / its max-min |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, rows in live.items():
        b_ratio = mean(rows, "share", "b") / max(mean(rows, "max_min", "b"), 1e-9)
        jains = [r["jain"] for r in rows if r["jain"] is not None]
        beyond = "-".join(f"{r['beyond_contract']['a']:.0f}" for r in rows)
        lines.append(
            f"| {name} | {mean(rows, 'tokens_per_s'):.0f} | {mean(rows, 'share', 'a'):.3f} / "
            f"{mean(rows, 'share', 'b'):.3f} | {mean(rows, 'max_min', 'a'):.3f} / "
            f"{mean(rows, 'max_min', 'b'):.3f} | {b_ratio:.2f} | "
            f"{statistics.mean(jains) if jains else float('nan'):.3f} | "
            f"{beyond} | "
            f"{sim[name]['tokens_per_s']:.0f} | {sim[name]['share']['a']:.3f} / "
            f"{sim[name]['share']['b']:.3f} | "
            f"{sim[name]['share']['b'] / max(sim[name]['max_min']['b'], 1e-9):.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
