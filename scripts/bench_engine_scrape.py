"""What the sidecar's scrape of vLLM's ``/metrics`` costs vLLM (issue 24): a tiny CPU vLLM
streaming under load, scraped 4x a second in full (the old sidecar), 4x a second for the
KV-cache gauge alone (``/metrics/?name[]=...``, the sidecar while a gateway polls), or not
at all (a sidecar no gateway polls). Conditions alternate, ``--rounds`` times; per window:
vLLM's API-server CPU (ms per s, from /proc), output tokens/s of the streams, and the
scrape's latency and size.

    .venv/bin/python scripts/bench_engine_scrape.py --rounds 3 --window 10
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from jitserve.devstack import tinymodel
from jitserve.devstack import vllm as vl
from jitserve.sidecar.replica import KV_QUERY, SCRAPE_S

CONDITIONS = {"none": None, "full": "/metrics", "filtered": KV_QUERY}


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def scrape_loop(session: aiohttp.ClientSession, url: str, stop: asyncio.Event,
                      sizes: list[int], times: list[float]) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        async with session.get(url) as resp:
            sizes.append(len(await resp.read()))
        times.append(time.perf_counter() - started)
        await asyncio.sleep(SCRAPE_S)


async def stream_loop(session: aiohttp.ClientSession, base: str, stop: asyncio.Event,
                      tokens: list[int]) -> None:
    body = {"model": tinymodel.MODEL_NAME, "prompt": [1, 2, 3, 4], "max_tokens": 64, "stream": True,
            "ignore_eos": True}
    while not stop.is_set():
        async with session.post(base + "/v1/completions", json=body) as resp:
            async for line in resp.content:
                if line.startswith(b"data: {"):
                    tokens.append(1)


async def window(base: str, pid: int, path: str | None, seconds: float,
                 streams: int) -> dict[str, float]:
    stop = asyncio.Event()
    sizes: list[int] = []
    times: list[float] = []
    tokens: list[int] = []
    async with aiohttp.ClientSession() as session:
        tasks = [asyncio.create_task(stream_loop(session, base, stop, tokens))
                 for _ in range(streams)]
        await asyncio.sleep(2.0)  # the streams under way
        tokens.clear()
        cpu0, t0 = cpu_s(pid), time.monotonic()
        if path is not None:
            tasks.append(asyncio.create_task(scrape_loop(session, base + path, stop, sizes,
                                                         times)))
        await asyncio.sleep(seconds)
        cpu1, t1 = cpu_s(pid), time.monotonic()
        produced = len(tokens)
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {"api_cpu_ms_per_s": (cpu1 - cpu0) / (t1 - t0) * 1e3,
            "tokens_per_s": produced / (t1 - t0),
            "scrape_ms_p50": statistics.median(times) * 1e3 if times else 0.0,
            "scrape_bytes": statistics.median(sizes) if sizes else 0.0}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds")
    parser.add_argument("--window", type=float, default=10.0, help="seconds per condition")
    parser.add_argument("--streams", type=int, default=8, help="concurrent streams")
    args = parser.parse_args()
    python = vl.vllm_python()
    if python is None:
        raise SystemExit("vLLM is not installed: run scripts/setup-vllm.sh")
    model = vl.ensure_tiny_model(python=python)
    port = vl.free_port()
    cmd = vl.vllm_command(python, model, port, max_num_seqs=16, max_model_len=1024)
    log_path = Path(tempfile.mkdtemp(prefix="jitserve-bench-")) / "vllm.log"
    with log_path.open("ab") as log:
        proc = vl.start_engine(cmd, log, nice=0)
    base = f"http://127.0.0.1:{port}"
    try:
        if not vl.wait_http_ok(base + "/health", 900, proc):
            raise SystemExit(f"vLLM did not start; {log_path}")
        rows: dict[str, list[dict[str, float]]] = {c: [] for c in CONDITIONS}
        for r in range(args.rounds):
            order = list(CONDITIONS) if r % 2 == 0 else list(reversed(CONDITIONS))
            for name in order:
                got = await window(base, proc.pid, CONDITIONS[name], args.window, args.streams)
                rows[name].append(got)
                print(f"round {r + 1} {name:9s} " + "  ".join(
                    f"{k} {v:.1f}" for k, v in got.items()), flush=True)
        print("\nmedians over rounds:")
        print("| scrape | vLLM API-server CPU ms/s | output tokens/s | scrape p50 ms | bytes |")
        print("|---|---|---|---|---|")
        for name, got in rows.items():
            med = {k: statistics.median(g[k] for g in got) for k in got[0]}
            print(f"| {name} | {med['api_cpu_ms_per_s']:.0f} | {med['tokens_per_s']:.0f} | "
                  f"{med['scrape_ms_p50']:.2f} | {med['scrape_bytes']:.0f} |")
    finally:
        vl.stop_process(proc)


if __name__ == "__main__":
    asyncio.run(main())
