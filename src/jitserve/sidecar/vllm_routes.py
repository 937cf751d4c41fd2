"""vLLM's utility endpoints, forwarded to it as they are (owner: sidecar).

Load generators and clients written for a vLLM server call more than the completion
routes: vLLM's own serving benchmark (``vllm.benchmarks.serve``) re-aligns its random
prompts with ``POST /tokenize`` and ``POST /detokenize``, and tools read ``GET /version``.
The sidecar schedules generation only, so these requests go to the backend unchanged
(method, JSON body, status, body and content type back), with no queueing: they cost
vLLM's tokenizer, not a batch slot. When vLLM cannot be reached the client gets the
sidecar's OpenAI-shaped 503 with ``Retry-After``, like every other route.

:func:`add_vllm_routes` registers them on the sidecar's aiohttp application.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import web

from jitserve.sidecar.backend import VLLMBackend
from jitserve.sidecar.errors import backend_down

VLLM_ROUTES: tuple[tuple[str, str], ...] = (
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("GET", "/version"),
)
"""(method, path) forwarded to vLLM unchanged."""

_TIMEOUT = aiohttp.ClientTimeout(total=30.0, sock_connect=3.0)
_FORWARDED_HEADERS = ("Content-Type", "Accept", "Authorization")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _handler(backend: VLLMBackend, method: str, path: str) -> Handler:
    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read() if request.can_read_body else None
        headers = {h: request.headers[h] for h in _FORWARDED_HEADERS if h in request.headers}
        try:
            async with backend.session.request(method, backend.base_url + path, data=body,
                                               headers=headers, params=request.query,
                                               timeout=_TIMEOUT) as resp:
                payload = await resp.read()
                return web.Response(body=payload, status=resp.status,
                                    content_type=resp.content_type,
                                    charset=resp.charset)
        except (TimeoutError, aiohttp.ClientError, OSError) as err:
            raise backend_down(message=f"the model backend is unavailable: {path}: "
                               f"{type(err).__name__}: {err}") from err

    return forward


def add_vllm_routes(app: web.Application, backend: VLLMBackend) -> None:
    """Serve :data:`VLLM_ROUTES` on ``app`` by forwarding them to ``backend``."""
    for method, path in VLLM_ROUTES:
        app.router.add_route(method, path, _handler(backend, method, path))
