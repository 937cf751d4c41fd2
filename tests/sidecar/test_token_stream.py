"""The token path's stream (``VLLMBackend.open_stream``, read by ``wire.TokenStream``)
against FAKE servers that inject the faults a real vLLM shows only by timing races or a
frozen engine: a hang-up before the answer, a stream cut after tokens, a refused
connection, silence after the first token; and the pooled session's JSON calls, whose
timed-out connects are tried again.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pytest
import uvloop
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from jitserve import sse
from jitserve.sidecar.backend import VLLMBackend
from jitserve.sidecar.upstream import BackendError, BackendStalled, BackendUnavailable
from jitserve.sidecar.wire import TokenStream


class HangsUpFirst:
    """Answers the first ``hang_ups`` requests by closing the connection, the next one
    with a two-token SSE stream (or, with ``break_mid_stream``, one token then a close)."""

    def __init__(self, hang_ups: int, break_mid_stream: bool = False) -> None:
        self.hang_ups = hang_ups
        self.break_mid_stream = break_mid_stream
        self.requests = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:  # a connect given up before it sent anything
            writer.close()
            return
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
            data = sse.json_event(doc).encode()
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        if not self.break_mid_stream:
            done = sse.LAST.encode()
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
        await writer.drain()
        writer.close()


class Heard:
    """A dispatch's sink: the token ids it got and how it ended."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.ended: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()

    def on_chunk(self, token_ids: list[int], text: str, finish_reason: str | None) -> None:
        self.ids += token_ids

    def on_end(self, error: Exception | None) -> None:
        self.ended.set_result(error)


async def _dispatch(fake: HangsUpFirst, **backend_args: Any) -> tuple[list[int], Exception | None]:
    server = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    backend = VLLMBackend(f"http://127.0.0.1:{port}", **backend_args)
    try:
        heard = Heard()
        backend.open_stream("m", [1, 2], 2, {}, 0, "r-1", heard)
        error = await asyncio.wait_for(heard.ended, 30)
        return heard.ids, error
    finally:
        await backend.close()
        server.close()


def test_a_stream_reads_its_tokens_to_done() -> None:
    ids, error = asyncio.run(_dispatch(HangsUpFirst(hang_ups=0)))
    assert ids == [7, 8] and error is None


def test_a_hang_up_before_the_answer_fails_the_dispatch_without_sending_it_again() -> None:
    """Each dispatch has its own connection: a hang-up is vLLM's, not a stale pool's,
    and the request may have reached vLLM, so it is not sent twice."""
    fake = HangsUpFirst(hang_ups=1)
    ids, error = asyncio.run(_dispatch(fake))
    assert isinstance(error, BackendUnavailable) and not isinstance(error, BackendStalled)
    assert ids == [] and fake.requests == 1


def test_a_stream_broken_after_tokens_fails_with_its_tokens_so_far() -> None:
    fake = HangsUpFirst(hang_ups=0, break_mid_stream=True)
    ids, error = asyncio.run(_dispatch(fake))
    assert isinstance(error, BackendUnavailable) and "before [DONE]" in str(error)
    assert ids == [7] and fake.requests == 1


