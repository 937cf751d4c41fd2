"""Request ids on the wire: ``X-Request-Id`` in, ``x-request-id`` out (owner: sidecar).

A client (or a gateway) may name its request with ``X-Request-Id``; every answer of the
API port — success, stream or error — carries ``x-request-id``: the client's id when it
sent one (the ``openai`` SDK's ``_request_id``), else jitserve's own request id once it
has one. jitserve's own id (the response ``id``, ``x-jitserve-request-id``, the metrics
and ``/debug/scheduler``) stays unique even when clients reuse theirs. An id longer than
:data:`MAX_LEN` or holding anything but printable ASCII is refused (400 naming the
header): it is echoed into headers and logs.
"""

from __future__ import annotations

import re

from aiohttp import web

from jitserve.sidecar.errors import bad_request

HEADER = "X-Request-Id"
MAX_LEN = 256
_PRINTABLE = re.compile(r"^[\x21-\x7e]+$")
_OWN = web.RequestKey("jitserve_request_id", str)


def client_id(request: web.Request) -> str | None:
    """The client's ``X-Request-Id``, validated (400 naming the header otherwise)."""
    value = request.headers.get(HEADER)
    if value is None:
        return None
    if len(value) > MAX_LEN or not _PRINTABLE.match(value):
        raise bad_request("x-request-id", f"must be 1-{MAX_LEN} printable ASCII characters")
    return value


def remember(request: web.Request, own_id: str) -> None:
    """jitserve's id of this request, echoed when the client sent none."""
    request[_OWN] = own_id


async def on_prepare(request: web.Request, response: web.StreamResponse) -> None:
    """``x-request-id`` on every answer (an ``on_response_prepare`` signal)."""
    value = request.headers.get(HEADER)
    if value is None or len(value) > MAX_LEN or not _PRINTABLE.match(value):
        value = request.get(_OWN)
    if value:
        response.headers["x-request-id"] = value
