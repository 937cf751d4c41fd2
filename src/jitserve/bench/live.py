"""Live load generation: replay a simulator workload against an HTTP endpoint (owner: bench).

:func:`run_live` replays a workload of :mod:`jitserve.sim.workload` (single requests
with latency/deadline SLOs and compound programs, stage after stage with tool time in
between) against an OpenAI-compatible URL, measures every token's arrival at the client
and scores it with the same rules as the simulator (:mod:`jitserve.goodput`);
:func:`live_row` turns the result into a row of the simulator's bench table
(``jitserve.bench.report.table``). Lengths are scaled down for a CPU model
(``--max-prompt``, ``--max-output``); prompts are token ids and ``ignore_eos`` makes the
output length exact. ``jitserve bench --live URL`` and ``jitserve sidecar bench-live``
call it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp
import numpy as np

from jitserve.bench.stream import StreamResult as StreamResult
from jitserve.bench.stream import stream_completion as stream_completion
from jitserve.errors import CLIError
from jitserve.goodput import (
    GoodputLedger,
    LogHistogram,
    Outcome,
    latency_tokens_on_time,
    score_request,
)
from jitserve.policy import AUTO
from jitserve.requests import Program, Request, Workitem
from jitserve.sidecar import headers as hdr
from jitserve.sim.workload import WorkloadSpec, generate, parse_mix
from jitserve.slo import DeadlineSLO, LatencySLO, SLOKind

# ---- live workload --------------------------------------------------------------------------
RUN_ID = f"{time.time_ns():x}"
"""Prefix of program ids: replays of one workload do not share programs."""

def _prompt_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10, 1000) for _ in range(n)]


def live_workload(duration_s: float, rate_per_s: float, seed: int = 1, mix: str = "1:1:1",
                  trace: str = "azure-conv", max_prompt: int = 128, max_output: int = 96,
                  ) -> list[Workitem]:
    return list(generate(live_spec(duration_s, rate_per_s, seed, mix, trace, max_prompt,
                                   max_output)))


def live_spec(duration_s: float, rate_per_s: float, seed: int = 1, mix: str = "1:1:1",
              trace: str = "azure-conv", max_prompt: int = 128, max_output: int = 96,
              ) -> WorkloadSpec:
    """The live bench's workload: Poisson arrivals, lengths capped for a CPU model, tool
    calls a tenth as long; the simulator replays the same items from the same spec."""
    return WorkloadSpec(trace=trace, mix=parse_mix(mix), arrival="poisson",
                        rate_per_s=rate_per_s, duration_s=duration_s, seed=seed,
                        max_prompt=max_prompt, max_output=max_output, tool_scale=0.1)


def _slo_body(req: Request, program: Program | None = None, stage: int = 0) -> dict[str, Any]:
    slo = req.slo
    if program is not None:
        return {"kind": "compound", "deadline_s": program.slo.deadline_s,
                "program_id": f"{RUN_ID}-{program.program_id}", "stage": stage,
                "stages": len(program.stages)}
    if isinstance(slo, LatencySLO):
        return {"kind": "latency", "ttft_ms": slo.ttft_s * 1000, "tbt_ms": slo.tbt_s * 1000}
    if isinstance(slo, DeadlineSLO) and slo.best_effort:
        return {"kind": "best_effort"}
    assert isinstance(slo, DeadlineSLO)
    return {"kind": "deadline", "deadline_s": slo.deadline_s}


SLOCarrier = Literal["body", "headers", "none"]
"""How a request's SLO travels: the body's ``slo`` object, the gateway headers
(llm-d's ``x-llm-d-slo-ttft-ms``, ``x-llm-d-slo-tpot-ms``, jitserve's
``x-llm-d-slo-deadline-ms``), or not at all (the client still scores it against the same
SLO)."""


def slo_headers(slo: dict[str, Any], deadline_left_s: float | None = None) -> dict[str, str]:
    """The gateway headers for an ``slo`` body object. Headers cannot name a compound
    program: its calls carry the time left to the program's deadline as their own
    deadline (``deadline_left_s``)."""
    kind = slo.get("kind")
    if kind == "latency":
        return {hdr.SLO_TTFT: f"{slo['ttft_ms']:g}", hdr.SLO_TPOT: f"{slo['tbt_ms']:g}"}
    if kind == "deadline":
        return {hdr.SLO_DEADLINE: f"{slo['deadline_s'] * 1000:g}"}
    if kind == "compound":
        left = slo["deadline_s"] if deadline_left_s is None else deadline_left_s
        return {hdr.SLO_DEADLINE: f"{max(left, 0.001) * 1000:.0f}"}
    return {}


@dataclass
class LiveStats:
    requests: int = 0
    errors: int = 0
    retired: int = 0
    preemptions: int = 0
    output_tokens: int = 0
    error_messages: dict[str, int] = field(default_factory=dict)
    statuses: dict[int, int] = field(default_factory=dict)
    completed: int = 0
    """Calls that ended with a finish reason and no error."""
    refused_without_retry_after: int = 0
    """429/503 answers that lacked a ``Retry-After`` header."""
    tpot: LogHistogram = field(default_factory=LogHistogram)
    """Per finished request: (last token - first token) / (tokens - 1)."""

    def count(self, result: StreamResult) -> None:
        """One call's answer. Shed for load (``retired``, not an error): any 429 (the
        sidecar's answer to load, whatever its code: ``queue_full``,
        ``waiting_time_exceeded``, ``would_start_late``, ``ttl_expired``) and the 503
        ``slo_unreachable`` that ends a stream overload control gave up on."""
        self.requests += 1
        self.output_tokens += len(result.token_ids)
        self.statuses[result.status] = self.statuses.get(result.status, 0) + 1
        if result.status in (429, 503) and "Retry-After" not in result.headers:
            self.refused_without_retry_after += 1
        if result.error is None and result.finish_reason is not None:
            self.completed += 1
        if len(result.token_times) > 1 and result.error is None:
            times = result.token_times
            self.tpot.add((times[-1] - times[0]) / (len(times) - 1))
        if result.extension:
            self.preemptions += int(result.extension.get("preemptions") or 0)
        if result.error is None:
            return
        code = str(result.error.get("code") or result.error.get("type") or result.status)
        self.error_messages[code] = self.error_messages.get(code, 0) + 1
        if result.status == 429 or code == "slo_unreachable":
            self.retired += 1
        else:
            self.errors += 1


async def _one_call(session: aiohttp.ClientSession, url: str, model: str | None, req: Request,
                    rng: random.Random, stats: LiveStats, slo: dict[str, Any],
                    carrier: SLOCarrier = "body", deadline_left_s: float | None = None,
                    ) -> StreamResult:
    body: dict[str, Any] = {"prompt": _prompt_ids(rng, req.prompt_tokens),
                            "max_tokens": req.output_tokens or 1, "ignore_eos": True}
    headers = {hdr.FAIRNESS_ID: req.tenant}
    if carrier == "body":
        body["slo"] = slo
    elif carrier == "headers":
        headers.update(slo_headers(slo, deadline_left_s))
    if model:
        body["model"] = model
    try:
        result = await stream_completion(session, url, body, headers)
    except (aiohttp.ClientError, OSError) as err:
        result = StreamResult(status=0, error={"message": str(err)})
    stats.count(result)
    return result


async def _run_request(session: aiohttp.ClientSession, url: str, model: str | None, req: Request,
                       t0: float, rng: random.Random, ledger: GoodputLedger, stats: LiveStats,
                       carrier: SLOCarrier = "body") -> None:
    await asyncio.sleep(max(0.0, t0 + req.arrival_s - time.monotonic()))
    arrival = time.monotonic()
    result = await _one_call(session, url, model, req, rng, stats, _slo_body(req), carrier)
    generated = len(result.token_ids)
    finished = result.error is None and result.finish_reason is not None
    now = result.end_s
    slo = req.slo
    ontime = 0
    if isinstance(slo, LatencySLO):
        ontime = latency_tokens_on_time(np.asarray(result.token_times, dtype=np.float64), 0,
                                        arrival, slo)
    assert isinstance(slo, LatencySLO | DeadlineSLO)
    deadline = arrival + (slo.deadline_s if isinstance(slo, DeadlineSLO) else 0.0)
    goodput, met = score_request(slo, req.prompt_tokens, generated, now, deadline, ontime)
    met = met and finished
    goodput = goodput if finished or isinstance(slo, LatencySLO) else 0
    ttft = result.token_times[0] - arrival if result.token_times else None
    ledger.record(Outcome(req.tenant, req.kind, req.slo_class, req.prompt_tokens, generated,
                          goodput, met, not finished, ttft, now - arrival, req.arrival_s))
    if len(result.token_times) > 1:
        ledger.tbt.add_many(np.diff(np.asarray(result.token_times, dtype=np.float64)))


async def _run_program(session: aiohttp.ClientSession, url: str, model: str | None,
                       program: Program, t0: float, rng: random.Random, ledger: GoodputLedger,
                       stats: LiveStats, carrier: SLOCarrier = "body") -> None:
    await asyncio.sleep(max(0.0, t0 + program.arrival_s - time.monotonic()))
    arrival = time.monotonic()
    ok = True
    tokens_in = tokens_out = 0
    for stage_index, stage in enumerate(program.stages):
        reqs = program.stage_requests(stage_index, time.monotonic())
        left = arrival + program.slo.deadline_s - time.monotonic()
        results = await asyncio.gather(*(
            _one_call(session, url, model, r, rng, stats, _slo_body(r, program, stage_index),
                      carrier, left)
            for r in reqs))
        for r, res in zip(reqs, results, strict=True):
            tokens_in += r.prompt_tokens
            tokens_out += len(res.token_ids)
            ok = ok and res.error is None and res.finish_reason is not None
        if not ok:
            break
        if stage.tool_s > 0 and stage_index + 1 < len(program.stages):
            await asyncio.sleep(stage.tool_s)
    now = time.monotonic()
    met = ok and now <= arrival + program.slo.deadline_s
    ledger.record(Outcome(program.tenant, SLOKind.COMPOUND, program.slo_class, tokens_in,
                          tokens_out, tokens_in + tokens_out if met else 0, met, not ok, None,
                          now - arrival, program.arrival_s))


async def run_live(url: str, items: list[Workitem], model: str | None = None, seed: int = 1,
                   connections: int = 512, carrier: SLOCarrier = "body",
                   prompt_seed: int | None = None) -> tuple[GoodputLedger, LiveStats, float]:
    """Replay ``items`` (arrival times relative to now) against ``url``, the SLOs sent
    as ``carrier`` says and always scored the same; returns the ledger, counters and the
    wall time. Prompts are random token ids from ``prompt_seed`` (default ``seed``): give
    each run of a comparison its own, or vLLM's prefix cache serves a repeated prompt
    without its prefill."""
    ledger = GoodputLedger()
    stats = LiveStats()
    rng = random.Random(seed if prompt_seed is None else prompt_seed)
    connector = aiohttp.TCPConnector(limit=connections)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        t0 = time.monotonic()
        tasks = []
        for item in items:
            if isinstance(item, Request):
                tasks.append(_run_request(session, url, model, item, t0, rng, ledger, stats,
                                          carrier))
            else:
                tasks.append(_run_program(session, url, model, item, t0, rng, ledger, stats,
                                          carrier))
        await asyncio.gather(*tasks)
        wall = time.monotonic() - t0
    return ledger, stats, wall


def live_row(policy: str, ledger: GoodputLedger, stats: LiveStats, duration_s: float,
             wall_s: float, load: float = 1.0, seed: int = 1,
             scheduler: dict[str, Any] | None = None) -> dict[str, Any]:
    """A row in the format of ``jitserve.bench.cli.run_one``, for ``report.table``."""
    def pct(h: LogHistogram, q: float) -> float:
        return h.percentile(q)

    frame_p99 = math.nan
    if scheduler and scheduler.get("policy_ms_p99") is not None:
        frame_p99 = float(scheduler["policy_ms_p99"])
    return {
        "policy": policy, "load": load, "seed": seed, "requests": ledger.overall.requests,
        "token_goodput": ledger.overall.goodput_tokens / duration_s,
        "request_goodput": ledger.overall.met / duration_s,
        "attainment": dict(ledger.attainment()),
        "attainment_by_tenant": {k: t.attainment for k, t in sorted(ledger.by_tenant.items())},
        "throughput_tokens_per_s": stats.output_tokens / max(wall_s, 1e-9),
        "output_tokens_per_s": stats.output_tokens / max(wall_s, 1e-9),
        "ttft_s": {"p50": pct(ledger.ttft, 50), "p99": pct(ledger.ttft, 99)},
        "tbt_s": {"p50": pct(ledger.tbt, 50), "p99": pct(ledger.tbt, 99)},
        "e2el_s": {"p50": pct(ledger.e2el, 50), "p99": pct(ledger.e2el, 99)},
        "preemptions": stats.preemptions, "retired": stats.retired, "errors": stats.errors,
        "error_codes": stats.error_messages, "sched_ms_p99": frame_p99, "wall_s": wall_s,
    }


async def scheduler_state(session: aiohttp.ClientSession, url: str) -> dict[str, Any] | None:
    try:
        async with session.get(url.rstrip("/") + "/debug/scheduler") as resp:
            if resp.status != 200:
                return None
            doc: dict[str, Any] = await resp.json()
            return doc
    except (aiohttp.ClientError, OSError, ValueError):
        return None


async def metric_total(session: aiohttp.ClientSession, url: str, name: str) -> float:
    """The sidecar's sample ``name`` summed over its label sets (0 before it counted)."""
    from prometheus_client.parser import text_string_to_metric_families

    async with session.get(url.rstrip("/") + "/metrics") as resp:
        text = await resp.text()
    return sum(float(s.value) for family in text_string_to_metric_families(text)
               for s in family.samples if s.name == name)


