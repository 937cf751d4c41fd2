"""Proxy overhead: the latency the sidecar adds per streamed token (owner: bench).

:func:`measure_proxy_overhead` streams N concurrent completions through a sidecar in its
own process and directly against the backend, and reports receive time - emission time per
token for each, and the sidecar's CPU per relayed token. The backend is
:class:`jitserve.bench.token_wire.TokenSource` (not a model: one chunk per token at a
fixed interval, each token's emission time as its text) in its own process; ``--sweep``
measures one point per total rate and reports the knee; ``--sidecar-cpus`` /
``--source-cpus`` pin the processes (the source and this client on one set, the proxies
on the other), as ``taskset`` does. ``jitserve sidecar proxy-overhead`` and ``jitserve
bench --proxy-overhead`` call it.

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
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from jitserve.bench import token_wire

# ---- proxy overhead ---------------------------------------------------------------------------
EMIT_MODES = token_wire.EMIT_MODES
TokenSource = token_wire.TokenSource


def run_token_source(port: int, interval_s: float, emit: str = "step") -> None:
    run_async(token_wire.serve_token_source(port, interval_s, emit))


def run_async(main: Any) -> Any:
    """``asyncio.run`` on uvloop where it is installed (the sidecar runs on it too)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


async def measure_stamps(url: str, streams: int, tokens: int,
                   path: str = "/v1/completions") -> tuple[list[float], int]:
    """Per-token latency (ms): client receive time - source emission time; and how many
    streams did not end with all their tokens."""
    host, port = url.removeprefix("http://").rsplit(":", 1)

    async def one(i: int) -> token_wire.StampResult:
        body = {"prompt": [11, 12, 13, i % 100 + 14], "max_tokens": tokens, "stream": True,
                "slo": {"kind": "latency", "ttft_ms": 5000, "tbt_ms": 1000}}
        return await token_wire.stream_stamps(host, int(port), path, body)

    results = await asyncio.gather(*(one(i) for i in range(streams)))
    latencies = [ms for r in results for ms in r.latencies_ms]
    bad = sum(1 for r in results if r.status != 200 or not r.done
              or len(r.latencies_ms) != tokens)
    return latencies, bad


async def set_source_interval(url: str, interval_s: float) -> None:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    body = json.dumps({"interval_s": interval_s}).encode()
    writer.write(f"POST /control HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n"
                 f"Connection: close\r\n\r\n".encode() + body)
    await reader.read()
    writer.close()


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process ``pid`` used so far (Linux; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": math.nan, "p99": math.nan, "mean": math.nan}
    arr = np.asarray(values)
    return {
        "p50": float(np.percentile(arr, 50)),
        "p99": float(np.percentile(arr, 99)),
        "mean": float(statistics.fmean(values)),
    }


def pin(pid: int, cpus: set[int] | None) -> None:
    """Pin ``pid`` (all its threads) to ``cpus``, as ``taskset -a -p`` does."""
    if cpus is None or not hasattr(os, "sched_setaffinity"):
        return
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), cpus)