def test_a_refused_connection_is_unavailable_not_stalled() -> None:
    async def scenario() -> Exception | None:
        server = await asyncio.start_server(HangsUpFirst(0).handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        backend = VLLMBackend(f"http://127.0.0.1:{port}")
        heard = Heard()
        backend.open_stream("m", [1, 2], 2, {}, 0, "r-1", heard)
        return await asyncio.wait_for(heard.ended, 30)

    error = asyncio.run(scenario())
    assert isinstance(error, BackendUnavailable) and not isinstance(error, BackendStalled)
    assert "cannot connect" in str(error)


class Silent:
    """FAKE vLLM that answers the head, one token, then nothing (a frozen engine)."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        data = b'data: {"choices": [{"token_ids": [7], "text": "a", "finish_reason": null}]}\n\n'
        writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        await writer.drain()
        await asyncio.sleep(30)


def test_a_stream_that_goes_silent_after_tokens_is_stalled() -> None:
    async def scenario() -> tuple[list[int], Exception | None]:
        server = await asyncio.start_server(Silent().handle, "127.0.0.1", 0)
        backend = VLLMBackend(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}",
                              stall_timeout_s=0.5)
        try:
            heard = Heard()
            backend.open_stream("m", [1, 2], 2, {}, 0, "r-1", heard)
            return heard.ids, await asyncio.wait_for(heard.ended, 30)
        finally:
            server.close()

    ids, error = asyncio.run(scenario())
    assert ids == [7] and isinstance(error, BackendStalled)


@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
@pytest.mark.parametrize("turns", [1, 2, 3])
def test_a_connect_whose_timer_fired_as_it_connected_sends_the_request_once(
        run: Any, turns: int) -> None:
    """A starved event loop (here: blocked on purpose, ``turns`` loop turns into the
    connect) finds the connect's timer expired and the connection made at once. The
    attempt is given up and tried again; the given-up socket must not carry the request
    too (vLLM would run it twice) nor feed this stream its bytes or its close."""
    async def scenario() -> tuple[int, list[int], Exception | None]:
        fake = HangsUpFirst(hang_ups=0)
        server = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
        try:
            heard = Heard()
            stream = TokenStream(heard, b"POST /v1/completions HTTP/1.1\r\n"
                                 b"Content-Length: 2\r\n\r\n{}", stall_timeout_s=30)
            stream.open("127.0.0.1", server.sockets[0].getsockname()[1], 0.1)
            for _ in range(turns):
                await asyncio.sleep(0)
            time.sleep(0.5)  # the loop starved past the connect timeout
            error = await asyncio.wait_for(heard.ended, 30)
            await asyncio.sleep(0.2)  # a second request, if sent, has reached the fake
            return fake.requests, heard.ids, error
        finally:
            server.close()

    requests, ids, error = run(scenario())
    assert requests <= 1
    if error is None:
        assert requests == 1 and ids == [7, 8]
    else:  # every try starved too (a very busy machine): nothing sent, nothing heard
        assert isinstance(error, BackendUnavailable) and "no connection" in str(error)
        assert requests == 0 and ids == []


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
    """The JSON calls (/tokenize, /v1/models) go through the pooled aiohttp session."""
    async def scenario() -> tuple[Any, list[int]]:
        app = web.Application()
        async def models(_: web.Request) -> web.Response:
            return web.json_response({"data": []})

        app.router.add_get("/v1/models", models)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        backend = VLLMBackend(f"http://127.0.0.1:{port}")
        tries = _timing_out_connects(backend, failures)
        try:
            return await backend.models(), tries
        finally:
            await backend.close()
            await runner.cleanup()

    if failures == 1:
        doc, tries = asyncio.run(scenario())
        assert doc == {"data": []} and tries == [2]
        return
    with pytest.raises(BackendUnavailable) as err:
        asyncio.run(scenario())
    assert not isinstance(err.value, BackendStalled)
    assert "no connection to the model backend within 3 s" in str(err.value)


class Recorder:
    """A sink that keeps what it hears, for the framing tests (no event loop needed)."""

    def __init__(self) -> None:
        self.chunks: list[tuple[list[int], str, str | None]] = []
        self.ends: list[Exception | None] = []

    def on_chunk(self, token_ids: list[int], text: str, finish_reason: str | None) -> None:
        self.chunks.append((token_ids, text, finish_reason))

    def on_end(self, error: Exception | None) -> None:
        self.ends.append(error)


class Wire:
    """A transport that records what the stream does with it."""

    def __init__(self) -> None:
        self.written = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    abort = close


def _answer(texts: list[str]) -> bytes:
    """A 200 SSE answer framed as uvicorn frames it: one chunk per event."""
    out = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
           b"transfer-encoding: chunked\r\n\r\n")
    for i, text in enumerate(texts):
        finish = "length" if i == len(texts) - 1 else None
        doc = {"choices": [{"index": 0, "text": text, "token_ids": [100 + i],
                            "finish_reason": finish}]}
        data = sse.json_event(doc).encode()
        out += b"%x\r\n%s\r\n" % (len(data), data)
    done = sse.LAST.encode()
    return out + b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done)


def _feed(answer: bytes, cuts: list[int]) -> Recorder:
    async def scenario() -> Recorder:
        sink = Recorder()
        stream = TokenStream(sink, b"POST / HTTP/1.1\r\n\r\n", stall_timeout_s=None)
        stream.connection_made(Wire())  # type: ignore[arg-type]
        at = 0
        for cut in [*sorted(set(cuts)), len(answer)]:
            stream.data_received(answer[at:cut])
            at = cut
        return sink

    return asyncio.run(scenario())


@settings(max_examples=60, deadline=None)
# vLLM's text is decoded UTF-8: no lone surrogates (which JSON parsers may refuse)
@given(texts=st.lists(st.text(st.characters(blacklist_categories=("Cs",)), max_size=12),
                      min_size=1, max_size=6),
       cut_fractions=st.lists(st.floats(0, 1), max_size=12))
def test_chunked_framing_cut_anywhere_gives_every_event_once(
        texts: list[str], cut_fractions: list[float]) -> None:
    """A TCP read may end anywhere: inside a size line, a payload, its closing CRLF."""
    answer = _answer(texts)
    sink = _feed(answer, [int(f * len(answer)) for f in cut_fractions])
    assert [text for _, text, _ in sink.chunks] == texts
    assert [ids for ids, _, _ in sink.chunks] == [[100 + i] for i in range(len(texts))]
    assert sink.chunks[-1][2] == "length" and sink.ends == [None]


def test_a_refusal_with_a_body_is_the_backends_error_for_this_request() -> None:
    body = json.dumps({"error": {"message": "token id 99999 out of range", "param": "prompt",
                                 "code": 400}}).encode()
    answer = (b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
              b"content-length: %d\r\n\r\n%s" % (len(body), body))
    sink = _feed(answer, [len(answer) // 2])
    (error,) = sink.ends
    assert isinstance(error, BackendError) and error.status == 400
    assert error.param == "prompt" and "out of range" in error.message


def test_an_error_event_inside_a_200_stream_ends_it_as_the_event_says() -> None:
    event = b'data: {"error": {"message": "engine dead", "code": 500}}\n\n'
    answer = (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
              + b"%x\r\n%s\r\n" % (len(event), event))
    (error,) = _feed(answer, []).ends
    assert isinstance(error, BackendUnavailable) and "engine dead" in str(error)
