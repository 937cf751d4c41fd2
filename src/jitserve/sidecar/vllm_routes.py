"""vLLM's other routes, passed through to it as they are (owner: sidecar).

The sidecar schedules chat and text completions only. Everything else vLLM serves goes
to the backend unchanged and unscheduled (no queue, no priority, no preemption, no SLO):

- :data:`API_ROUTES`: the OpenAI Responses API (``/v1/responses``), embeddings, pooling,
  classification, scoring and reranking, audio transcription and translation. They are
  tenants' traffic: with API keys on they need a tenant's key like the completion routes
  (401/403 as there), and each answer is counted for its tenant in
  ``jitserve_passthrough_requests_total{tenant,route,code}``;
- :data:`UTILITY_ROUTES`: ``/tokenize`` and ``/detokenize`` (vLLM's own serving benchmark
  re-aligns its prompts with them; they cost the tokenizer, not a batch slot; keys on:
  a tenant's key) and ``GET /version`` (open, as on vLLM).

Method, path, query, body and content type go to vLLM; its status, content type and body
come back, a streamed body (``/v1/responses`` with ``stream: true``) chunk by chunk as
vLLM writes it. A tenant's key is never sent on to vLLM (it is jitserve's secret); with
keys off the client's ``Authorization`` is (a vLLM started with its own ``--api-key``).
When vLLM cannot be reached the client gets the sidecar's OpenAI-shaped 503 with
``Retry-After``, like every other route.

:func:`add_vllm_routes` registers them on the sidecar's aiohttp application.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Protocol

import aiohttp
from aiohttp import web

from jitserve.sidecar import intake, request_ids
from jitserve.sidecar.backend import VLLMBackend
from jitserve.sidecar.config import TenantKeys
from jitserve.sidecar.errors import backend_down
from jitserve.sidecar.metrics import SidecarMetrics

API_ROUTES: tuple[tuple[str, str], ...] = (
    ("POST", "/v1/responses"),
    ("GET", "/v1/responses/{response_id}"),
    ("POST", "/v1/responses/{response_id}/cancel"),
    ("POST", "/v1/embeddings"),
    ("POST", "/v2/embed"),
    ("POST", "/pooling"),
    ("POST", "/classify"),
    ("POST", "/score"),
    ("POST", "/v1/score"),
    ("POST", "/rerank"),
    ("POST", "/v1/rerank"),
    ("POST", "/v2/rerank"),
    ("POST", "/v1/audio/transcriptions"),
    ("POST", "/v1/audio/translations"),
)
"""(method, route) of tenants' requests passed through unscheduled, keyed and counted."""
UTILITY_ROUTES: tuple[tuple[str, str], ...] = (
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
)
"""(method, route) passed through, keyed, not counted."""
OPEN_ROUTES: tuple[tuple[str, str], ...] = (("GET", "/version"),)
"""(method, route) passed through to anyone."""

_TIMEOUT_CONNECT_S = 3.0
_FORWARDED_HEADERS = ("Content-Type", "Accept")


class Gate(Protocol):
    """Who may use a passed-through route, and where its answer is counted."""

    @property
    def keys_on(self) -> bool: ...

    def tenant(self, request: web.Request) -> str:
        """The request's tenant; raises the 401/403/503 the completion routes would."""
        ...

    def count(self, tenant: str, route: str, status: int) -> None: ...


class TenantGate:
    """The sidecar's :class:`Gate`: its tenant keys, its metrics."""

    def __init__(self, keys: TenantKeys, metrics: SidecarMetrics) -> None:
        self._keys = keys
        self._metrics = metrics

    @property
    def keys_on(self) -> bool:
        return self._keys.enabled

    def tenant(self, request: web.Request) -> str:
        request_ids.client_id(request)
        return intake.tenant_of(request, self._keys)

    def count(self, tenant: str, route: str, status: int) -> None:
        self._metrics.passthrough.labels(tenant, route, str(status)).inc()


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _headers(request: web.Request, gate: Gate) -> dict[str, str]:
    names = _FORWARDED_HEADERS if gate.keys_on else (*_FORWARDED_HEADERS, "Authorization")
    return {h: request.headers[h] for h in names if h in request.headers}


def _handler(backend: VLLMBackend, gate: Gate, method: str, route: str, *, keyed: bool,
             counted: bool, read_timeout_s: float | None) -> Handler:
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=_TIMEOUT_CONNECT_S,
                                    sock_read=read_timeout_s)

    async def forward(request: web.Request) -> web.StreamResponse:
        tenant = gate.tenant(request) if keyed else ""
        body = await request.read() if request.can_read_body else None
        url = backend.base_url + request.rel_url.path
        try:
            async with backend.session.request(method, url, data=body,
                                               headers=_headers(request, gate),
                                               params=request.query,
                                               timeout=timeout) as resp:
                if counted:
                    gate.count(tenant, route, resp.status)
                if resp.content_type != "text/event-stream":
                    return web.Response(body=await resp.read(), status=resp.status,
                                        content_type=resp.content_type, charset=resp.charset)
                out = web.StreamResponse(status=resp.status)
                out.content_type = resp.content_type
                if resp.charset:
                    out.charset = resp.charset
                await out.prepare(request)
                try:
                    async for piece in resp.content.iter_any():
                        await out.write(piece)
                except (aiohttp.ClientError, OSError, TimeoutError):
                    return out  # vLLM went away mid-stream: the client sees it end early
                with contextlib.suppress(ConnectionError):
                    await out.write_eof()
                return out
        except (TimeoutError, aiohttp.ClientError, OSError) as err:
            if counted:
                gate.count(tenant, route, 503)
            raise backend_down(message=f"the model backend is unavailable: {route}: "
                               f"{type(err).__name__}: {err}") from err

    return forward


def add_vllm_routes(app: web.Application, backend: VLLMBackend, gate: Gate,
                    read_timeout_s: float | None = None) -> None:
    """Serve :data:`API_ROUTES`, :data:`UTILITY_ROUTES` and :data:`OPEN_ROUTES` on ``app``
    by passing them to ``backend``; ``read_timeout_s``: how long vLLM may send nothing
    (None: no limit)."""
    for routes, keyed, counted in ((API_ROUTES, True, True), (UTILITY_ROUTES, True, False),
                                   (OPEN_ROUTES, False, False)):
        for method, route in routes:
            app.router.add_route(method, route, _handler(
                backend, gate, method, route, keyed=keyed, counted=counted,
                read_timeout_s=read_timeout_s))
