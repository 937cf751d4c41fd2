"""Live A/B against the bare engine: the sidecar and its own vLLM, same workload (owner: bench).

``jitserve bench --live SIDECAR_URL --live-bare VLLM_URL`` replays one workload against
the sidecar (A) and directly against the vLLM behind it (B), alternating A B A B ...
for ``--live-rounds`` rounds, and writes one table (Markdown and JSON) with one row per
run: throughput, token and request goodput, attainment by kind, TTFT/TPOT percentiles,
429/503 counts (and any refusal without ``Retry-After``), the sidecar's dispatch gap and
the machine's load average. Every run is scored by :func:`jitserve.bench.live.run_live`,
i.e. with :mod:`jitserve.goodput`, the simulator's code, against the same per-request
SLOs whichever way they travelled. Arrivals and lengths are the same in every run; the
prompts' token ids differ per run (vLLM's prefix cache would otherwise serve a later run's
prompts without prefill).

How the SLO travels (``--live-slo``): to the sidecar as the body's ``slo`` object, as
gateway headers, or not at all (``none``: everything is best effort to the sidecar). The
bare vLLM never gets it: vLLM accepts unknown body fields but ignores them (its
``OpenAIBaseModel`` allows extras and only logs them at debug level) and ignores unknown
headers, so sending it would only cost bytes; it is scored all the same.

Workloads: ``mixed`` (the simulator's latency/deadline/compound mix, lengths capped for
a CPU model) or ``uniform`` (what vLLM's serving benchmark sends with its random
dataset: fixed prompt and output lengths, Poisson arrivals, every request a latency SLO
of TTFT 2 s / TBT 100 ms).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from jitserve.bench.live import (
    LiveStats,
    SLOCarrier,
    live_row,
    live_workload,
    run_live,
)
from jitserve.errors import CLIError
from jitserve.goodput import GoodputLedger
from jitserve.requests import Request, Workitem
from jitserve.slo import LatencySLO

KIND_ORDER = ("latency", "deadline", "compound", "best_effort", "overall")


@dataclass(frozen=True)
class Target:
    name: str
    url: str
    carrier: SLOCarrier


def uniform_workload(duration_s: float, rate_per_s: float, seed: int = 1,
                     prompt_tokens: int = 256, output_tokens: int = 128,
                     ttft_s: float = 2.0, tbt_s: float = 0.1) -> list[Workitem]:
    """Poisson arrivals of equal requests with one latency SLO (vLLM's random dataset)."""
    rng = random.Random(seed)
    items: list[Workitem] = []
    t = rng.expovariate(rate_per_s)
    while t < duration_s:
        items.append(Request(request_id=f"u{len(items)}", tenant="default",
                             slo=LatencySLO(ttft_s, tbt_s), prompt_tokens=prompt_tokens,
                             arrival_s=t, output_tokens=output_tokens))
        t += rng.expovariate(rate_per_s)
    return items


# ---- the engine's state, between runs ---------------------------------------------------------
async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as resp:
            return resp.status, await resp.text()
    except (TimeoutError, aiohttp.ClientError, OSError) as err:
        return 0, f"{type(err).__name__}: {err}"


def _gauge(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def first_model(session: aiohttp.ClientSession, url: str, what: str) -> str:
    status, text = await _get(session, url.rstrip("/") + "/v1/models")
    if status != 200:
        raise CLIError(f"{what} {url} does not answer GET /v1/models ({status}: {text[:200]})")
    try:
        return str(json.loads(text)["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError) as err:
        raise CLIError(f"{what} {url}: /v1/models lists no model ({text[:200]})") from err


async def wait_idle(session: aiohttp.ClientSession, sidecar: str, bare: str,
                    timeout_s: float = 180.0) -> None:
    """Until neither the sidecar nor vLLM holds a request (a run's tail must not leak
    into the next one); bounded."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        s_status, s_text = await _get(session, sidecar.rstrip("/") + "/debug/scheduler")
        v_status, v_text = await _get(session, bare.rstrip("/") + "/metrics")
        # 404: the sidecar serves /debug/scheduler on its admin port; vLLM's view counts
        busy = s_status not in (200, 404) or v_status != 200
        if not busy:
            state = json.loads(s_text) if s_status == 200 else {}
            busy = bool(state.get("running") or state.get("waiting"))
            busy = busy or (_gauge(v_text, "vllm:num_requests_running")
                            + _gauge(v_text, "vllm:num_requests_waiting")) > 0
        if not busy:
            return
        await asyncio.sleep(0.5)
    raise CLIError(f"the sidecar or vLLM still held requests {timeout_s:.0f} s after a run")


async def _scheduler(session: aiohttp.ClientSession, sidecar: str) -> dict[str, Any]:
    status, text = await _get(session, sidecar.rstrip("/") + "/debug/scheduler")
    doc: dict[str, Any] = json.loads(text) if status == 200 else {}
    return doc


# ---- the runs ---------------------------------------------------------------------------------
async def run_compare(sidecar: str, bare: str, items: list[Workitem], *, rounds: int,
                      carrier: SLOCarrier, duration_s: float, rate: float, seed: int = 1,
                      settle_s: float = 2.0, out: Path | None = None) -> list[dict[str, Any]]:
    """A B A B ...: the sidecar, then the bare vLLM, ``rounds`` times; one row per run."""
    async with aiohttp.ClientSession() as session:
        model = await first_model(session, bare, "--live-bare")
        await first_model(session, sidecar, "--live")
        targets = [Target("jitserve", sidecar, carrier), Target("vllm", bare, "none")]
        rows: list[dict[str, Any]] = []
        for round_ in range(1, rounds + 1):
            for target in targets:
                await wait_idle(session, sidecar, bare)
                await asyncio.sleep(settle_s)
                before = await _scheduler(session, sidecar)
                load_start = os.getloadavg()[0]
                print(f"round {round_}: {target.name} ({target.url}, SLO as {target.carrier}), "
                      f"{len(items)} work items at {rate:g}/s, load {load_start:.1f}", flush=True)
                run_index = len(rows)
                ledger, stats, wall = await run_live(target.url, items, model, seed,
                                                     carrier=target.carrier,
                                                     prompt_seed=seed * 1000 + run_index)
                after = await _scheduler(session, sidecar)
                row = live_row(target.name, ledger, stats, duration_s, wall, seed=seed,
                               scheduler=after if target.name == "jitserve" else None)
                row.update(_extras(row, stats, ledger, wall, round_, target, rate,
                                   load_start, before, after))
                rows.append(row)
                print("  " + _one_line(row), flush=True)
                if out is not None:
                    out.write_text(json.dumps({"runs": rows, "summary": summarize(rows)},
                                              indent=2, default=str))
    return rows


def _extras(row: dict[str, Any], stats: LiveStats, ledger: GoodputLedger, wall: float, round_: int,
            target: Target, rate: float, load_start: float, before: dict[str, Any],
            after: dict[str, Any]) -> dict[str, Any]:
    completed = stats.completed
    gap = after.get("dispatch_gap_ms") if target.name == "jitserve" else None
    return {
        "target": target.name, "round": round_, "slo_via": target.carrier, "rate": rate,
        "completed_per_s": completed / max(wall, 1e-9),
        "tpot_s": {"p50": stats.tpot.percentile(50), "p99": stats.tpot.percentile(99)},
        "ttft_p90_s": ledger.ttft.percentile(90),
        "status_counts": {str(k): v for k, v in sorted(stats.statuses.items())},
        "refused_429": stats.statuses.get(429, 0), "refused_503": stats.statuses.get(503, 0),
        "refused_without_retry_after": stats.refused_without_retry_after,
        "dispatch_gap_ms": gap, "load_avg_start": load_start,
        "load_avg_end": os.getloadavg()[0],
        "frames": (after.get("frames") or 0) - (before.get("frames") or 0),
    }


def _one_line(row: dict[str, Any]) -> str:
    return (f"{row['output_tokens_per_s']:.0f} out tok/s, {row['completed_per_s']:.2f} req/s "
            f"done, goodput {row['token_goodput']:.0f} tok/s {row['request_goodput']:.2f} req/s, "
            f"attainment {row['attainment'].get('overall', math.nan):.3f}, "
            f"429/503 {row['refused_429']}/{row['refused_503']}")


# ---- the table --------------------------------------------------------------------------------
def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over rounds per target and the ratios jitserve / bare vLLM."""
    means: dict[str, dict[str, float]] = {}
    keys = ("output_tokens_per_s", "completed_per_s", "token_goodput", "request_goodput")
    for name in ("jitserve", "vllm"):
        group = [r for r in rows if r["target"] == name]
        if group:
            means[name] = {k: statistics.fmean(r[k] for r in group) for k in keys}
    ratios = {}
    if len(means) == 2:
        for k in keys:
            bare = means["vllm"][k]
            ratios[k] = means["jitserve"][k] / bare if bare else math.inf
    return {"means": means, "ratios": ratios}


def markdown(rows: list[dict[str, Any]]) -> str:
    kinds = [k for k in KIND_ORDER if any(k in r["attainment"] for r in rows)]
    head = ("| run | target | SLO sent as | throughput (out tok/s) | completed (req/s) "
            "| token goodput (tok/s) | request goodput (req/s) | attainment "
            + " / ".join(k[0].upper() if k != "overall" else "all" for k in kinds)
            + " | TTFT p50 / p99 (s) | TPOT p50 / p99 (ms) | 429 / 503 | no Retry-After "
            "| dispatch gap p50 / p99 (ms) | load avg |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        att = " / ".join(_fmt(r["attainment"].get(k), ".3f") for k in kinds)
        gap = r.get("dispatch_gap_ms") or {}
        lines.append(
            f"| {r['round']} | {r['target']} | {r['slo_via']} "
            f"| {r['output_tokens_per_s']:.0f} | {r['completed_per_s']:.2f} "
            f"| {r['token_goodput']:.0f} | {r['request_goodput']:.2f} | {att} "
            f"| {_fmt(r['ttft_s']['p50'], '.2f')} / {_fmt(r['ttft_s']['p99'], '.2f')} "
            f"| {_fmt(r['tpot_s']['p50'] * 1e3, '.0f')} / {_fmt(r['tpot_s']['p99'] * 1e3, '.0f')} "
            f"| {r['refused_429']} / {r['refused_503']} | {r['refused_without_retry_after']} "
            f"| {_fmt(gap.get('p50'), '.1f')} / {_fmt(gap.get('p99'), '.1f')} "
            f"| {r['load_avg_start']:.1f}-{r['load_avg_end']:.1f} |")
    summary = summarize(rows)
    if summary["ratios"]:
        ratio = summary["ratios"]
        lines.append("")
        lines.append(
            f"jitserve / bare vLLM (mean of {max(r['round'] for r in rows)} rounds): "
            f"throughput {ratio['output_tokens_per_s']:.2f}x, completed "
            f"{ratio['completed_per_s']:.2f}x, token goodput {ratio['token_goodput']:.2f}x, "
            f"request goodput {ratio['request_goodput']:.2f}x")
    return "\n".join(lines)


def compare_main(sidecar: str, bare: str, *, workload: str, duration_s: float, rate: float,
                 rounds: int, carrier: SLOCarrier, seed: int, mix: str, trace: str,
                 prompt_tokens: int | None, output_tokens: int | None, out_dir: Path) -> int:
    """``jitserve bench --live URL --live-bare URL``: run, print and write the table."""
    if rounds < 1:
        raise CLIError(f"--live-rounds must be >= 1, got {rounds}")
    if rate <= 0 or duration_s <= 0:
        raise CLIError("--rate and --duration must be positive")
    if sidecar.rstrip("/") == bare.rstrip("/"):
        raise CLIError("--live and --live-bare name the same URL: --live is the sidecar, "
                       "--live-bare the vLLM behind it")
    if workload == "uniform":
        items = uniform_workload(duration_s, rate, seed, prompt_tokens or 256,
                                 output_tokens or 128)
    else:
        try:
            items = live_workload(duration_s, rate, seed, mix, trace, prompt_tokens or 128,
                                  output_tokens or 96)
        except ValueError as err:
            raise CLIError(str(err)) from err
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "live_compare.json"
    rows = asyncio.run(run_compare(sidecar, bare, items, rounds=rounds, carrier=carrier,
                                   duration_s=duration_s, rate=rate, seed=seed, out=json_path))
    table = markdown(rows)
    (out_dir / "live_compare.md").write_text(table + "\n")
    print()
    print(table)
    print(f"\nwrote {json_path} and {out_dir / 'live_compare.md'}")
    return 0
