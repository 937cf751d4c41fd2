"""A TCP relay between two real parts that freezes their bytes on demand: the state a
test needs ("a stream is still running when ...") made by the test, not hoped for from
the machine's speed.

``with StallRelay(vllm_url) as relay:`` listens on a free loopback port and forwards
every connection to the target. ``relay.hold()`` stops passing the model's work: a POST
request and its answer wait in the relay (the sidecar sees a silent vLLM stream, as with
a wedged engine), while GETs (vLLM's /health, /metrics) pass, so the sidecar still sees
a healthy backend. ``relay.hold_after(n)`` lets POST requests through and each answer's
first ``n`` SSE events, then holds the rest: vLLM runs, but however far ahead of the
sidecar it gets (a starved sidecar can read a whole 4000-token stream in one burst),
the sidecar has at most those events of each stream. ``relay.release()`` passes
everything on, nothing lost or reordered; ``relay.drop()`` instead closes the held
answers' connections, their rest unsent (the sidecar sees a backend that died there).
It runs its own event loop in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import urllib.parse
from collections.abc import Coroutine
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from jitserve.devstack import vllm as vl

EVENT_END = b"\n\n"  # vLLM ends every SSE event so; a JSON answer has none


@dataclass(eq=False)
class _Conn:
    """One relayed connection: its current request (HTTP/1.1: one at a time)."""

    writers: list[asyncio.StreamWriter] = field(default_factory=list)
    posting: bool = False
    events: int = 0  # SSE events of the current POST answer passed on
    last: bytes = b""  # the last byte passed on (an event end split across two reads)
    held: bool = False  # its answer waits in the relay at the hold_after limit
    received: int = 0  # SSE event ends of the current POST answer read from the target
    answer: asyncio.Task[None] | None = None  # what passes the answer on


class StallRelay:
    def __init__(self, target_url: str) -> None:
        parts = urllib.parse.urlsplit(target_url)
        self._target = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.port = vl.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._open = asyncio.Event()
        self._after: int | None = None  # events an answer passes while held (None: none)
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._conns: set[_Conn] = set()
        self.held_answers = 0
        """POST answers waiting in the relay with bytes beyond their first events."""
        self.dropped_at: list[int] = []
        """For each POST connection its client (the sidecar) closed: how many SSE events
        of the answer the target had sent by then (a stream dropped mid-way: fewer than
        it would have sent)."""

    def __enter__(self) -> StallRelay:
        self._thread.start()
        self._call(self._start())
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()
        self._call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

    def hold(self) -> None:
        self._call(self._set(open_=False, after=None))

    def hold_after(self, events: int) -> None:
        """From now on, each POST answer passes its first ``events`` SSE events (one
        already past them: none more) and waits there until :meth:`release`."""
        self._call(self._set(open_=False, after=events))

    def release(self) -> None:
        self._call(self._set(open_=True, after=None))

    def drop(self) -> None:
        """Close the connection of every held answer: what it holds is never sent."""
        self._call(self._drop())

    def _call(self, coro: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    async def _set(self, *, open_: bool, after: int | None) -> None:
        self._after = after
        if open_:
            self._open.set()
        else:
            self._open.clear()

    async def _drop(self) -> None:
        for conn in self._conns:
            if conn.held and conn.answer is not None:
                conn.answer.cancel()  # its writer closes: the held rest is never sent

    async def _start(self) -> None:
        self._open.set()
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)

    async def _stop(self) -> None:
        """Close every relayed connection too: a held vLLM stream whose connection stayed
        open would keep vLLM generating for the next test."""
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns):
            for writer in conn.writers:
                writer.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        conn = _Conn(writers=[client_w])
        try:
            target_r, target_w = await asyncio.open_connection(*self._target)
        except OSError:
            client_w.close()
            return
        conn.writers.append(target_w)
        self._conns.add(conn)
        try:
            await asyncio.gather(self._upstream(client_r, target_w, conn),
                                 self._downstream(target_r, client_w, conn),
                                 return_exceptions=True)
        finally:
            self._conns.discard(conn)

    async def _upstream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        conn: _Conn) -> None:
        try:
            while data := await reader.read(65536):
                if data[:4] in (b"POST", b"GET ", b"HEAD"):
                    conn.posting = data.startswith(b"POST")
                    conn.events, conn.last, conn.received = 0, b"", 0
                if conn.posting and self._after is None:
                    await self._open.wait()
                writer.write(data)
                await writer.drain()
        finally:
            if conn.posting:
                self.dropped_at.append(conn.received)
            writer.close()

    async def _downstream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                          conn: _Conn) -> None:
        conn.answer = asyncio.current_task()
        try:
            while data := await reader.read(65536):
                conn.received += data.count(EVENT_END)
                if conn.posting and not self._open.is_set():
                    if self._after is None:
                        await self._open.wait()
                    else:
                        cut = _after_events(conn, data, self._after)
                        if cut < len(data):
                            await _send(writer, data[:cut], conn)
                            data = data[cut:]
                            conn.held = True
                            self.held_answers += 1
                            try:
                                await self._open.wait()
                            finally:
                                conn.held = False
                                self.held_answers -= 1
                elif conn.posting:
                    _after_events(conn, data, None)
                await _send(writer, data, conn)
        finally:
            writer.close()


async def _send(writer: asyncio.StreamWriter, data: bytes, conn: _Conn) -> None:
    if data:
        writer.write(data)
        conn.last = data[-1:]
        await writer.drain()


def _after_events(conn: _Conn, data: bytes, limit: int | None) -> int:
    """Where in ``data`` the answer's ``limit``-th SSE event ends (``len(data)`` if later
    or no limit); counts the events before that point as passed."""
    allowed = None if limit is None else limit - conn.events
    if allowed is not None and allowed <= 0:
        return 0
    ends = [1] if conn.last == b"\n" and data[:1] == b"\n" else []
    at = data.find(EVENT_END, ends[-1] if ends else 0)
    while at >= 0:
        ends.append(at + 2)
        at = data.find(EVENT_END, at + 2)
    if allowed is not None and len(ends) >= allowed:
        conn.events = limit or 0
        return ends[allowed - 1]
    conn.events += len(ends)
    return len(data)
