"""The proxy-overhead benchmark's two ends: a token source and a stamp client (owner: bench).

:class:`TokenSource` stands in for a GPU vLLM (which this machine cannot have): an
OpenAI-compatible server that answers ``/health``, ``/v1/models``, ``/tokenize`` and a
streamed ``/v1/completions`` with one SSE event per token at a fixed interval, each
event's ``text`` being its emission time (``time.monotonic_ns()``), framed as vLLM's
uvicorn frames them (HTTP/1.1 chunked, one chunk per event). :func:`stream_stamps` is
the client: it reads a stream and turns each stamp into receive time - emission time.

Both are written on bare asyncio protocols, not aiohttp, for one reason, measured: the
benchmark must be able to show a sidecar relaying 50,000 tokens/s, and an aiohttp source
plus an aiohttp client (one ``write`` coroutine per token, one ``json.loads`` per line)
saturate their own core near 20,000 tokens/s, where they, not the sidecar, would set the
figure. Here a token costs the source one ``transport.write`` from a timer callback and
the client one regular-expression scan of the bytes it received.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any, cast

from jitserve import sse

EMIT_MODES = ("step", "spread")

_STAMP = re.compile(rb'"(?:text|content)": ?"(\d{9,})"')
_DONE = sse.LAST.encode()


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _json_response(status: str, doc: Any) -> bytes:
    body = json.dumps(doc).encode()
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


@dataclass
class _Stream:
    transport: asyncio.Transport
    head: str
    tokens: int
    next_at: float
    sent: int = 0
    handle: asyncio.Handle | None = None


class TokenSource:
    """The source's shared state: the interval, the emission mode, the clock grid."""

    def __init__(self, interval_s: float, emit: str = "step") -> None:
        if emit not in EMIT_MODES:
            raise ValueError(f"emit must be one of {EMIT_MODES}, got {emit!r}")
        self.interval_s = interval_s
        self.emit = emit
        self.rng = random.Random(0)

    def first_emission(self, loop: asyncio.AbstractEventLoop) -> float:
        now = loop.time()
        if self.emit == "step":  # every stream on the same ticks, like an engine step
            return (math.floor(now / self.interval_s) + 1) * self.interval_s
        return now + self.rng.uniform(0, self.interval_s)  # each stream its own phase

    def protocol(self) -> _SourceConnection:
        return _SourceConnection(self)


