"""Writing the sidecar's answers: OpenAI bodies, SSE streams and errors (owner: sidecar).

- :func:`errors_middleware`: every error leaves as OpenAI-shaped JSON (``param`` naming
  the field, ``code`` set); an unexpected exception is a 500 ``internal_error`` with a
  one-line message, never a traceback or a plain-text page;
- :func:`collect` / :func:`stream`: a finished request as one ``chat.completion`` /
  ``text_completion`` body, or as Server-Sent Events from its first token (so a request
  refused while it waits still gets a proper status) with a final
  ``data: {"error": ...}`` event if it fails after that;
- :class:`BoundedEvents`: a request's event queue holding at most ``limit`` unsent
  tokens: a client that reads slower than vLLM writes gets its tokens so far and a
  ``client_too_slow`` error event, and its vLLM request is aborted, instead of the
  sidecar buffering without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web

from jitserve import sse
from jitserve.sidecar.api import ParsedRequest
from jitserve.sidecar.errors import APIError, internal_error, slow_reader
from jitserve.sidecar.jobs import Event, EventKind, Job
from jitserve.sidecar.watch import StallWatch
from jitserve.slo import SLO, CompoundSLO, DeadlineSLO, LatencySLO

log = logging.getLogger("jitserve.sidecar")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(err: APIError) -> web.Response:
    return web.json_response(err.body(), status=err.status, headers=err.headers())


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except APIError as err:
        return error_response(err)
    except web.HTTPRequestEntityTooLarge as err:
        return error_response(APIError(413, f"request body too large: {err.text}",
                                       code="request_too_large"))
    except web.HTTPException as err:
        if err.status < 400:
            raise
        if err.status >= 500:
            return error_response(internal_error(err.reason))
        codes = {404: "not_found", 405: "method_not_allowed"}
        return error_response(APIError(err.status, err.reason,
                                       code=codes.get(err.status, "invalid_request")))
    except (asyncio.CancelledError, ConnectionError):
        raise
    except Exception as err:
        log.exception("unexpected error on %s %s", request.method, request.path)
        return error_response(internal_error(f"internal error ({type(err).__name__})"))


class TokenWriter(Protocol):
    """Writes a streaming client's tokens as they come (:class:`ChunkWriter`)."""

    def write(self, event: Event) -> None: ...

    def unsent_tokens(self) -> int: ...


class BoundedEvents(asyncio.Queue[Event]):
    """The events of one request, at most ``limit`` tokens of them waiting to be sent.

    Past the limit the reader is too slow: later events are dropped, one final ERROR
    event (``client_too_slow``) is queued, and ``on_overflow`` (abort the request in
    vLLM) is called once, soon after. Once a streaming response sets ``writer``, tokens
    skip the queue and are written to the client at once (no coroutine woken per token);
    the unsent ones are then those in the client connection's buffer."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.tokens = 0
        self.overflowed = False
        self.on_overflow: Callable[[], None] | None = None
        self.writer: TokenWriter | None = None

    def put_nowait(self, item: Event) -> None:
        if self.overflowed:
            return
        if item.kind is EventKind.TOKENS:
            n = max(1, len(item.token_ids))
            unsent = self.tokens if self.writer is None else self.writer.unsent_tokens()
            if unsent + n > self.limit:
                self.overflowed = True
                super().put_nowait(Event(EventKind.ERROR, error=slow_reader(self.limit)))
                if self.on_overflow is not None:
                    asyncio.get_running_loop().call_soon(self.on_overflow)
                return
            if self.writer is not None and self.empty():
                self.writer.write(item)
                return
            self.tokens += n
        super().put_nowait(item)

    def get_nowait(self) -> Event:
        item = super().get_nowait()
        if item.kind is EventKind.TOKENS:
            self.tokens -= max(1, len(item.token_ids))
        return item


def extension(job: Job) -> dict[str, Any]:
    live = job.live
    return {"request_id": job.request_id, "tenant": live.req.tenant,
            "slo_kind": live.req.kind.value, "slo_class": live.req.slo_class,
            "slo": slo_targets(live.req.slo), "preemptions": live.preemptions,
            "outcome": job.outcome}


def slo_targets(slo: SLO) -> dict[str, float]:
    """The SLO a request was given, in the units of the body's ``slo`` object."""
    if isinstance(slo, LatencySLO):
        return {"ttft_ms": round(slo.ttft_s * 1e3, 3), "tbt_ms": round(slo.tbt_s * 1e3, 3)}
    if isinstance(slo, DeadlineSLO | CompoundSLO):
        return {"deadline_s": slo.deadline_s}
    return {}