async def switch_policy(url: str, policy_file: Path, policy: str, timeout_s: float = 30.0,
                        **scheduler: Any) -> None:
    """Rewrite ``scheduler.policy`` (and any other ``scheduler`` fields given, by their
    wire names) in the sidecar's (hot-reloaded) policy file and wait until the sidecar
    runs it (``auto``: until its tuner is on) with nothing running."""
    import yaml

    doc = yaml.safe_load(policy_file.read_text()) if policy_file.exists() else {}
    doc = doc or {}
    doc.setdefault("scheduler", {}).update(policy=policy, **scheduler)
    policy_file.write_text(yaml.safe_dump(doc, sort_keys=True))
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            state = await scheduler_state(session, url)
            if state and not state.get("running") and (
                    state.get("auto") is not None if policy == AUTO
                    else state.get("policy") == policy):
                return
            await asyncio.sleep(0.5)
    raise RuntimeError(f"the sidecar at {url} did not switch to policy {policy!r} within "
                       f"{timeout_s:.0f} s (is it watching {policy_file}?)")


def add_sidecar_twin_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of a script that drives a live sidecar beside its simulator twin:
    the sidecar, its hot-reloaded policy file, the engine profile the twin runs."""
    p.add_argument("--url", required=True, help="the sidecar (jitserve up --backend ...)")
    p.add_argument("--policy-file", type=Path, required=True,
                   help="the sidecar's hot-reloaded --config")
    p.add_argument("--profile", default="cpu-tiny-llama", help="the measured engine profile")


def add_bench_live_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True, help="OpenAI-compatible endpoint (the sidecar)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals")
    p.add_argument("--rate", type=float, default=2.0, help="work items per second")
    p.add_argument("--mix", default="1:1:1", help="latency:deadline:compound")
    p.add_argument("--trace", default="azure-conv", help="length trace of the requests")
    p.add_argument("--seed", type=int, default=1, help="workload seed")
    p.add_argument("--max-prompt", type=int, default=128, metavar="TOKENS",
                   help="longest prompt")
    p.add_argument("--max-output", type=int, default=96, metavar="TOKENS",
                   help="longest output")
    p.add_argument("--model", default=None, help="model to ask for (default: the served one)")
    p.add_argument("--slo-via", choices=("body", "headers", "none"), default="body",
                   help="send the SLO as the body's slo object, x-llm-d-slo-* headers, or not "
                   "at all")
    p.add_argument("--policies", default=None,
                   help="comma list: switch the sidecar to each in turn via --policy-file")
    p.add_argument("--policy-file", type=Path, default=None,
                   help="the sidecar's hot-reloaded policy file (with --policies)")
    p.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    p.add_argument("--markdown", action="store_true", help="also print a Markdown table")


async def _bench_live(args: argparse.Namespace) -> list[dict[str, Any]]:
    items = live_workload(args.duration, args.rate, args.seed, args.mix, args.trace,
                          args.max_prompt, args.max_output)
    policies = [p.strip() for p in args.policies.split(",")] if args.policies else [None]
    rows = []
    global RUN_ID
    for policy in policies:
        RUN_ID = f"{time.time_ns():x}"
        if policy is not None:
            if args.policy_file is None:
                raise ValueError("--policies needs --policy-file (the sidecar's --config file)")
            await switch_policy(args.url, args.policy_file, policy)
        ledger, stats, wall = await run_live(args.url, items, args.model, args.seed,
                                             carrier=args.slo_via)
        async with aiohttp.ClientSession() as session:
            state = await scheduler_state(session, args.url)
        name = policy or (state or {}).get("policy") or "endpoint"
        rows.append(live_row(str(name), ledger, stats, args.duration, wall, seed=args.seed,
                             scheduler=state))
        if args.out:
            args.out.write_text(json.dumps(rows, indent=2, default=str))
    return rows


def bench_live_main(args: argparse.Namespace) -> int:
    from jitserve.bench.report import markdown, summarize, table

    try:
        rows = asyncio.run(_bench_live(args))
    except (ValueError, RuntimeError) as err:
        raise CLIError(str(err)) from err
    summary = summarize(rows)
    print(table(summary))
    for row in rows:
        if row["errors"] or row["error_codes"]:
            print(f"{row['policy']}: refused/failed by code: {row['error_codes']}")
    if args.markdown:
        print()
        print(markdown(summary))
    return 0


def _deprecated_bench_live(args: argparse.Namespace) -> int:
    print("note: 'jitserve sidecar bench-live' is deprecated: use 'jitserve bench --live URL' "
          "(--duration, --rate, --mix, --trace; --live-slo for --slo-via, --live-prompt / "
          "--live-output for --max-prompt / --max-output, --live-policy-file with --policies)",
          file=sys.stderr)
    return bench_live_main(args)


def register_under_sidecar(sidecar_commands: Any) -> None:
    """``jitserve sidecar bench-live``: the old spelling of ``jitserve bench --live``."""
    live = sidecar_commands.add_parser(
        "bench-live", help="deprecated alias of 'jitserve bench --live URL'"
    )
    add_bench_live_arguments(live)
    live.set_defaults(handler=_deprecated_bench_live)