class Rig:
    """A token source and a sidecar (and with ``gateway``, a gateway in front of it), each
    its own process on loopback; the source and this client on ``source_cpus``, the
    sidecar and gateway on ``sidecar_cpus`` (None: anywhere)."""

    def __init__(self, interval_s: float, policy: str, emit: str, max_running: int, *,
                 gateway: bool = False, sidecar_cpus: set[int] | None = None,
                 source_cpus: set[int] | None = None) -> None:
        from jitserve.devstack.vllm import free_port

        self.interval_s, self.policy, self.emit = interval_s, policy, emit
        self.max_running, self.gateway = max_running, gateway
        self.sidecar_cpus, self.source_cpus = sidecar_cpus, source_cpus
        ports = [free_port() for _ in range(5)]
        self.source_port, self.sidecar_port, self.admin_port = ports[:3]
        self.gateway_port, self.gateway_admin = ports[3:]
        self.source_url = f"http://127.0.0.1:{self.source_port}"
        self.sidecar_url = f"http://127.0.0.1:{self.sidecar_port}"
        self.gateway_url = f"http://127.0.0.1:{self.gateway_port}"
        self.procs: list[Any] = []

    def __enter__(self) -> Rig:
        from jitserve.devstack.vllm import start_process, wait_http_ok
        from jitserve.gateway.cli import gateway_command
        from jitserve.sidecar.cli import serve_command

        self.tmp = tempfile.TemporaryDirectory()
        config = Path(self.tmp.name) / "policy.yaml"
        config.write_text(f"scheduler:\n  policy: {self.policy}\n")
        pin(os.getpid(), self.source_cpus)
        try:
            self.source = start_process([sys.executable, "-m", "jitserve.bench.overhead",
                                         "token-source", str(self.source_port),
                                         str(self.interval_s), self.emit], None)
            self.procs.append(self.source)
            self.sidecar = start_process(serve_command(
                self.source_url, self.sidecar_port, config, self.max_running,
                extra=["--log-level", "WARNING", "--admin-port", str(self.admin_port)]), None)
            self.procs.append(self.sidecar)
            self.front = start_process(gateway_command(
                [(self.sidecar_url, f"http://127.0.0.1:{self.admin_port}")], self.gateway_port,
                self.gateway_admin, extra=["--log-level", "WARNING"]), None) \
                if self.gateway else None
            if self.front is not None:
                self.procs.append(self.front)
            if not wait_http_ok(f"{self.source_url}/health", 30, self.source):
                raise RuntimeError("the token source did not start")
            if not wait_http_ok(f"{self.sidecar_url}/ready", 30, self.sidecar):
                raise RuntimeError("the sidecar did not become ready")
            if self.front is not None and not wait_http_ok(
                    f"http://127.0.0.1:{self.gateway_admin}/ready", 30, self.front):
                raise RuntimeError("the gateway did not become ready")
            pin(self.source.pid, self.source_cpus)
            for proc in self.procs[1:]:
                pin(proc.pid, self.sidecar_cpus)
            for url in self.urls().values():  # warm-up: connections, first-call paths
                run_async(measure_stamps(url, 4, 5))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        from jitserve.devstack.vllm import stop_process

        for proc in reversed(self.procs):
            stop_process(proc)
        self.tmp.cleanup()

    def urls(self) -> dict[str, str]:
        urls = {"direct": self.source_url, "through_sidecar": self.sidecar_url}
        if self.front is not None:
            urls["through_gateway"] = self.gateway_url
        return urls

    def set_interval(self, interval_s: float) -> None:
        run_async(set_source_interval(self.source_url, interval_s))

    def run(self, path: str, streams: int, tokens: int) -> tuple[list[float], int, float]:
        """One run along ``path`` (a key of :meth:`urls`): latencies (ms), incomplete
        streams, and the CPU seconds the proxies on that path used meanwhile."""
        routes: dict[str, list[Any]] = {"direct": [], "through_sidecar": [self.sidecar],
                                        "through_gateway": [self.sidecar, self.front]}
        proxies = routes[path]
        before = sum(cpu_s(p.pid) for p in proxies)
        latencies, bad = run_async(measure_stamps(self.urls()[path], streams, tokens))
        return latencies, bad, sum(cpu_s(p.pid) for p in proxies) - before


