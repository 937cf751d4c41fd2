"""The endpoint picker's own cost: one ext_proc exchange (request headers + a completion
body in, the header answer + the body back: full-duplex streaming, the protocol's mode)
over loopback gRPC against 8 static replica reports. Prints the sequential latency and
the throughput at a given concurrency; the client runs in the picker's process and event
loop, so both share one core's time (a gateway's Envoy would not).

    PYTHONPATH=. .venv/bin/python scripts/bench_picker.py --placement least-loaded
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from jitserve.gateway.picker import EndpointPicker
from jitserve.placement.registry import make_placer
from tests.support.picker import (
    Connected,
    StaticReports,
    report,
    request_body,
    request_headers,
    running_picker,
)


def quantile_ms(values: list[float], q: float) -> float:
    return sorted(values)[int(q * (len(values) - 1))] * 1e3


async def measure(placement: str, streams: int, concurrency: int) -> str:
    reports = StaticReports([report(f"10.0.0.{i}:8080", outstanding_tokens=100 * i,
                                    at_s=time.time()) for i in range(8)])
    picker = EndpointPicker(reports, make_placer(placement))
    body = json.dumps({"prompt": "hello " * 200, "max_tokens": 64,
                       "slo": {"ttft_ms": 500, "tbt_ms": 50}}).encode()

    async def one(rpc: Connected) -> float:
        start = time.perf_counter()
        await rpc.exchange(request_headers(), request_body(body))
        return time.perf_counter() - start

    async with running_picker(picker) as rpc:
        for _ in range(streams // 10):  # warm up
            await one(rpc)
        sequential = [await one(rpc) for _ in range(streams)]
        limit = asyncio.Semaphore(concurrency)

        async def bounded() -> float:
            async with limit:
                return await one(rpc)

        start = time.perf_counter()
        together = await asyncio.gather(*[bounded() for _ in range(streams)])
        wall = time.perf_counter() - start
    return (f"{placement}: sequential p50 {quantile_ms(sequential, 0.5):.2f} ms, p99 "
            f"{quantile_ms(sequential, 0.99):.2f} ms; {streams} streams at concurrency "
            f"{concurrency}: {streams / wall:.0f} streams/s, p50 "
            f"{quantile_ms(list(together), 0.5):.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--placement", default="least-loaded", help="placement policy")
    parser.add_argument("--streams", type=int, default=2000, help="exchanges per phase")
    parser.add_argument("--concurrency", type=int, default=16, help="streams open at once")
    args = parser.parse_args()
    print(asyncio.run(measure(args.placement, args.streams, args.concurrency)))


if __name__ == "__main__":
    main()
