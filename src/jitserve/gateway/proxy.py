"""One request forwarded to a replica, and to the next if it fails before its first byte
(owner: gateway).

The rules (docs/gateway.md "Failover"):

- an attempt *fails before its first byte* when the replica cannot be reached, answers
  502/503/504, closes before the first byte of its body, or leaves the fleet's picks while
  the gateway waits for that byte (dead, SIGSTOPped, its vLLM gone): the next replica of
  the pick is tried with the same body. A failing last replica's own 5xx answer passes
  through as it is; with no answer at all the client gets 503 + Retry-After;
- after the first byte went to the client the request is never placed again: a replica
  that breaks the stream, or goes silent while out of the picks, ends it with an error
  event (``data: {"error": ...}``, then ``data: [DONE]``), as the sidecar itself does;
- every other answer (200, any 4xx with 429, 500) passes through unchanged: status, body
  and headers less the hop-by-hop ones, plus ``x-jitserve-replica``;
- bytes are copied as they arrive (a streamed answer is never buffered), so a slow
  reader slows its replica's stream down (the sidecar's ``--max-buffered-tokens`` then
  applies) instead of growing the gateway's memory; the client leaving cancels the
  handler, which closes the replica's connection: the sidecar cancels the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from jitserve import sse
from jitserve.gateway.fleet import Fleet
from jitserve.gateway.metrics import GatewayMetrics
from jitserve.sidecar.errors import NO_ENDPOINTS, APIError

log = logging.getLogger("jitserve.gateway")
T = TypeVar("T")

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                        "te", "trailer", "trailers", "transfer-encoding", "upgrade", "host",
                        "content-length"})
RETRY_STATUSES = frozenset({502, 503, 504})
WATCH_S = 0.25
"""How often an attempt waiting on a replica checks that it is still in the picks."""
SILENT_S = 5.0
"""A stream whose replica is out of the picks ends (with an error event) once it has
been silent this long: longer than a starved machine's hiccup, which can take a healthy
replica out of the picks for a moment."""
MAX_ANSWER_BYTES = 64 << 20
REPLICA_HEADER = "x-jitserve-replica"
PLACED_ON = "jitserve.replica"
"""Key of the replica a request was last sent to, in the request's own storage."""
ANSWERED = "jitserve.answered"
"""Key set once a request's outcome is counted (a client that leaves after ``[DONE]``
is not counted again as cancelled)."""
DONE = sse.LAST.encode()


class Failover(Exception):
    """The attempt failed before its first byte; ``answer``: the replica's own 5xx."""

    def __init__(self, reason: str,
                 answer: tuple[int, CIMultiDict[str], bytes] | None = None) -> None:
        super().__init__(reason)
        self.answer = answer


class ClientLeft(Exception):
    """Writing to the client failed: its connection is closed or closing (which the
    handler's cancellation may not have told yet)."""


async def to_client(write: Awaitable[Any]) -> None:
    try:
        await write
    except ConnectionError as err:  # aiohttp's ClientConnectionResetError included
        raise ClientLeft(str(err)) from err


def upstream_headers(headers: Mapping[str, str]) -> CIMultiDict[str]:
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in HOP_BY_HOP)


def error_event(message: str, code: str) -> bytes:
    body = APIError(502, message, type_="server_error", code=code).body()
    return sse.error_ending(body).encode()


