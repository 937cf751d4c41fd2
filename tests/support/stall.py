"""A TCP relay between two real parts that freezes their bytes on demand: the state a
test needs ("a stream is still running when ...") made by the test, not hoped for from
the machine's speed.

``with StallRelay(vllm_url) as relay:`` listens on a free loopback port and forwards
every connection to the target. ``relay.hold()`` stops passing the model's work: a POST
request and its answer wait in the relay (the sidecar sees a silent vLLM stream, as with
a wedged engine), while GETs (vLLM's /health, /metrics) pass, so the sidecar still sees
a healthy backend. ``relay.release()`` passes everything on, nothing lost or reordered.
It runs its own event loop in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import urllib.parse
from types import TracebackType

from jitserve.devstack import vllm as vl


class StallRelay:
    def __init__(self, target_url: str) -> None:
        parts = urllib.parse.urlsplit(target_url)
        self._target = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.port = vl.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._open = asyncio.Event()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def __enter__(self) -> StallRelay:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

    def hold(self) -> None:
        self._loop.call_soon_threadsafe(self._open.clear)

    def release(self) -> None:
        self._loop.call_soon_threadsafe(self._open.set)

    async def _start(self) -> None:
        self._open.set()
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)

    async def _stop(self) -> None:
        """Close every relayed connection too: a held vLLM stream whose connection stayed
        open would keep vLLM generating for the next test."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            target_r, target_w = await asyncio.open_connection(*self._target)
        except OSError:
            client_w.close()
            return
        self._writers |= {client_w, target_w}
        posting = [False]  # is this connection's current request a POST (HTTP/1.1: one at a time)
        await asyncio.gather(self._pump(client_r, target_w, posting, upstream=True),
                             self._pump(target_r, client_w, posting, upstream=False),
                             return_exceptions=True)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    posting: list[bool], *, upstream: bool) -> None:
        try:
            while data := await reader.read(65536):
                if upstream and data[:4] in (b"POST", b"GET ", b"HEAD"):
                    posting[0] = data.startswith(b"POST")
                if posting[0]:
                    await self._open.wait()
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()
            self._writers.discard(writer)
