"""A streaming OpenAI-compatible client that times every token (owner: bench).

:func:`stream_completion` POSTs one streamed completion and records when each token
arrived (monotonic seconds), the status, the error body and the response headers (a
refused request's ``Retry-After``). The live benchmarks (:mod:`jitserve.bench.live`,
:mod:`jitserve.bench.compare`) and the sidecar tests use it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from jitserve import sse


@dataclass
class StreamResult:
    status: int = 0
    token_times: list[float] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    error: dict[str, Any] | None = None
    finish_reason: str | None = None
    extension: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    start_s: float = 0.0
    end_s: float = 0.0


async def stream_completion(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
                            headers: dict[str, str] | None = None,
                            path: str = "/v1/completions") -> StreamResult:
    """POST a streamed completion and record when each token arrived (monotonic s)."""
    result = StreamResult(start_s=time.monotonic())
    body = {**body, "stream": True, "return_token_ids": True,
            "stream_options": {"include_usage": True}}
    async with session.post(url.rstrip("/") + path, json=body, headers=headers or {}) as resp:
        result.status = resp.status
        result.headers = dict(resp.headers)
        if resp.status != 200:
            try:
                result.error = (await resp.json()).get("error")
            except (aiohttp.ContentTypeError, ValueError):
                result.error = {"message": (await resp.text())[:500]}
            result.end_s = time.monotonic()
            return result
        buffer = b""
        async for data in resp.content.iter_any():
            events, buffer = sse.split(buffer + data)
            docs = [payload for payload in map(sse.data, events) if payload is not None]
            if _read(result, docs):
                break
    result.end_s = time.monotonic()
    return result


def _read(result: StreamResult, payloads: list[bytes]) -> bool:
    """Record the events' tokens, each event at the time it is read (as a line-by-line
    client sees them); True at ``[DONE]``."""
    for payload in payloads:
        if payload == sse.DONE:
            return True
        now = time.monotonic()
        doc = json.loads(payload)
        if "error" in doc:
            result.error = doc["error"]
            continue
        if "jitserve" in doc:
            result.extension = doc["jitserve"]
        for choice in doc.get("choices") or []:
            ids = choice.get("token_ids") or []
            if ids:
                result.token_ids.extend(ids)
                result.token_times.extend([now] * len(ids))
            delta = choice.get("delta")
            text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if text:
                result.texts.append(text)
            if choice.get("finish_reason"):
                result.finish_reason = choice["finish_reason"]
    return False