def usage(job: Job) -> dict[str, int]:
    prompt = len(job.prompt_ids)
    completion = len(job.generated_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


async def collect(job: Job, parsed: ParsedRequest, first: Event) -> web.Response:
    texts: list[str] = []
    event = first
    while True:
        if event.kind is EventKind.TOKENS:
            texts.append(event.text)
        elif event.kind is EventKind.ERROR:
            assert event.error is not None
            return error_response(event.error)
        else:
            break
        event = await job.events.get()
    text = "".join(texts)
    choice: dict[str, Any] = {"index": 0, "finish_reason": event.finish_reason, "logprobs": None}
    if parsed.endpoint == "chat":
        choice["message"] = {"role": "assistant", "content": text}
        obj = "chat.completion"
    else:
        choice["text"] = text
        obj = "text_completion"
    if parsed.return_token_ids:
        choice["token_ids"] = job.generated_ids
    body = {"id": job.request_id, "object": obj, "created": int(time.time()),
            "model": job.model, "choices": [choice], "usage": usage(job),
            "jitserve": extension(job)}
    return web.json_response(body, headers={"x-jitserve-request-id": job.request_id})


class ChunkWriter:
    """One streaming client's token chunks, rendered from pre-built pieces (the per-token
    work is one ``json.dumps`` of the text) and written straight to its connection in
    aiohttp's own framing (HTTP/1.1 chunked), once aiohttp has sent the head."""

    __slots__ = ("after", "before", "chunk_bytes", "chunked", "transport", "with_ids")

    def __init__(self, transport: asyncio.Transport, before: str, after: str, with_ids: bool,
                 chunked: bool) -> None:
        self.transport = transport
        self.before, self.after, self.with_ids, self.chunked = before, after, with_ids, chunked
        self.chunk_bytes = 1

    def render(self, event: Event) -> str:
        ids = f', "token_ids": {json.dumps(event.token_ids)}' if self.with_ids else ""
        return sse.event(f"{self.before}{json.dumps(event.text)}{self.after}{ids}}}]}}")

    def write(self, event: Event) -> None:
        if self.transport.is_closing():
            return  # the client is gone: aiohttp cancels the handler, which ends the job
        data = self.render(event).encode()
        self.chunk_bytes = len(data)
        self.transport.write(b"%x\r\n%s\r\n" % (len(data), data) if self.chunked else data)

    def unsent_tokens(self) -> int:
        return self.transport.get_write_buffer_size() // self.chunk_bytes


async def stream(request: web.Request, job: Job, parsed: ParsedRequest, first: Event,
                 send_timeout_s: float) -> web.StreamResponse:
    """SSE from the first event on. The events queued so far go through aiohttp (which
    sends the head with them); later tokens are written by a :class:`ChunkWriter` as
    they come; the ending goes through aiohttp again. A client that takes nothing for
    ``send_timeout_s`` is cut off (its connection closed; the caller then cancels the
    job), as is one that leaves ``max_buffered_tokens`` unsent."""
    resp = web.StreamResponse(headers={**sse.HEADERS, "x-jitserve-request-id": job.request_id})
    await resp.prepare(request)
    chat = parsed.endpoint == "chat"
    head = json.dumps({"id": job.request_id,
                       "object": "chat.completion.chunk" if chat else "text_completion",
                       "created": int(time.time()), "model": job.model})[:-1]
    if chat:
        before = f'{head}, "choices": [{{"index": 0, "delta": {{"content": '
        after = '}, "logprobs": null, "finish_reason": null'
    else:
        before = f'{head}, "choices": [{{"index": 0, "text": '
        after = ', "logprobs": null, "finish_reason": null'
    assert request.transport is not None
    writer = ChunkWriter(request.transport, before, after,
                         parsed.return_token_ids,
                         resp.headers.get("Transfer-Encoding", "").lower() == "chunked")
    parts: list[str] = []
    if chat:
        parts.append(sse.event(f'{head}, "choices": [{{"index": 0, "delta": {{"role": '
                               f'"assistant", "content": ""}}, "logprobs": null, '
                               f'"finish_reason": null}}]}}'))
    events = job.events
    event: Event | None = first
    final: Event | None = None
    watch = StallWatch(send_timeout_s)
    try:
        while True:
            while event is not None:
                if event.kind is not EventKind.TOKENS:
                    final = event
                    break
                parts.append(writer.render(event))
                event = events.get_nowait() if not events.empty() else None
            if final is not None:
                if isinstance(events, BoundedEvents):
                    events.writer = None
                parts.append(stream_tail(job, parsed, head, final))
            if parts:
                if not await send(request, resp, "".join(parts).encode(), watch):
                    return resp  # gone or not reading: the caller cancels
                parts.clear()
            if final is not None:
                break
            if isinstance(events, BoundedEvents) and events.empty():
                events.writer = writer  # the head is out: tokens go straight to the client
            event = await events.get()
    finally:
        watch.close()
        if isinstance(events, BoundedEvents):
            events.writer = None
    with contextlib.suppress(ConnectionError):
        await resp.write_eof()
    return resp


async def send(request: web.Request, resp: web.StreamResponse, data: bytes,
               watch: StallWatch) -> bool:
    """Write ``data`` to a streaming client; False, with the connection closed, when the
    client is gone or took nothing for the watch's limit."""
    watch.arm()
    try:
        await resp.write(data)
    except asyncio.CancelledError:
        if not watch.expired():
            raise
    except ConnectionError:
        pass
    else:
        return True
    finally:
        watch.disarm()
    if request.transport is not None:
        request.transport.close()
    return False


def stream_tail(job: Job, parsed: ParsedRequest, head: str, final: Event) -> str:
    if final.kind is EventKind.ERROR:
        assert final.error is not None
        return sse.error_ending(final.error.body())
    chat = parsed.endpoint == "chat"
    delta = '"delta": {}, ' if chat else '"text": "", '
    out = sse.event(f'{head}, "choices": [{{"index": 0, {delta}"logprobs": null, '
                    f'"finish_reason": {json.dumps(final.finish_reason)}}}]}}')
    if parsed.include_usage:
        out += sse.event(f'{head}, "choices": [], "usage": {json.dumps(usage(job))}, '
                         f'"jitserve": {json.dumps(extension(job))}}}')
    return out + sse.LAST
