"""Server-Sent Events as the OpenAI-compatible servers frame them (owner: core).

The one reader and the one writer of SSE in jitserve. The sidecar's token path
(``sidecar/wire.py``), its forwarded requests (``sidecar/backend.py``) and the load
generator (``bench/stream.py``) split and read events here; the sidecar's answers
(``sidecar/responses.py``, ``sidecar/passthrough.py``), the gateway's error endings and the
benchmark's token source frame theirs here. An event ends at a blank line; CRLF line ends
read as LF; an event's data is its ``data:`` lines joined by newlines, one leading space
dropped; an event without data (a comment, a keep-alive) has none. vLLM writes one
``data:`` line per event, the fast path.
"""

from __future__ import annotations

import json
from typing import Any, Final

DONE = b"[DONE]"
"""The data of the OpenAI stream's last event."""

HEADERS: Final = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                  "X-Accel-Buffering": "no"}
"""A streamed answer's headers: not cached, not buffered by a proxy (nginx reads the last)."""

LAST: Final = "data: [DONE]\n\n"
"""The stream's last event, as written."""


def split(buffer: bytes) -> tuple[list[bytes], bytes]:
    """The whole events in ``buffer``, and the rest (an event not yet ended)."""
    if b"\r" in buffer:
        buffer = buffer.replace(b"\r\n", b"\n")
    *events, rest = buffer.split(b"\n\n")
    return events, rest


def data(event: bytes) -> bytes | None:
    """The event's data; None when it has no ``data:`` line."""
    if event.startswith(b"data:") and b"\n" not in event:
        payload = event[5:]
        return payload[1:] if payload.startswith(b" ") else payload
    lines = [line[5:] for line in event.split(b"\n") if line.startswith(b"data:")]
    if not lines:
        return None
    return b"\n".join(line[1:] if line.startswith(b" ") else line for line in lines)


def event(payload: str) -> str:
    """One event carrying ``payload`` (one line: a JSON document or ``[DONE]``) as data."""
    return f"data: {payload}\n\n"


def json_event(doc: Any) -> str:
    """One event carrying ``doc`` as JSON."""
    return event(json.dumps(doc))


def error_ending(body: Any) -> str:
    """How a stream that fails after its head ends, as vLLM ends it: the error as an
    event, then ``[DONE]``."""
    return json_event(body) + LAST
