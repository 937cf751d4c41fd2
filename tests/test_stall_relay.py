"""The relay the vLLM tests build their states with (tests/support/stall.py): held
after its first events, a stream whose origin already wrote it whole reaches the client
with exactly those events, then the rest (release) or nothing more (drop)."""
from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp import web

from jitserve import sse
from tests.support.stall import StallRelay, _after_events, _Conn

EVENTS = 200


async def _origin() -> web.AppRunner:
    async def events(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        for i in range(EVENTS):  # all at once: an origin far ahead of its reader
            await resp.write(sse.json_event({"i": i}).encode())
        await resp.write(sse.LAST.encode())
        return resp

    async def plain(request: web.Request) -> web.Response:
        return web.json_response({"tokens": [1, 2, 3]})

    app = web.Application()
    app.add_routes([web.post("/sse", events), web.post("/json", plain)])
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner


async def _read(resp: aiohttp.ClientResponse) -> tuple[list[int], bool]:
    """The events' numbers, and whether the stream ended cleanly."""
    seen: list[int] = []
    rest = b""
    try:
        async for chunk in resp.content.iter_any():
            events, rest = sse.split(rest + chunk)
            seen += [json.loads(d)["i"] for d in map(sse.data, events) if d and d != sse.DONE]
    except aiohttp.ClientPayloadError:
        return seen, False
    return seen, True


async def _until_held(relay: StallRelay) -> None:
    for _ in range(6000):  # against a hang only
        if relay.held_answers:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the answer was never held")


@pytest.mark.parametrize("then", ["release", "drop"])
def test_an_answer_held_after_its_first_events(then: str) -> None:
    async def scenario() -> tuple[list[int], bool]:
        runner = await _origin()
        port = runner.addresses[0][1]
        with StallRelay(f"http://127.0.0.1:{port}") as relay:
            relay.hold_after(2)
            async with aiohttp.ClientSession() as session:
                async with session.post(relay.url + "/json", json={}) as resp:
                    assert (await resp.json())["tokens"] == [1, 2, 3]  # no events: passes
                async with session.post(relay.url + "/sse", json={}) as resp:
                    await _until_held(relay)
                    (relay.release if then == "release" else relay.drop)()
                    try:
                        return await _read(resp)
                    finally:
                        await runner.cleanup()

    seen, clean = asyncio.run(scenario())
    if then == "release":
        assert clean and seen == list(range(EVENTS))
    else:
        assert not clean and seen == [0, 1]


def test_an_event_end_split_across_two_reads_counts_once() -> None:
    conn = _Conn()
    assert _after_events(conn, b"data: 1\n", 2) == 8 and conn.events == 0
    conn.last = b"\n"
    assert _after_events(conn, b"\ndata: 2\n\ndata: 3\n\n", 2) == 10 and conn.events == 2
    assert _after_events(conn, b"data: 4\n\n", 2) == 0