def measure_point(rig: Rig, streams: int, tokens: int, rounds: int) -> dict[str, Any]:
    """Every path of ``rig`` at its source's current interval, alternated ``rounds``
    times: latency percentiles, added latency, CPU per relayed token."""
    latencies: dict[str, list[float]] = {path: [] for path in rig.urls()}
    bad = dict.fromkeys(latencies, 0)
    cpu = dict.fromkeys(latencies, 0.0)
    for _ in range(max(rounds, 1)):
        for path in latencies:
            got, incomplete, used = rig.run(path, streams, tokens)
            latencies[path] += got
            bad[path] += incomplete
            cpu[path] += used
    pcts = {path: percentiles(values) for path, values in latencies.items()}
    d, p = pcts["direct"], pcts["through_sidecar"]
    result: dict[str, Any] = {
        "tokens_per_s": streams / rig.interval_s,
        "interval_ms": rig.interval_s * 1000,
        "direct_ms": d,
        "through_sidecar_ms": p,
        "added_ms": {k: p[k] - d[k] for k in ("p50", "p99", "mean")},
        "sidecar_cpu_us_per_token": cpu["through_sidecar"]
        / max(len(latencies["through_sidecar"]), 1) * 1e6,
        "tokens_measured": {path: len(values) for path, values in latencies.items()},
        "incomplete_streams": bad,
    }
    if "through_gateway" in pcts:
        g = pcts["through_gateway"]
        result["through_gateway_ms"] = g
        result["gateway_added_ms"] = {k: g[k] - p[k] for k in ("p50", "p99", "mean")}
        n = max(len(latencies["through_gateway"]), 1)
        # the gateway run's CPU counts the sidecar too; the sidecar's own share is known
        result["gateway_cpu_us_per_token"] = (cpu["through_gateway"] / n * 1e6
                                              - result["sidecar_cpu_us_per_token"])
    return result


def measure_proxy_overhead(
    streams: int = 100,
    tokens: int = 100,
    interval_s: float = 0.03,
    policy: str = "gmax",
    emit: str = "step",
    gateway: bool = False,
    rounds: int = 1,
    sidecar_cpus: set[int] | None = None,
    source_cpus: set[int] | None = None,
    sweep: list[float] | None = None,
    sweep_seconds: float = 3.0,
) -> dict[str, Any]:
    """Start the rig, measure one point (or, with ``sweep``, one point per total rate in
    tokens/s, each ~``sweep_seconds`` long), stop it; returns the figures."""
    with Rig(interval_s, policy, emit, max(streams, 1) * 2, gateway=gateway,
             sidecar_cpus=sidecar_cpus, source_cpus=source_cpus) as rig:
        result: dict[str, Any] = {"streams": streams, "policy": policy, "emit": emit,
                                  "rounds": rounds,
                                  "sidecar_cpus": sorted(sidecar_cpus or ()),
                                  "source_cpus": sorted(source_cpus or ())}
        if not sweep:
            result.update(measure_point(rig, streams, tokens, rounds),
                          tokens_per_stream=tokens)
            return result
        points = []
        for rate in sweep:
            interval = streams / rate
            rig.set_interval(interval)
            rig.interval_s = interval
            n = max(10, round(sweep_seconds / interval))
            point = measure_point(rig, streams, n, rounds)
            point["tokens_per_stream"] = n
            points.append(point)
            print(_point_line(point), file=sys.stderr, flush=True)
        result["sweep"] = points
        under = [pt["tokens_per_s"] for pt in points
                 if pt["added_ms"]["p99"] <= KNEE_P99_MS and not any(
                     pt["incomplete_streams"].values())]
        result["knee_tokens_per_s"] = max(under) if under else 0.0
        return result


KNEE_P99_MS = 10.0
"""The sweep's knee: the highest rate whose added p99 stays within this."""


def _point_line(pt: dict[str, Any]) -> str:
    a, d = pt["added_ms"], pt["direct_ms"]
    return (f"{pt['tokens_per_s']:>10,.0f} {d['p50']:>9.3f} {d['p99']:>9.3f} "
            f"{a['p50']:>9.3f} {a['p99']:>9.3f} {pt['sidecar_cpu_us_per_token']:>9.1f}")


def cpu_list(text: str) -> set[int]:
    """A taskset-style CPU list: ``0``, ``0,2``, ``0-3``."""
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a CPU list: {text!r} (e.g. 0,2 or 0-3)") from None
    return cpus


def _rates(text: str) -> list[float]:
    try:
        return [float(r) for r in text.split(",") if r]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of tokens/s: {text!r}") from None