class _SourceConnection(asyncio.Protocol):
    """One keep-alive connection: requests parsed one after another (Content-Length
    bodies, as aiohttp's client sends them), a stream answered by timer callbacks."""

    def __init__(self, source: TokenSource) -> None:
        self.source = source
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.stream: _Stream | None = None
        self.close_after = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        if self.stream is not None and self.stream.handle is not None:
            self.stream.handle.cancel()  # the client aborted: emit no more
        self.stream = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while self.stream is None:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].decode("latin-1").split("\r\n")
            fields = {name.strip().lower(): value.strip()
                      for name, _, value in (line.partition(":") for line in head[1:])}
            length = int(fields.get("content-length", 0))
            self.close_after = fields.get("connection", "").lower() == "close"
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4:end + 4 + length]
            self.buffer = self.buffer[end + 4 + length:]
            method, path = head[0].split(" ")[:2]
            self.answer(method, path, json.loads(body) if body else {})
            if self.stream is None and self.close_after:
                self.transport.close()  # type: ignore[union-attr]
                return

    def answer(self, method: str, path: str, body: dict[str, Any]) -> None:
        assert self.transport is not None
        if path == "/health":
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        elif path == "/v1/models":
            self.transport.write(_json_response("200 OK", {
                "object": "list", "data": [{"id": "token-source", "object": "model"}]}))
        elif path == "/tokenize":
            n = max(1, len(str(body.get("prompt", ""))) // 4)
            self.transport.write(_json_response("200 OK", {
                "tokens": list(range(5, 5 + n)), "count": n, "max_model_len": 1 << 20}))
        elif path == "/control" and method == "POST":  # the sweep sets the interval
            self.source.interval_s = float(body["interval_s"])
            self.transport.write(_json_response("200 OK", {"interval_s": self.source.interval_s}))
        elif path == "/v1/completions" and method == "POST":
            self.start_stream(body)
        else:
            self.transport.write(_json_response("404 Not Found", {"error": "not found"}))

    def start_stream(self, body: dict[str, Any]) -> None:
        assert self.transport is not None
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n")
        rid = str(body.get("request_id", "x"))
        head = json.dumps({"id": rid, "object": "text_completion",
                           "model": "token-source"})[:-1]
        loop = asyncio.get_running_loop()
        self.stream = _Stream(self.transport, head, int(body.get("max_tokens", 16)),
                              self.source.first_emission(loop))
        self.stream.handle = loop.call_at(self.stream.next_at, self.emit, self.stream)

    def emit(self, stream: _Stream) -> None:
        if stream is not self.stream:
            return
        i = stream.sent
        last = i == stream.tokens - 1
        finish = '"length"' if last else "null"
        payload = sse.event(f'{stream.head}, "choices": [{{"index": 0, "text": '
                            f'"{time.monotonic_ns()}", "token_ids": [{7 + i % 500}], '
                            f'"finish_reason": {finish}}}]}}').encode()
        if last:
            stream.transport.write(_chunk(payload) + _chunk(_DONE) + b"0\r\n\r\n")
            self.stream = None
            if self.close_after:
                stream.transport.close()
            elif self.buffer:  # a request pipelined behind this one
                self.data_received(b"")
            return
        stream.transport.write(_chunk(payload))
        stream.sent += 1
        # on the grid even when late (uvloop makes a past call_at a call_soon: no when())
        stream.next_at += self.source.interval_s
        stream.handle = asyncio.get_running_loop().call_at(stream.next_at, self.emit, stream)


async def serve_token_source(port: int, interval_s: float, emit: str = "step") -> None:
    source = TokenSource(interval_s, emit)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(source.protocol, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


@dataclass
class StampResult:
    """One stream's per-token latencies (ms) and whether it ended well."""

    latencies_ms: list[float] = field(default_factory=list)
    status: int = 0
    done: bool = False


class _StampReader(asyncio.Protocol):
    def __init__(self, result: StampResult, ended: asyncio.Future[None]) -> None:
        self.result = result
        self.ended = ended
        self.head = b""
        self.tail = b""
        self.in_body = False

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        if not self.in_body:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            self.result.status = int(self.head.split(b" ", 2)[1])
            data, self.in_body = self.head[end + 4:], True
        events, self.tail = sse.split(self.tail + data)  # whole events only; the rest waits
        if not events:
            return
        whole = b"\n\n".join(events)
        self.result.latencies_ms.extend((now - int(stamp)) / 1e6
                                        for stamp in _STAMP.findall(whole))
        if any(sse.data(event) == sse.DONE for event in events):
            self.result.done = True
            if not self.ended.done():
                self.ended.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ended.done():
            self.ended.set_result(None)


async def stream_stamps(host: str, port: int, path: str, body: dict[str, Any],
                        timeout_s: float = 60.0) -> StampResult:
    """POST ``body`` as a streamed request and collect its tokens' latencies; a stream
    not ended within ``timeout_s`` is cut and left not ``done``."""
    loop = asyncio.get_running_loop()
    result = StampResult()
    ended: asyncio.Future[None] = loop.create_future()
    payload = json.dumps(body).encode()
    transport, _ = await loop.create_connection(lambda: _StampReader(result, ended), host, port)
    transport.write((f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
                     f"Connection: close\r\n\r\n").encode() + payload)
    try:
        await asyncio.wait_for(ended, timeout_s)
    except TimeoutError:
        pass
    finally:
        transport.close()
    return result
