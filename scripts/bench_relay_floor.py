"""The floor under the token path: what a Python relay costs per token when it does
nothing but pass bytes (uvloop, asyncio protocols, no parsing, no accounting).

Same harness as ``jitserve sidecar proxy-overhead`` (the token source and the stamp
client of ``jitserve.bench.token_wire``), the relay on ``--relay-cpus``, the source and
client on ``--source-cpus``; prints, per total rate, the added latency and the relay's
CPU per token. docs/benchmarks.md, "The token path at GPU scale", quotes it.

    python scripts/bench_relay_floor.py --sweep 12800,25600,51200
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from typing import Any

from jitserve.bench import overhead
from jitserve.devstack.vllm import free_port


class _Up(asyncio.Protocol):
    def __init__(self, down: asyncio.Transport) -> None:
        self.down = down

    def data_received(self, data: bytes) -> None:
        self.down.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.down.close()


class _Down(asyncio.Protocol):
    """One client connection: its request passed to the source once whole, bytes back."""

    def __init__(self, source_port: int) -> None:
        self.source_port = source_port
        self.buffer = b""
        self.up: asyncio.Transport | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.up is not None:
            self.up.write(data)
            return
        self.buffer += data
        if b"\r\n\r\n" in self.buffer:
            self.connecting = asyncio.ensure_future(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        up, _ = await loop.create_connection(lambda: _Up(self.transport), "127.0.0.1",
                                             self.source_port)
        self.up = up
        up.write(self.buffer)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.up is not None:
            self.up.close()


async def _relay(port: int, source_port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Down(source_port), "127.0.0.1", port,
                                      backlog=1024)
    await server.serve_forever()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--sweep", default="12800,25600,51200", help="total tokens/s, comma-separated")
    p.add_argument("--seconds", type=float, default=3.0, help="length of each run")
    p.add_argument("--relay-cpus", default="1")
    p.add_argument("--source-cpus", default="0")
    p.add_argument("--relay", nargs=2, type=int, metavar=("PORT", "SOURCE_PORT"),
                   help=argparse.SUPPRESS)  # the relay process itself
    args = p.parse_args()
    if args.relay:
        overhead.run_async(_relay(*args.relay))
        return 0
    source_port, relay_port = free_port(), free_port()
    overhead.pin(os.getpid(), overhead.cpu_list(args.source_cpus))
    source = subprocess.Popen([sys.executable, "-m", "jitserve.bench.overhead", "token-source",
                               str(source_port), "0.02", "step"])
    relay = subprocess.Popen([sys.executable, __file__, "--relay", str(relay_port),
                              str(source_port)])
    try:
        time.sleep(2)
        overhead.pin(source.pid, overhead.cpu_list(args.source_cpus))
        overhead.pin(relay.pid, overhead.cpu_list(args.relay_cpus))
        print(f"{'tokens/s':>10} {'added50':>9} {'added99':>9} {'cpu_us/tk':>9}  "
              "(ms; the relay's CPU)")
        for rate in (float(r) for r in args.sweep.split(",")):
            interval = args.streams / rate
            source_url = f"http://127.0.0.1:{source_port}"
            overhead.run_async(overhead.set_source_interval(source_url, interval))
            n = max(10, round(args.seconds / interval))
            direct, _ = overhead.run_async(overhead.measure_stamps(source_url, args.streams, n))
            before = overhead.cpu_s(relay.pid)
            relayed, _ = overhead.run_async(overhead.measure_stamps(
                f"http://127.0.0.1:{relay_port}", args.streams, n))
            cpu = overhead.cpu_s(relay.pid) - before
            d, r = overhead.percentiles(direct), overhead.percentiles(relayed)
            print(f"{rate:>10,.0f} {r['p50'] - d['p50']:>9.3f} {r['p99'] - d['p99']:>9.3f} "
                  f"{cpu / max(len(relayed), 1) * 1e6:>9.1f}", flush=True)
    finally:
        source.kill()
        relay.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
