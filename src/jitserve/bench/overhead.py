"""Proxy overhead: the latency the sidecar adds per streamed token (owner: bench).

:func:`measure_proxy_overhead` streams N concurrent completions through a sidecar in its
own process and directly against the backend, and reports receive time - emission time per
token for each. The backend is :class:`TokenSource`, a synthetic OpenAI-compatible token
source (not a model: it emits one chunk per token at a fixed interval and writes each
token's emission time, ``time.monotonic_ns()``, as its text), run in its own process.
``jitserve sidecar proxy-overhead`` and ``jitserve bench --proxy-overhead`` call it.

With ``gateway=True`` (``--gateway``) a ``jitserve gateway`` process in front of that
sidecar is measured too, in alternating rounds with the sidecar alone (``--rounds``), and
"added by the gateway" is gateway + sidecar minus the sidecar alone: the gateway's own
cost per token, the figure ISSUE-18 bounds (p99 <= 2 ms at 100 streams).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web

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
        self.app.add_routes(
            [
                web.get("/health", self.health),
                web.get("/v1/models", self.models),
                web.post("/tokenize", self.tokenize),
                web.post("/v1/completions", self.completions),
            ]
        )

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": "token-source", "object": "model"}]}
        )

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        n = max(1, len(str(body.get("prompt", ""))) // 4)
        return web.json_response(
            {"tokens": list(range(5, 5 + n)), "count": n, "max_model_len": 1 << 20}
        )

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
                f'"token_ids": [{7 + i % 500}], "finish_reason": {finish}}}]}}\n\n'.encode()
            )
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def run_token_source(port: int, interval_s: float, emit: str = "step") -> None:
    web.run_app(
        TokenSource(interval_s, emit).app, host="127.0.0.1", port=port, print=None, access_log=None
    )


async def _measure(
    url: str,
    streams: int,
    tokens: int,
    path: str = "/v1/completions",
) -> tuple[list[float], int]:
    """Per-token latency (ms): client receive time - source emission time."""
    latencies: list[float] = []
    bad = 0
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=None)
    ) as session:

        async def one(i: int) -> None:
            nonlocal bad
            body = {
                "prompt": [11, 12, 13, i % 100 + 14],
                "max_tokens": tokens,
                "stream": True,
                "slo": {"kind": "latency", "ttft_ms": 5000, "tbt_ms": 1000},
            }
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


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process ``pid`` used so far (Linux; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pcts(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": math.nan, "p99": math.nan, "mean": math.nan}
    arr = np.asarray(values)
    return {
        "p50": float(np.percentile(arr, 50)),
        "p99": float(np.percentile(arr, 99)),
        "mean": float(statistics.fmean(values)),
    }


def measure_proxy_overhead(
    streams: int = 100,
    tokens: int = 100,
    interval_s: float = 0.03,
    policy: str = "gmax",
    emit: str = "step",
    gateway: bool = False,
    rounds: int = 1,
) -> dict[str, Any]:
    """Start a token source and a sidecar (each its own process; with ``gateway``, a
    gateway in front of the sidecar too) on loopback, measure per-token latency directly,
    through the sidecar (and through gateway + sidecar, the two alternated ``rounds``
    times), stop them; returns the figures."""
    from jitserve.devstack.vllm import free_port, start_process, stop_process, wait_http_ok
    from jitserve.gateway.cli import gateway_command
    from jitserve.sidecar.cli import serve_command

    source_port, sidecar_port, admin_port = free_port(), free_port(), free_port()
    gateway_port, gateway_admin = free_port(), free_port()
    sidecar_url, gateway_url = (f"http://127.0.0.1:{sidecar_port}",
                                f"http://127.0.0.1:{gateway_port}")
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "policy.yaml"
        config.write_text(f"scheduler:\n  policy: {policy}\n")
        source = start_process(
            [
                sys.executable,
                "-m",
                "jitserve.bench.overhead",
                "token-source",
                str(source_port),
                str(interval_s),
                emit,
            ],
            None,
        )
        sidecar = start_process(
            serve_command(f"http://127.0.0.1:{source_port}", sidecar_port, config,
                          max(streams, 1) * 2, extra=["--log-level", "WARNING",
                                                      "--admin-port", str(admin_port)]),
            None,
        )
        front = start_process(gateway_command(
            [(sidecar_url, f"http://127.0.0.1:{admin_port}")], gateway_port, gateway_admin,
            extra=["--log-level", "WARNING"]), None) if gateway else None
        through_gateway: list[float] = []
        bad_gateway = 0
        gateway_cpu_s = 0.0
        try:
            if not wait_http_ok(f"http://127.0.0.1:{source_port}/health", 30, source):
                raise RuntimeError("the token source did not start")
            if not wait_http_ok(f"http://127.0.0.1:{sidecar_port}/ready", 30, sidecar):
                raise RuntimeError("the sidecar did not become ready")
            asyncio.run(_measure(f"http://127.0.0.1:{source_port}", 4, 5))  # warm-up
            asyncio.run(_measure(f"http://127.0.0.1:{sidecar_port}", 4, 5))
            if front is not None:
                if not wait_http_ok(f"http://127.0.0.1:{gateway_admin}/ready", 30, front):
                    raise RuntimeError("the gateway did not become ready")
                asyncio.run(_measure(gateway_url, 4, 5))
            direct, bad_direct = asyncio.run(
                _measure(f"http://127.0.0.1:{source_port}", streams, tokens)
            )
            proxied: list[float] = []
            bad_proxied = 0
            for _ in range(max(rounds, 1) if front is not None else 1):
                got, bad = asyncio.run(_measure(sidecar_url, streams, tokens))
                proxied += got
                bad_proxied += bad
                if front is not None:
                    before = cpu_s(front.pid)
                    got, bad = asyncio.run(_measure(gateway_url, streams, tokens))
                    gateway_cpu_s += cpu_s(front.pid) - before
                    through_gateway += got
                    bad_gateway += bad
        finally:
            if front is not None:
                stop_process(front)
            stop_process(sidecar)
            stop_process(source)
    d, p = _pcts(direct), _pcts(proxied)
    result: dict[str, Any] = {
        "streams": streams,
        "tokens_per_stream": tokens,
        "interval_ms": interval_s * 1000,
        "policy": policy,
        "emit": emit,
        "direct_ms": d,
        "through_sidecar_ms": p,
        "added_ms": {
            "p50": p["p50"] - d["p50"],
            "p99": p["p99"] - d["p99"],
            "mean": p["mean"] - d["mean"],
        },
        "tokens_measured": {"direct": len(direct), "through_sidecar": len(proxied)},
        "incomplete_streams": {"direct": bad_direct, "through_sidecar": bad_proxied},
    }
    if gateway:
        g = _pcts(through_gateway)
        result["rounds"] = rounds
        result["through_gateway_ms"] = g
        result["gateway_added_ms"] = {k: g[k] - p[k] for k in ("p50", "p99", "mean")}
        result["tokens_measured"]["through_gateway"] = len(through_gateway)
        result["incomplete_streams"]["through_gateway"] = bad_gateway
        result["gateway_cpu_us_per_token"] = gateway_cpu_s / max(len(through_gateway), 1) * 1e6
    return result


def add_proxy_overhead_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--streams", type=int, default=100, help="concurrent streams")
    p.add_argument("--tokens", type=int, default=100, help="tokens per stream")
    p.add_argument("--interval-ms", type=float, default=30.0, metavar="MS",
                   help="milliseconds between a stream's tokens")
    p.add_argument("--policy", default="gmax", help="the sidecar's scheduler")
    p.add_argument(
        "--emit",
        choices=EMIT_MODES,
        default="step",
        help="step: all streams emit on the same ticks; spread: random phases",
    )
    p.add_argument("--gateway", action="store_true",
                   help="also measure through jitserve gateway in front of the sidecar "
                   "(added by the gateway: gateway + sidecar minus the sidecar alone)")
    p.add_argument("--rounds", type=int, default=2,
                   help="with --gateway: sidecar-alone and gateway runs, alternated")
    p.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")


def proxy_overhead_main(args: argparse.Namespace) -> int:
    result = measure_proxy_overhead(
        args.streams, args.tokens, args.interval_ms / 1000, args.policy, args.emit,
        gateway=args.gateway, rounds=args.rounds,
    )
    d, p, a = result["direct_ms"], result["through_sidecar_ms"], result["added_ms"]
    print(
        f"{result['streams']} concurrent streams x {result['tokens_per_stream']} tokens, "
        f"one token per {result['interval_ms']:.0f} ms per stream ({result['emit']}), "
        f"policy {result['policy']}"
    )
    print(f"{'per-token latency (ms)':<26} {'p50':>8} {'p99':>8} {'mean':>8}")
    print(f"{'direct to the source':<26} {d['p50']:>8.3f} {d['p99']:>8.3f} {d['mean']:>8.3f}")
    print(f"{'through the sidecar':<26} {p['p50']:>8.3f} {p['p99']:>8.3f} {p['mean']:>8.3f}")
    print(f"{'added by the sidecar':<26} {a['p50']:>8.3f} {a['p99']:>8.3f} {a['mean']:>8.3f}")
    if "through_gateway_ms" in result:
        g, ga = result["through_gateway_ms"], result["gateway_added_ms"]
        print(f"{'through gateway + sidecar':<26} {g['p50']:>8.3f} {g['p99']:>8.3f} "
              f"{g['mean']:>8.3f}")
        print(f"{'added by the gateway':<26} {ga['p50']:>8.3f} {ga['p99']:>8.3f} "
              f"{ga['mean']:>8.3f}")
        print(f"the gateway's CPU per token: {result['gateway_cpu_us_per_token']:.0f} us")
    if any(result["incomplete_streams"].values()):
        print(f"incomplete streams: {result['incomplete_streams']}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return 0


def register_under_sidecar(sidecar_commands: Any) -> None:
    """``jitserve sidecar proxy-overhead`` (``jitserve bench --proxy-overhead`` is its
    deprecated alias)."""
    overhead = sidecar_commands.add_parser(
        "proxy-overhead", help="added latency per streamed token through the sidecar"
    )
    add_proxy_overhead_arguments(overhead)
    overhead.set_defaults(handler=proxy_overhead_main)

if __name__ == "__main__":
    if len(sys.argv) in (4, 5) and sys.argv[1] == "token-source":
        run_token_source(int(sys.argv[2]), float(sys.argv[3]), *sys.argv[4:5])
    else:
        print(
            "usage: python -m jitserve.bench.overhead token-source PORT INTERVAL_S [EMIT]",
            file=sys.stderr,
        )
        sys.exit(2)
