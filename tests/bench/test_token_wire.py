"""The proxy-overhead harness's two ends against each other: every token stamped and
read once, streams paced by the source's interval, the interval set at run time."""

from __future__ import annotations

import asyncio
import time

from jitserve.bench import overhead, token_wire


async def _streams(port: int, streams: int, tokens: int) -> list[token_wire.StampResult]:
    body = {"prompt": [1, 2, 3], "max_tokens": tokens, "stream": True}
    return await asyncio.gather(*(token_wire.stream_stamps("127.0.0.1", port, "/v1/completions",
                                                           body) for _ in range(streams)))


def test_every_token_is_read_once_and_paced_by_the_interval() -> None:
    async def scenario() -> tuple[list[token_wire.StampResult], float]:
        loop = asyncio.get_running_loop()
        source = token_wire.TokenSource(0.001)
        server = await loop.create_server(source.protocol, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            quick = await _streams(port, 3, 5)
            await overhead.set_source_interval(f"http://127.0.0.1:{port}", 0.05)
            started = time.monotonic()
            paced = await _streams(port, 2, 5)
            return quick + paced, time.monotonic() - started
        finally:
            server.close()

    results, paced_s = asyncio.run(scenario())
    assert all(r.status == 200 and r.done for r in results)
    assert [len(r.latencies_ms) for r in results] == [5] * 5
    assert all(ms >= 0 for r in results for ms in r.latencies_ms)
    assert paced_s >= 4 * 0.05  # five tokens 50 ms apart: sleeping is never faster


def test_cpu_lists_read_as_taskset_writes_them() -> None:
    assert overhead.cpu_list("0") == {0}
    assert overhead.cpu_list("0,2-3") == {0, 2, 3}