def add_proxy_overhead_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    p.add_argument("--streams", type=int, default=100, help="concurrent streams")
    p.add_argument("--tokens", type=int, default=100, help="tokens per stream")
    p.add_argument("--interval-ms", type=float, default=30.0, metavar="MS",
                   help="milliseconds between a stream's tokens")
    p.add_argument("--policy", default="gmax", help="the sidecar's scheduler")
    p.add_argument("--emit", choices=EMIT_MODES, default="step",
                   help="step: all streams emit on the same ticks; spread: random phases")
    p.add_argument("--gateway", action="store_true",
                   help="also measure through jitserve gateway in front of the sidecar "
                   "(added by the gateway: gateway + sidecar minus the sidecar alone)")
    p.add_argument("--rounds", type=int, default=2,
                   help="runs of each path (direct, sidecar, gateway), alternated")
    p.add_argument("--sidecar-cpus", type=cpu_list, default=None, metavar="LIST",
                   help="pin the sidecar (and gateway) to these CPUs, as taskset does "
                   "(default: unpinned)")
    p.add_argument("--source-cpus", type=cpu_list, default=None, metavar="LIST",
                   help="pin the token source and the client to these CPUs")
    p.add_argument("--sweep", type=_rates, default=None, metavar="TOKENS_PER_S,...",
                   help="measure at each total rate (the interval is streams / rate; "
                   "--tokens then follows from --sweep-seconds) and report the knee, the "
                   f"highest rate whose added p99 stays within {KNEE_P99_MS:g} ms")
    p.add_argument("--sweep-seconds", type=float, default=3.0, metavar="S",
                   help="length of each sweep run")
    p.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")


def proxy_overhead_main(args: argparse.Namespace) -> int:
    result = measure_proxy_overhead(
        args.streams, args.tokens, args.interval_ms / 1000, args.policy, args.emit,
        gateway=args.gateway, rounds=args.rounds, sidecar_cpus=args.sidecar_cpus,
        source_cpus=args.source_cpus, sweep=args.sweep, sweep_seconds=args.sweep_seconds)
    pinned = (f"sidecar on CPUs {result['sidecar_cpus']}, source and client on "
              f"{result['source_cpus']}" if result["sidecar_cpus"] else "unpinned")
    if "sweep" in result:
        print(f"{result['streams']} concurrent streams ({result['emit']}), policy "
              f"{result['policy']}, {pinned}, {result['rounds']} rounds per rate")
        print(f"{'tokens/s':>10} {'direct50':>9} {'direct99':>9} {'added50':>9} "
              f"{'added99':>9} {'cpu_us/tk':>9}   (ms; CPU: the sidecar's, per token)")
        for pt in result["sweep"]:
            print(_point_line(pt))
        print(f"knee: {result['knee_tokens_per_s']:,.0f} tokens/s (the highest rate with "
              f"added p99 <= {KNEE_P99_MS:g} ms and every stream complete)")
    else:
        d, p, a = result["direct_ms"], result["through_sidecar_ms"], result["added_ms"]
        print(f"{result['streams']} concurrent streams x {result['tokens_per_stream']} tokens, "
              f"one token per {result['interval_ms']:g} ms per stream ({result['emit']}, "
              f"{result['tokens_per_s']:,.0f} tokens/s), policy {result['policy']}, {pinned}")
        print(f"{'per-token latency (ms)':<26} {'p50':>8} {'p99':>8} {'mean':>8}")
        rows = [("direct to the source", d), ("through the sidecar", p),
                ("added by the sidecar", a)]
        if "through_gateway_ms" in result:
            rows += [("through gateway + sidecar", result["through_gateway_ms"]),
                     ("added by the gateway", result["gateway_added_ms"])]
        for name, row in rows:
            print(f"{name:<26} {row['p50']:>8.3f} {row['p99']:>8.3f} {row['mean']:>8.3f}")
        print(f"the sidecar's CPU per token: {result['sidecar_cpu_us_per_token']:.1f} us")
        if "gateway_cpu_us_per_token" in result:
            print(f"the gateway's CPU per token: {result['gateway_cpu_us_per_token']:.1f} us")
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
