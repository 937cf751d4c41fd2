"""Forwarded requests: vLLM's own endpoints behind the scheduler (owner: sidecar).

A request using a field of :data:`~jitserve.sidecar.fields.FORWARDED` (``response_format``,
``structured_outputs``/``guided_*``, ``tools``/``tool_choice``, ``logprobs``, ``n``,
``logit_bias``, ``chat_template_kwargs``...) is not turned into a token-id call: its body
goes to vLLM's ``/v1/chat/completions`` or ``/v1/completions`` as the client sent it
(plus vLLM's ``priority`` and, streamed, ``stream_options.include_usage``), so vLLM's
structured-output, tool and reasoning parsers run, and its answer comes back chunk by
chunk as vLLM wrote it (the ``id`` set to jitserve's, a ``jitserve`` extension on the
body or the usage chunk). Such a request is scheduled like any other (queue, priority,
retirement) but never preempted: its decoding state cannot be resumed as a continuation.

Tokens are counted per chunk for scheduling and goodput: one per choice whose delta
carries content, reasoning or a tool call (vLLM streams one token per chunk), or the
number of logprobs entries when present; vLLM's final ``usage`` corrects the total.
A non-streamed request's tokens all count when its body arrives (the client gets them
then).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any, Protocol

from aiohttp import web

from jitserve import sse
from jitserve.sidecar.api import ParsedRequest
from jitserve.sidecar.errors import APIError
from jitserve.sidecar.jobs import Event, EventKind, Job
from jitserve.sidecar.responses import error_response, extension, send
from jitserve.sidecar.watch import StallWatch


class Forwarder(Protocol):
    """A backend that can send a body as is to one of vLLM's endpoints."""

    def forward(self, path: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]: ...


def path_of(parsed: ParsedRequest) -> str:
    return "/v1/chat/completions" if parsed.endpoint == "chat" else "/v1/completions"


def vllm_body(forward: dict[str, Any], model: str, priority: int,
              request_id: str) -> dict[str, Any]:
    """The forwarded body as vLLM gets it: the served model, jitserve's priority and
    request id, and (streamed) the usage chunk jitserve counts tokens with."""
    body = {**forward, "model": model, "priority": priority, "request_id": request_id}
    if body.get("stream"):
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return body


def _choice_tokens(choice: dict[str, Any]) -> int:
    logprobs = choice.get("logprobs")
    if isinstance(logprobs, dict):
        content = logprobs.get("content")
        if isinstance(content, list) and content:
            return len(content)
        tokens = logprobs.get("tokens")
        if isinstance(tokens, list) and tokens:
            return len(tokens)
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return int(bool(delta.get("content") or delta.get("reasoning_content")
                        or delta.get("reasoning") or delta.get("tool_calls")))
    return int(bool(choice.get("text")))


def tokens_in(doc: dict[str, Any], counted: int) -> int:
    """Generated tokens a chunk (or a whole body) carries, given ``counted`` so far:
    vLLM's ``usage`` is exact, otherwise one per choice with output."""
    usage = doc.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        return max(0, int(usage["completion_tokens"]) - counted)
    choices = doc.get("choices") or []
    return sum(_choice_tokens(c) for c in choices if isinstance(c, dict))


def finish_reason(doc: dict[str, Any]) -> str | None:
    """The last finish reason a chunk or body carries, if any."""
    found: str | None = None
    for choice in doc.get("choices") or []:
        if isinstance(choice, dict) and choice.get("finish_reason") is not None:
            found = str(choice["finish_reason"])
    return found


def _headers(job: Job) -> dict[str, str]:
    return {"x-jitserve-request-id": job.request_id}


async def collect(job: Job, first: Event) -> web.Response:
    """A non-streamed forwarded request: vLLM's body, with jitserve's id and extension."""
    event = first
    body: dict[str, Any] | None = None
    while event.kind is not EventKind.DONE:
        if event.kind is EventKind.ERROR:
            assert event.error is not None
            return error_response(event.error)
        if event.raw is not None:
            body = event.raw
        event = await job.events.get()
    if body is None:
        body = {}
    body["id"] = job.request_id
    body["jitserve"] = extension(job)
    return web.json_response(body, headers=_headers(job))


async def stream(request: web.Request, job: Job, parsed: ParsedRequest, first: Event,
                 send_timeout_s: float) -> web.StreamResponse:
    """A streamed forwarded request: vLLM's chunks as they come (its usage chunk only
    when the client asked for it), then ``[DONE]``; an error after the head is a final
    ``data: {"error": ...}`` event."""
    resp = web.StreamResponse(headers={**sse.HEADERS, **_headers(job)})
    await resp.prepare(request)
    event: Event | None = first
    parts: list[str] = []
    usage: dict[str, Any] | None = None  # sent last, with the request's outcome
    done = False
    watch = StallWatch(send_timeout_s)
    try:
        while True:
            while event is not None:
                if event.kind is EventKind.TOKENS and event.raw is not None:
                    doc = event.raw
                    doc["id"] = job.request_id
                    if doc.get("usage") is not None and not doc.get("choices"):
                        usage = doc if parsed.include_usage else None
                    else:
                        if not parsed.include_usage:
                            doc.pop("usage", None)  # there because jitserve asked for usage
                        parts.append(sse.json_event(doc))
                elif event.kind is EventKind.ERROR:
                    assert event.error is not None
                    parts.append(sse.error_ending(_error_body(event.error)))
                    done = True
                    break
                elif event.kind is EventKind.DONE:
                    if usage is not None:
                        usage["jitserve"] = extension(job)
                        parts.append(sse.json_event(usage))
                    parts.append(sse.LAST)
                    done = True
                    break
                event = job.events.get_nowait() if not job.events.empty() else None
            if parts:
                if not await send(request, resp, "".join(parts).encode(), watch):
                    return resp
                parts.clear()
            if done:
                break
            event = await job.events.get()
    finally:
        watch.close()
    with contextlib.suppress(ConnectionError):
        await resp.write_eof()
    return resp


def _error_body(error: APIError) -> dict[str, Any]:
    return error.body()
