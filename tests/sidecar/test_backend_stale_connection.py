"""A dispatch whose pooled connection breaks before any answer is sent again, once per
broken connection, and never after tokens came.

The server here is a FAKE that injects the fault: it hangs up on a request without
answering, as uvicorn does on a keep-alive connection it closes while the client writes.
The real vLLM does this only by a timing race, which a test cannot order.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from jitserve.sidecar.backend import BackendStalled, BackendUnavailable, VLLMBackend


class HangsUpFirst:
    """Answers the first ``hang_ups`` requests by closing the connection, the next one
    with a two-token SSE stream (or, with ``break_mid_stream``, one token then a close)."""

    def __init__(self, hang_ups: int, break_mid_stream: bool = False) -> None:
        self.hang_ups = hang_ups
        self.break_mid_stream = break_mid_stream
        self.requests = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))
        await reader.readexactly(length)
        self.requests += 1
        if self.requests <= self.hang_ups:
            writer.close()
            return
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        events = [{"choices": [{"token_ids": [7], "text": "a", "finish_reason": None}]}]
        if not self.break_mid_stream:
            events.append({"choices": [{"token_ids": [8], "text": "b",
                                        "finish_reason": "length"}]})
        for doc in events:
            data = f"data: {json.dumps(doc)}\n\n".encode()
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        if not self.break_mid_stream:
            done = b"data: [DONE]\n\n"
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
        await writer.drain()
        writer.close()


async def _dispatch(fake: HangsUpFirst) -> list[int]:
    server = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    backend = VLLMBackend(f"http://127.0.0.1:{port}")
    try:
        ids: list[int] = []
        async for chunk in backend.stream("m", [1, 2], 2, {}, 0, "r-1"):
            ids += chunk.token_ids
        return ids
    finally:
        await backend.close()
        server.close()


def test_a_hang_up_before_the_answer_is_sent_again() -> None:
    fake = HangsUpFirst(hang_ups=2)
    assert asyncio.run(_dispatch(fake)) == [7, 8]
    assert fake.requests == 3


def test_hang_ups_past_the_retries_fail_the_dispatch() -> None:
    fake = HangsUpFirst(hang_ups=10)
    with pytest.raises(BackendUnavailable):
        asyncio.run(_dispatch(fake))
    assert fake.requests == 3  # the first send and two more


def test_a_stream_broken_after_tokens_is_not_sent_again() -> None:
    fake = HangsUpFirst(hang_ups=0, break_mid_stream=True)
    with pytest.raises(BackendUnavailable):
        asyncio.run(_dispatch(fake))
    assert fake.requests == 1


def _timing_out_connects(backend: VLLMBackend, failures: int) -> list[int]:
    """The session's connects time out ``failures`` times (a FAULT injected where a real
    one needs a starved event loop), then go through; the list counts the tries."""
    session = backend.session
    real = session.request
    tries = [0]

    def request(*args: Any, **kwargs: Any) -> Any:
        tries[0] += 1
        if tries[0] <= failures:
            raise aiohttp.ConnectionTimeoutError("Connection timeout to host")
        return real(*args, **kwargs)

    session.request = request  # type: ignore[method-assign]
    return tries


@pytest.mark.parametrize("failures", [1, 10])
def test_a_connect_that_timed_out_is_tried_again_and_never_called_a_stall(
        failures: int) -> None:
    async def scenario() -> tuple[list[int], list[int]]:
        fake = HangsUpFirst(hang_ups=0)
        server = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
        backend = VLLMBackend(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        tries = _timing_out_connects(backend, failures)
        try:
            ids: list[int] = []
            async for chunk in backend.stream("m", [1, 2], 2, {}, 0, "r-1"):
                ids += chunk.token_ids
            return ids, tries
        finally:
            await backend.close()
            server.close()

    if failures == 1:
        ids, tries = asyncio.run(scenario())
        assert ids == [7, 8] and tries == [2]
        return
    with pytest.raises(BackendUnavailable) as err:
        asyncio.run(scenario())
    assert not isinstance(err.value, BackendStalled)
    assert "no connection to the model backend within 3 s" in str(err.value)
