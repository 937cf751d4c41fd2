"""Load generation against live endpoints (owner: sidecar).

Two tools, callable as functions (for ``jitserve bench``) and as
``jitserve sidecar bench-live`` / ``jitserve sidecar proxy-overhead``:

- :func:`run_live`: replays a workload of :mod:`jitserve.sim.workload` (single requests
  with latency/deadline SLOs and compound programs, stage after stage with tool time in
  between) against an OpenAI-compatible URL, measures every token's arrival at the
  client and scores it with :mod:`jitserve.goodput`; :func:`live_row` turns the result
  into a row of the simulator's bench table (``jitserve.sim.report.table``). Lengths are
  scaled down for a CPU model (``--max-prompt``, ``--max-output``); prompts are token ids
  and ``ignore_eos`` makes the output length exact.
- :func:`measure_proxy_overhead`: added latency per streamed token through the sidecar at
  N concurrent streams. The backend is :class:`TokenSource`, a synthetic
  OpenAI-compatible token source (not a model: it emits one chunk per token at a fixed
  interval and writes each token's emission time, ``time.monotonic_ns()``, as its text),
  run in its own process; the client computes receive time - emission time per token,
  once directly against the source and once through a sidecar in its own process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web

from jitserve.goodput import (
    GoodputLedger,
    LogHistogram,
    Outcome,
    latency_tokens_on_time,
    score_request,
)
from jitserve.requests import Program, Request, Workitem
from jitserve.slo import DeadlineSLO, LatencySLO, SLOKind


# ---- a streaming client ---------------------------------------------------------------------
@dataclass
class StreamResult:
    status: int = 0
    token_times: list[float] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    error: dict[str, Any] | None = None
    finish_reason: str | None = None
    extension: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    start_s: float = 0.0
    end_s: float = 0.0


async def stream_completion(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
                            headers: dict[str, str] | None = None,
                            path: str = "/v1/completions") -> StreamResult:
    """POST a streamed completion and record when each token arrived (monotonic s)."""
    result = StreamResult(start_s=time.monotonic())
    body = {**body, "stream": True, "return_token_ids": True,
            "stream_options": {"include_usage": True}}
    async with session.post(url.rstrip("/") + path, json=body, headers=headers or {}) as resp:
        result.status = resp.status
        result.headers = dict(resp.headers)
        if resp.status != 200:
            try:
                result.error = (await resp.json()).get("error")
            except (aiohttp.ContentTypeError, ValueError):
                result.error = {"message": (await resp.text())[:500]}
            result.end_s = time.monotonic()
            return result
        async for line in resp.content:
            if not line.startswith(b"data: "):
                continue
            payload = line[6:].strip()
            if payload == b"[DONE]":
                break
            now = time.monotonic()
            doc = json.loads(payload)
            if "error" in doc:
                result.error = doc["error"]
                continue
            if "jitserve" in doc:
                result.extension = doc["jitserve"]
            for choice in doc.get("choices") or []:
                ids = choice.get("token_ids") or []
                if ids:
                    result.token_ids.extend(ids)
                    result.token_times.extend([now] * len(ids))
                delta = choice.get("delta")
                text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
                if text:
                    result.texts.append(text)
                if choice.get("finish_reason"):
                    result.finish_reason = choice["finish_reason"]
    result.end_s = time.monotonic()
    return result


# ---- live workload --------------------------------------------------------------------------
RUN_ID = f"{time.time_ns():x}"
"""Prefix of program ids: replays of one workload do not share programs."""

def _prompt_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10, 1000) for _ in range(n)]


def scale_workload(items: list[Workitem], max_prompt: int, max_output: int,
                   tool_scale: float = 0.1) -> list[Workitem]:
    """Cap prompt and output lengths (a CPU model is slow) and shorten tool calls."""
    out: list[Workitem] = []
    for item in items:
        if isinstance(item, Request):
            out.append(replace(item, prompt_tokens=min(item.prompt_tokens, max_prompt),
                               output_tokens=min(item.output_tokens or 1, max_output)))
        else:
            stages = tuple(
                replace(s, tool_s=s.tool_s * tool_scale,
                        calls=tuple(replace(c, prompt_tokens=min(c.prompt_tokens, max_prompt),
                                            output_tokens=min(c.output_tokens, max_output))
                                    for c in s.calls))
                for s in item.stages)
            out.append(replace(item, stages=stages))
    return out


def live_workload(duration_s: float, rate_per_s: float, seed: int = 1, mix: str = "1:1:1",
                  trace: str = "azure-conv", max_prompt: int = 128, max_output: int = 96,
                  ) -> list[Workitem]:
    from jitserve.sim.workload import WorkloadSpec, generate, parse_mix

    spec = WorkloadSpec(trace=trace, mix=parse_mix(mix), arrival="poisson", rate_per_s=rate_per_s,
                        duration_s=duration_s, seed=seed)
    return scale_workload(list(generate(spec)), max_prompt, max_output)


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


@dataclass
class LiveStats:
    requests: int = 0
    errors: int = 0
    retired: int = 0
    preemptions: int = 0
    output_tokens: int = 0
    error_messages: dict[str, int] = field(default_factory=dict)


async def _one_call(session: aiohttp.ClientSession, url: str, model: str | None, req: Request,
                    rng: random.Random, stats: LiveStats, slo: dict[str, Any],
                    ) -> StreamResult:
    body: dict[str, Any] = {"prompt": _prompt_ids(rng, req.prompt_tokens),
                            "max_tokens": req.output_tokens or 1, "ignore_eos": True, "slo": slo}
    if model:
        body["model"] = model
    headers = {"x-tenant": req.tenant}
    try:
        result = await stream_completion(session, url, body, headers)
    except (aiohttp.ClientError, OSError) as err:
        result = StreamResult(status=0, error={"message": str(err)})
    stats.requests += 1
    stats.output_tokens += len(result.token_ids)
    if result.extension:
        stats.preemptions += int(result.extension.get("preemptions") or 0)
    if result.error is not None:
        code = str(result.error.get("code") or result.error.get("type") or result.status)
        stats.error_messages[code] = stats.error_messages.get(code, 0) + 1
        if code in ("slo_unreachable", "waiting_time_exceeded", "queue_full"):
            stats.retired += 1
        else:
            stats.errors += 1
    return result


async def _run_request(session: aiohttp.ClientSession, url: str, model: str | None, req: Request,
                       t0: float, rng: random.Random, ledger: GoodputLedger, stats: LiveStats,
                       ) -> None:
    await asyncio.sleep(max(0.0, t0 + req.arrival_s - time.monotonic()))
    arrival = time.monotonic()
    result = await _one_call(session, url, model, req, rng, stats, _slo_body(req))
    generated = len(result.token_ids)
    finished = result.error is None and result.finish_reason is not None
    now = result.end_s
    slo = req.slo
    ontime = 0
    if isinstance(slo, LatencySLO):
        ontime = latency_tokens_on_time(np.asarray(result.token_times, dtype=np.float64), 0,
                                        arrival, slo.ttft_s, slo.tbt_s)
    assert isinstance(slo, LatencySLO | DeadlineSLO)
    deadline = arrival + (slo.deadline_s if isinstance(slo, DeadlineSLO) else 0.0)
    goodput, met = score_request(slo, req.prompt_tokens, generated, now, deadline, ontime)
    met = met and finished
    goodput = goodput if finished or isinstance(slo, LatencySLO) else 0
    ttft = result.token_times[0] - arrival if result.token_times else None
    ledger.record(Outcome(req.tenant, req.kind, req.slo_class, req.prompt_tokens, generated,
                          goodput, met, not finished, ttft, now - arrival))
    if len(result.token_times) > 1:
        ledger.tbt.add_many(np.diff(np.asarray(result.token_times, dtype=np.float64)))


async def _run_program(session: aiohttp.ClientSession, url: str, model: str | None,
                       program: Program, t0: float, rng: random.Random, ledger: GoodputLedger,
                       stats: LiveStats) -> None:
    await asyncio.sleep(max(0.0, t0 + program.arrival_s - time.monotonic()))
    arrival = time.monotonic()
    ok = True
    tokens_in = tokens_out = 0
    for stage_index, stage in enumerate(program.stages):
        reqs = program.stage_requests(stage_index, time.monotonic())
        results = await asyncio.gather(*(
            _one_call(session, url, model, r, rng, stats, _slo_body(r, program, stage_index))
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
                          now - arrival))


async def run_live(url: str, items: list[Workitem], model: str | None = None, seed: int = 1,
                   connections: int = 512) -> tuple[GoodputLedger, LiveStats, float]:
    """Replay ``items`` (arrival times relative to now) against ``url``; returns the
    ledger, counters and the wall time."""
    ledger = GoodputLedger()
    stats = LiveStats()
    rng = random.Random(seed)
    connector = aiohttp.TCPConnector(limit=connections)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        t0 = time.monotonic()
        tasks = []
        for item in items:
            if isinstance(item, Request):
                tasks.append(_run_request(session, url, model, item, t0, rng, ledger, stats))
            else:
                tasks.append(_run_program(session, url, model, item, t0, rng, ledger, stats))
        await asyncio.gather(*tasks)
        wall = time.monotonic() - t0
    return ledger, stats, wall


def live_row(policy: str, ledger: GoodputLedger, stats: LiveStats, duration_s: float,
             wall_s: float, load: float = 1.0, seed: int = 1,
             scheduler: dict[str, Any] | None = None) -> dict[str, Any]:
    """A row in the format of ``jitserve.sim.bench.run_one``, for ``report.table``."""
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


async def _scheduler_state(session: aiohttp.ClientSession, url: str) -> dict[str, Any] | None:
    try:
        async with session.get(url.rstrip("/") + "/debug/scheduler") as resp:
            if resp.status != 200:
                return None
            doc: dict[str, Any] = await resp.json()
            return doc
    except (aiohttp.ClientError, OSError, ValueError):
        return None


async def switch_policy(url: str, policy_file: Path, policy: str, timeout_s: float = 30.0) -> None:
    """Rewrite ``scheduler.policy`` in the sidecar's (hot-reloaded) policy file and wait
    until the sidecar runs it."""
    import yaml

    doc = yaml.safe_load(policy_file.read_text()) if policy_file.exists() else {}
    doc = doc or {}
    doc.setdefault("scheduler", {})["policy"] = policy
    policy_file.write_text(yaml.safe_dump(doc, sort_keys=True))
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            state = await _scheduler_state(session, url)
            if state and state.get("policy") == policy and not state.get("running"):
                return
            await asyncio.sleep(0.5)
    raise RuntimeError(f"the sidecar at {url} did not switch to policy {policy!r} within "
                       f"{timeout_s:.0f} s (is it watching {policy_file}?)")


def add_bench_live_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True, help="OpenAI-compatible endpoint (the sidecar)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals")
    p.add_argument("--rate", type=float, default=2.0, help="work items per second")
    p.add_argument("--mix", default="1:1:1", help="latency:deadline:compound")
    p.add_argument("--trace", default="azure-conv")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-prompt", type=int, default=128)
    p.add_argument("--max-output", type=int, default=96)
    p.add_argument("--model", default=None)
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
        ledger, stats, wall = await run_live(args.url, items, args.model, args.seed)
        async with aiohttp.ClientSession() as session:
            state = await _scheduler_state(session, args.url)
        name = policy or (state or {}).get("policy") or "endpoint"
        rows.append(live_row(str(name), ledger, stats, args.duration, wall, seed=args.seed,
                             scheduler=state))
        if args.out:
            args.out.write_text(json.dumps(rows, indent=2, default=str))
    return rows


def bench_live_main(args: argparse.Namespace) -> int:
    from jitserve.sim.report import summarize, table

    try:
        rows = asyncio.run(_bench_live(args))
    except (ValueError, RuntimeError) as err:
        from jitserve.cli import CLIError

        raise CLIError(str(err)) from err
    summary = summarize(rows)
    print(table(summary))
    for row in rows:
        if row["errors"] or row["error_codes"]:
            print(f"{row['policy']}: refused/failed by code: {row['error_codes']}")
    if args.markdown:
        from jitserve.sim import report

        to_markdown = getattr(report, "markdown", None)
        if to_markdown is not None:
            print()
            print(to_markdown(summary))
    return 0


# ---- proxy overhead ---------------------------------------------------------------------------
EMIT_MODES = ("step", "spread")


class TokenSource:
    """Synthetic OpenAI-compatible token source for the proxy-overhead benchmark.

    Not a model and not used in place of vLLM in tests: it streams ``max_tokens`` chunks,
    one every ``interval_s``, each chunk's text being its emission time in ns. ``step``:
    all streams emit on the same clock ticks (an engine step produces a token for every
    running sequence at once: the worst case for a proxy); ``spread``: each stream has its
    own random phase (tokens arrive evenly spread, as after a frontend that serialises)."""

    def __init__(self, interval_s: float, emit: str = "step") -> None:
        if emit not in EMIT_MODES:
            raise ValueError(f"emit must be one of {EMIT_MODES}, got {emit!r}")
        self.interval_s = interval_s
        self.emit = emit
        self._rng = random.Random(0)
        self.app = web.Application()
        self.app.add_routes([
            web.get("/health", self.health), web.get("/v1/models", self.models),
            web.post("/tokenize", self.tokenize), web.post("/v1/completions", self.completions)])

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "token-source",
                                                               "object": "model"}]})

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        n = max(1, len(str(body.get("prompt", ""))) // 4)
        return web.json_response({"tokens": list(range(5, 5 + n)), "count": n,
                                  "max_model_len": 1 << 20})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = int(body.get("max_tokens", 16))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        rid = body.get("request_id", "x")
        head = json.dumps({"id": rid, "object": "text_completion", "model": "token-source"})[:-1]
        now = time.monotonic()
        if self.emit == "step":  # every stream emits on the same clock ticks, like an engine step
            next_at = (math.floor(now / self.interval_s) + 1) * self.interval_s
        else:  # each stream on its own phase: arrivals spread evenly over the interval
            next_at = now + self._rng.uniform(0, self.interval_s)
        for i in range(n):
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            next_at += self.interval_s
            finish = '"length"' if i == n - 1 else "null"
            stamp = time.monotonic_ns()
            await resp.write(
                f'data: {head}, "choices": [{{"index": 0, "text": "{stamp}", '
                f'"token_ids": [{7 + i % 500}], "finish_reason": {finish}}}]}}\n\n'.encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def run_token_source(port: int, interval_s: float, emit: str = "step") -> None:
    web.run_app(TokenSource(interval_s, emit).app, host="127.0.0.1", port=port, print=None,
                access_log=None)


async def _measure(url: str, streams: int, tokens: int, path: str = "/v1/completions",
                   ) -> tuple[list[float], int]:
    """Per-token latency (ms): client receive time - source emission time."""
    latencies: list[float] = []
    bad = 0
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=None)) as session:
        async def one(i: int) -> None:
            nonlocal bad
            body = {"prompt": [11, 12, 13, i % 100 + 14], "max_tokens": tokens, "stream": True,
                    "slo": {"kind": "latency", "ttft_ms": 5000, "tbt_ms": 1000}}
            async with session.post(url + path, json=body) as resp:
                if resp.status != 200:
                    bad += 1
                    return
                got = 0
                async for line in resp.content:
                    now = time.monotonic_ns()
                    if not line.startswith(b"data: {"):
                        continue
                    doc = json.loads(line[6:])
                    for choice in doc.get("choices") or []:
                        text = choice.get("text")
                        if text:
                            latencies.append((now - int(text)) / 1e6)
                            got += 1
                if got != tokens:
                    bad += 1

        await asyncio.gather(*(one(i) for i in range(streams)))
    return latencies, bad


def _pcts(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": math.nan, "p99": math.nan, "mean": math.nan}
    arr = np.asarray(values)
    return {"p50": float(np.percentile(arr, 50)), "p99": float(np.percentile(arr, 99)),
            "mean": float(statistics.fmean(values))}


def measure_proxy_overhead(streams: int = 100, tokens: int = 100, interval_s: float = 0.03,
                           policy: str = "gmax", emit: str = "step") -> dict[str, Any]:
    """Start a token source and a sidecar (each its own process) on loopback, measure
    per-token latency directly and through the sidecar, stop both; returns the figures."""
    from jitserve.sidecar.vllm import free_port, start_process, stop_process, wait_http_ok

    source_port, sidecar_port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "policy.yaml"
        config.write_text(f"scheduler:\n  policy: {policy}\n")
        source = start_process([sys.executable, "-m", "jitserve.sidecar.loadgen", "token-source",
                                str(source_port), str(interval_s), emit], None)
        sidecar = start_process([
            sys.executable, "-m", "jitserve.cli", "sidecar", "serve",
            "--backend", f"http://127.0.0.1:{source_port}", "--host", "127.0.0.1",
            "--port", str(sidecar_port), "--max-running", str(max(streams, 1) * 2),
            "--config", str(config), "--log-level", "WARNING"], None)
        try:
            if not wait_http_ok(f"http://127.0.0.1:{source_port}/health", 30, source):
                raise RuntimeError("the token source did not start")
            if not wait_http_ok(f"http://127.0.0.1:{sidecar_port}/ready", 30, sidecar):
                raise RuntimeError("the sidecar did not become ready")
            asyncio.run(_measure(f"http://127.0.0.1:{source_port}", 4, 5))  # warm-up
            asyncio.run(_measure(f"http://127.0.0.1:{sidecar_port}", 4, 5))
            direct, bad_direct = asyncio.run(_measure(f"http://127.0.0.1:{source_port}",
                                                      streams, tokens))
            proxied, bad_proxied = asyncio.run(_measure(f"http://127.0.0.1:{sidecar_port}",
                                                        streams, tokens))
        finally:
            stop_process(sidecar)
            stop_process(source)
    d, p = _pcts(direct), _pcts(proxied)
    return {
        "streams": streams, "tokens_per_stream": tokens, "interval_ms": interval_s * 1000,
        "policy": policy, "emit": emit, "direct_ms": d, "through_sidecar_ms": p,
        "added_ms": {"p50": p["p50"] - d["p50"], "p99": p["p99"] - d["p99"],
                     "mean": p["mean"] - d["mean"]},
        "tokens_measured": {"direct": len(direct), "through_sidecar": len(proxied)},
        "incomplete_streams": {"direct": bad_direct, "through_sidecar": bad_proxied},
    }


def add_proxy_overhead_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--streams", type=int, default=100)
    p.add_argument("--tokens", type=int, default=100, help="tokens per stream")
    p.add_argument("--interval-ms", type=float, default=30.0, help="token interval per stream")
    p.add_argument("--policy", default="gmax")
    p.add_argument("--emit", choices=EMIT_MODES, default="step",
                   help="step: all streams emit on the same ticks; spread: random phases")
    p.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")


def proxy_overhead_main(args: argparse.Namespace) -> int:
    result = measure_proxy_overhead(args.streams, args.tokens, args.interval_ms / 1000, args.policy,
                                    args.emit)
    d, p, a = result["direct_ms"], result["through_sidecar_ms"], result["added_ms"]
    print(f"{result['streams']} concurrent streams x {result['tokens_per_stream']} tokens, "
          f"one token per {result['interval_ms']:.0f} ms per stream ({result['emit']}), "
          f"policy {result['policy']}")
    print(f"{'per-token latency (ms)':<26} {'p50':>8} {'p99':>8} {'mean':>8}")
    print(f"{'direct to the source':<26} {d['p50']:>8.3f} {d['p99']:>8.3f} {d['mean']:>8.3f}")
    print(f"{'through the sidecar':<26} {p['p50']:>8.3f} {p['p99']:>8.3f} {p['mean']:>8.3f}")
    print(f"{'added by the sidecar':<26} {a['p50']:>8.3f} {a['p99']:>8.3f} {a['mean']:>8.3f}")
    if any(result["incomplete_streams"].values()):
        print(f"incomplete streams: {result['incomplete_streams']}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    if len(sys.argv) in (4, 5) and sys.argv[1] == "token-source":
        run_token_source(int(sys.argv[2]), float(sys.argv[3]), *sys.argv[4:5])
    else:
        print("usage: python -m jitserve.sidecar.loadgen token-source PORT INTERVAL_S [EMIT]",
              file=sys.stderr)
        sys.exit(2)