class Forwarder:
    def __init__(self, fleet: Fleet, metrics: GatewayMetrics, connect_timeout_s: float) -> None:
        self.fleet = fleet
        self.metrics = metrics
        self.connect_timeout_s = connect_timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, enable_cleanup_closed=True),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s))

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def forward(self, request: web.Request, body: bytes | None, replicas: Iterable[str],
                      on_placed: Callable[[str], None]) -> web.StreamResponse:
        """``request`` (whose ``body`` was read at the door) to the first of ``replicas``
        that takes it; ``on_placed(replica)`` once its first byte came back."""
        headers = upstream_headers(request.headers)
        last: Failover | None = None
        for replica in replicas:
            if replica not in self.fleet:
                continue
            request[PLACED_ON] = replica  # for the metrics of a client that leaves
            try:
                return await self._attempt(request, body, headers, replica, on_placed)
            except Failover as failed:
                log.info("replica %s failed before the first byte (%s); trying the next",
                         replica, failed)
                self.metrics.failovers.labels(replica).inc()
                last = failed
        if last is not None and last.answer is not None:
            status, answer_headers, answer = last.answer
            self.metrics.answered(None, "server_error")
            return web.Response(status=status, body=answer, headers=answer_headers)
        self.metrics.answered(None, "no_replica")
        raise APIError(503, "no replica could take the request"
                       + (f" (last: {last})" if last is not None else ""),
                       type_="service_unavailable", code="no_replica", retry_after_s=1,
                       dropped_reason=NO_ENDPOINTS)

    async def _watched(self, replica: str, awaitable: Any) -> Any:
        """``await awaitable``, abandoned (:class:`Failover`) if ``replica`` leaves the
        picks meanwhile."""
        task = asyncio.ensure_future(awaitable)
        out = 0
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=WATCH_S)
                if done:
                    return task.result()
                out = 0 if self.fleet.in_picks(replica) else out + 1
                if out >= 2:  # two checks in a row: one late report is not an outage
                    raise Failover(f"{replica} left the picks")
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def _attempt(self, request: web.Request, body: bytes | None,
                       headers: CIMultiDict[str], replica: str,
                       on_placed: Callable[[str], None]) -> web.StreamResponse:
        assert self._session is not None, "Forwarder.start() first"
        url = self.fleet.api_url(replica) + request.path_qs
        ctx = self._session.request(request.method, url, data=body, headers=headers)
        try:
            resp: aiohttp.ClientResponse = await self._watched(replica, ctx.__aenter__())
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            raise Failover(f"{type(err).__name__}: {err}") from err
        complete = False
        try:
            out_headers = upstream_headers(resp.headers)
            out_headers[REPLICA_HEADER] = replica
            if resp.status in RETRY_STATUSES:
                answer = await self._read_all(replica, resp)
                complete = True
                raise Failover(f"HTTP {resp.status}", (resp.status, out_headers, answer))
            if resp.content_type != "text/event-stream":
                answer = await self._read_all(replica, resp)
                complete = True
                on_placed(replica)
                self.answered(request, replica, outcome_of(resp.status))
                return web.Response(status=resp.status, body=answer, headers=out_headers)
            try:
                first = await self._watched(replica, resp.content.readany())
            except (aiohttp.ClientError, OSError) as err:
                raise Failover(f"{type(err).__name__}: {err}") from err
            if not first:
                raise Failover("closed before its first byte")
            on_placed(replica)
            out, complete = await self._stream(request, resp, replica, out_headers, first)
            return out
        finally:
            if not complete:
                resp.close()  # never back to the pool half read: the sidecar sees it close

    async def _read_all(self, replica: str, resp: aiohttp.ClientResponse) -> bytes:
        try:
            answer: bytes = await self._watched(replica, read_capped(resp, MAX_ANSWER_BYTES))
        except (aiohttp.ClientError, OSError) as err:
            raise Failover(f"{type(err).__name__}: {err}") from err
        return answer

    async def _stream(self, request: web.Request, resp: aiohttp.ClientResponse, replica: str,
                      headers: CIMultiDict[str],
                      first: bytes) -> tuple[web.StreamResponse, bool]:
        """Copy a streamed answer; (the client's response, whether it ended cleanly)."""
        out = web.StreamResponse(status=resp.status, headers=headers)
        last = first
        watch = SilenceWatch(max(SILENT_S, self.fleet.max_age_s),
                             lambda: self.fleet.in_picks(replica))
        try:
            await to_client(out.prepare(request))
            await to_client(out.write(first))
            while True:
                chunk = await resp.content.readany()
                if not chunk:
                    break
                watch.heard()
                await to_client(out.write(chunk))
                last = chunk
                if chunk.endswith(DONE):  # the client has it all and may leave now
                    self.answered(request, replica, "server_error" if b'data: {"error"'
                                  in chunk else outcome_of(resp.status))
            await to_client(out.write_eof())
        except ClientLeft:
            # noticed by a write before (or instead of) the handler's cancellation
            self.answered(request, replica, "cancelled")
            return out, False
        except asyncio.CancelledError:
            if not watch.expired():
                raise
            await self._fail(request, out, last, replica, "went silent and left the picks")
            return out, False
        except (aiohttp.ClientError, OSError) as err:
            await self._fail(request, out, last, replica,
                             f"broke the stream ({type(err).__name__})")
            return out, False
        finally:
            watch.close()
        self.answered(request, replica, outcome_of(resp.status))
        return out, True

    def answered(self, request: web.Request, replica: str | None, outcome: str) -> None:
        """Count ``request``'s outcome, once."""
        if not request.get(ANSWERED):
            request[ANSWERED] = True
            self.metrics.answered(replica, outcome)

    async def _fail(self, request: web.Request, out: web.StreamResponse, last: bytes,
                    replica: str, what: str) -> None:
        message = f"replica {replica} {what} after the first byte"
        log.warning("%s: the client gets an error event", message)
        self.answered(request, replica, "failed_midstream")
        with_break = b"" if last.endswith(b"\n\n") else b"\n\n"
        with contextlib.suppress(ClientLeft):  # nobody left to tell
            await to_client(out.write(with_break + error_event(message, "replica_failed")))
            await to_client(out.write_eof())


class SilenceWatch:
    """Ends a stream whose replica went silent for ``limit_s`` while out of the picks: a
    check every :data:`WATCH_S` (one timer per stream, nothing per token) that cancels
    the copying task; the task then sees :meth:`expired` and ends the stream itself."""

    def __init__(self, limit_s: float, in_picks: Callable[[], bool]) -> None:
        self.limit_s = limit_s
        self.in_picks = in_picks
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self.last_s = self._loop.time()
        self._fired = False
        self._handle: asyncio.TimerHandle | None = self._loop.call_later(WATCH_S, self._check)

    def heard(self) -> None:
        self.last_s = self._loop.time()

    def _check(self) -> None:
        if self._loop.time() - self.last_s >= self.limit_s and not self.in_picks():
            self._handle = None
            self._fired = True
            if self._task is not None:
                self._task.cancel()
            return
        self._handle = self._loop.call_later(WATCH_S, self._check)

    def expired(self) -> bool:
        """Whether the CancelledError the task got is this watch's (then taken back)."""
        if not self._fired:
            return False
        self._fired = False
        return self._task is None or self._task.uncancel() == 0

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


async def read_capped(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """The whole body, refused (:class:`Failover`) past ``limit`` bytes."""
    if (resp.content_length or 0) > limit:
        raise Failover(f"answer of {resp.content_length} bytes is over the limit")
    parts, size = [], 0
    while chunk := await resp.content.read(1 << 16):
        size += len(chunk)
        if size > limit:
            raise Failover(f"answer over {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)


def outcome_of(status: int) -> str:
    if status < 400:
        return "ok"
    return "client_error" if status < 500 else "server_error"
