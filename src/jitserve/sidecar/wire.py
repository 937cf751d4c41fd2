"""One dispatch's token stream from vLLM, read by an asyncio protocol (owner: sidecar).

Every output token crosses this module, so it does the least per token: vLLM's bytes
are read in the event loop's ``data_received`` callback (no coroutine woken per read,
no client library's stream reader), HTTP/1.1 chunked framing is undone in place, each
SSE event's JSON is decoded once (orjson: 0.9 us against the standard library's 3.9 us
for a vLLM event, measured), and the sink (:class:`DispatchSink`) is called
synchronously. Measured (docs/benchmarks.md, "The token path"): the aiohttp client's
read path (``readany`` waking the dispatch's task per token) cost more CPU per token
than everything this module does.

Each dispatch opens its own connection and asks vLLM to close it at the end
(``Connection: close``): no pool, so no keep-alive connection that vLLM closed while
idle can swallow a dispatch; a connect costs ~0.1 ms, once per dispatch, not per token.

Errors, as :mod:`jitserve.sidecar.backend` names them: no connection or a broken stream
is :class:`BackendUnavailable`; a stream whose tokens flowed and then went silent for
the stall timeout, or whose head never came, :class:`BackendStalled`; a 4xx answer or a
4xx error event, :class:`BackendError`. :meth:`TokenStream.abort` drops the connection
and calls nothing back: vLLM aborts the request on the disconnect.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import socket
from typing import Any, Protocol, cast

import orjson

from jitserve import sse
from jitserve.sidecar.upstream import (
    BackendError,
    BackendStalled,
    BackendUnavailable,
    error_message,
    stream_error,
)

log = logging.getLogger("jitserve.sidecar")

CONNECT_TRIES = 3
"""Connects tried per dispatch when one times out (on a starved machine the connect's
timer can fire before the loop sees the connection made). Only the socket is tried again:
the request is written once, on the socket that connected."""

MAX_HEAD_BYTES = 64 * 1024


class DispatchSink(Protocol):
    """Who hears a dispatch (:class:`jitserve.sidecar.streams.TokenDispatch`)."""

    def on_chunk(self, token_ids: list[int], text: str, finish_reason: str | None) -> None: ...

    def on_end(self, error: Exception | None) -> None:
        """The stream ended: ``None`` after ``[DONE]``, else what broke it."""


def request_bytes(host: str, path: str, body: dict[str, Any], headers: dict[str, str]) -> bytes:
    payload = json.dumps(body).encode()
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", "Content-Type: application/json",
             f"Content-Length: {len(payload)}", "Accept: text/event-stream",
             "Connection: close", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


class TokenStream(asyncio.Protocol):
    """A streamed ``POST`` to vLLM and its SSE events, handed to ``sink`` as they come."""

    def __init__(self, sink: DispatchSink, request: bytes, stall_timeout_s: float | None) -> None:
        self.sink = sink
        self.request = request
        self.stall_s = stall_timeout_s
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.connecting: asyncio.Task[None] | None = None
        self.head: bytes | None = b""  # None once the head is parsed
        self.status = 0
        self.chunked = False
        self.length: int | None = None  # an error answer's Content-Length
        self.framed = b""  # a chunk size line not yet whole
        self.chunk_left = 0  # payload bytes of the current chunk still to come
        self.skip = 0  # bytes of the CRLF closing the current chunk still to come
        self.refusal = b""  # the body of an answer other than 200
        self.events = b""  # SSE bytes not yet split into whole events
        self.flowing = False
        self.ended = False
        self.last_data_s = 0.0
        self.timer: asyncio.TimerHandle | None = None

    # ---- opening and closing ------------------------------------------------------------
    def open(self, host: str, port: int, connect_timeout_s: float) -> None:
        self.connecting = self.loop.create_task(self._connect(host, port, connect_timeout_s))

    async def _connect(self, host: str, port: int, timeout_s: float) -> None:
        """Connect a socket (tried again on a timeout), then attach this protocol to it
        once: an attempt that timed out never had the protocol, so its late connection
        cannot write the request a second time or feed this stream another's bytes."""
        try:
            family, address = await self._resolve(host, port)
        except OSError as err:
            self._end(BackendUnavailable(f"cannot resolve the model backend {host}: {err}"))
            return
        for attempt in range(CONNECT_TRIES):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                async with asyncio.timeout(timeout_s):
                    await self.loop.sock_connect(sock, address)
            except TimeoutError:
                sock.close()
                if attempt + 1 < CONNECT_TRIES:
                    log.info("no connection to %s:%d within %g s; trying again", host, port,
                             timeout_s)
                continue
            except OSError as err:  # refused, unreachable: down, not slow
                sock.close()
                self._end(BackendUnavailable(f"cannot connect to the model backend: {err}"))
                return
            except asyncio.CancelledError:  # abort()
                sock.close()
                raise
            try:
                await self.loop.create_connection(lambda: self, sock=sock)
            except OSError as err:
                sock.close()
                self._end(BackendUnavailable(f"cannot connect to the model backend: {err}"))
            return
        self._end(BackendUnavailable(f"no connection to the model backend within "
                                     f"{timeout_s:g} s"))

    async def _resolve(self, host: str, port: int) -> tuple[int, tuple[Any, ...]]:
        """The address to connect to: an IP literal (the pod's own vLLM) as it is, a name
        through the resolver (the first address, as a plain connect would take)."""
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            infos = await self.loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            if not infos:
                raise OSError(f"no address for {host}") from None
            family, _, _, _, address = infos[0]
            return family, address
        return (socket.AF_INET6, (host, port, 0, 0)) if ip.version == 6 else (
            socket.AF_INET, (host, port))

    def abort(self) -> None:
        """Drop the stream and tell no one (the dispatcher ended it: preempted, cancelled)."""
        self.ended = True
        if self.connecting is not None and not self.connecting.done():
            self.connecting.cancel()
        self._stop_timer()
        if self.transport is not None:
            self.transport.abort()

    def _end(self, error: Exception | None) -> None:
        if self.ended:
            return
        self.ended = True
        self._stop_timer()
        if self.transport is not None:
            if error is None:
                self.transport.close()
            else:
                self.transport.abort()
        self.sink.on_end(error)

    # ---- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        if self.ended:  # aborted while connecting
            self.transport.abort()
            return
        self.transport.write(self.request)
        self._arm(self.stall_s)  # the head must come within the stall timeout

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ended and self.status not in (0, 200):
            self._refused()
        if not self.ended:
            why = f": {exc}" if exc else ""
            self._end(BackendUnavailable(f"backend stream ended before [DONE]{why}"))

    def data_received(self, data: bytes) -> None:
        if self.ended:
            return
        self.last_data_s = self.loop.time()
        try:
            if self.head is not None:
                data = self._read_head(data)
                if self.head is not None:
                    return
            if self.status != 200:
                self.refusal += data
                if self.length is not None and len(self.refusal) >= self.length:
                    self._refused()
                return  # else read to its end (eof_received)
            if self.chunked:
                data = self._unframe(data)
            if data:
                self.events += data
                self._read_events()
        except (ValueError, UnicodeDecodeError) as err:  # orjson.JSONDecodeError is one
            self._end(BackendUnavailable(f"backend stream broke: {type(err).__name__}: {err}"))
        except (BackendError, BackendUnavailable) as err:
            self._end(err)

    def eof_received(self) -> bool | None:
        if self.status not in (0, 200) and not self.ended:
            self._refused()
        return None

    # ---- parsing ------------------------------------------------------------------------
    def _read_head(self, data: bytes) -> bytes:
        assert self.head is not None
        self.head += data
        end = self.head.find(b"\r\n\r\n")
        if end < 0:
            if len(self.head) > MAX_HEAD_BYTES:
                raise ValueError("answer head too large")
            return b""
        lines = self.head[:end].decode("latin-1").split("\r\n")
        rest = self.head[end + 4:]
        self.head = None
        self.status = int(lines[0].split(" ", 2)[1])
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "transfer-encoding" and "chunked" in value.lower():
                self.chunked = True
            elif name == "content-length":
                self.length = int(value)
        if self.status != 200:
            self._stop_timer()
        return rest

    def _unframe(self, data: bytes) -> bytes:
        """The chunk payload bytes in ``data``, a chunk's part as soon as it is here (a
        TCP read may end anywhere); a size line cut in two waits in ``framed``."""
        out: list[bytes] = []
        buf = self.framed + data if self.framed else data
        pos, end = 0, len(buf)
        while pos < end:
            if self.skip:  # the CRLF that closes a chunk
                taken = min(self.skip, end - pos)
                pos += taken
                self.skip -= taken
            elif self.chunk_left:
                taken = min(self.chunk_left, end - pos)
                out.append(buf[pos:pos + taken])
                pos += taken
                self.chunk_left -= taken
                if not self.chunk_left:
                    self.skip = 2
            else:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    break
                size = int(buf[pos:eol].split(b";", 1)[0], 16)
                pos = eol + 2
                if size == 0:  # the last chunk: the body is over
                    pos = end
                    break
                self.chunk_left = size
        self.framed = buf[pos:]
        return b"".join(out) if len(out) != 1 else out[0]

    def _read_events(self) -> None:
        whole, self.events = sse.split(self.events)
        for event in whole:
            payload = sse.data(event)
            if payload is None:
                continue
            if payload == sse.DONE:
                self._end(None)
                return
            doc = orjson.loads(payload)
            if "error" in doc:
                raise stream_error(doc["error"])
            choices = doc.get("choices")
            if not choices:
                continue
            choice = choices[0]
            ids = choice.get("token_ids") or []
            if ids and not self.flowing:
                self.flowing = True
                self._arm(self.stall_s)
            self.sink.on_chunk(ids, choice.get("text") or "", choice.get("finish_reason"))
            if self.ended:  # the sink aborted the stream (e.g. the request is done)
                return

    def _refused(self) -> None:
        body = self._unframe(self.refusal) if self.chunked else self.refusal
        if self.status >= 500:
            self._end(BackendUnavailable(f"backend answered HTTP {self.status}"))
            return
        message, param = error_message(self.status, body)
        self._end(BackendError(self.status, message, param))

    # ---- the stall timer: one per stream, re-armed lazily -------------------------------
    def _arm(self, delay: float | None) -> None:
        self._stop_timer()
        if delay is not None:
            self.timer = self.loop.call_later(delay, self._check_stall)

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _check_stall(self) -> None:
        self.timer = None
        if self.ended or self.stall_s is None:
            return
        if self.head is None and not self.flowing:
            return  # head in, first token not yet: no bound (queued or prefilling in vLLM)
        quiet = self.loop.time() - self.last_data_s
        if self.head is None and quiet < self.stall_s:
            self._arm(self.stall_s - quiet)
            return
        self._end(BackendStalled(f"no data from the model backend for {self.stall_s:g} s "
                                 "(stall timeout)"))
