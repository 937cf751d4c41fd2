"""The sidecar's HTTP server (aiohttp): OpenAI-compatible API in front of vLLM.

Owner: sidecar. Routes:

- ``POST /v1/chat/completions``, ``POST /v1/completions``: stream and non-stream, with a
  ``usage`` block; per-request SLO (see :mod:`jitserve.sidecar.api`); tenants from API
  keys or the ``x-tenant`` header (:class:`~jitserve.sidecar.config.TenantKeys`);
- ``GET /v1/models``: vLLM's model list;
- ``GET /health`` (liveness: the process serves), ``GET /ready`` (readiness: vLLM answers
  and the policy is loaded; 503 with the reason otherwise), ``GET /metrics``
  (Prometheus), ``GET /debug/scheduler`` (policy figures, recent frames and dispatches).

Errors are OpenAI-shaped JSON: 400 naming the field, 401/403 for keys, 404 unknown
model or route, 413 body over ``max_body_bytes``, 429 queue full or waiting time
exceeded, 503 backend down or SLO unreachable under overload; 429/503 carry
``Retry-After``. A streamed response starts with the first token (so a request that is
refused while queued still gets a proper status); after that, a failure is sent as a
final ``data: {"error": ...}`` event followed by ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from jitserve.policy import SLOPolicySpec
from jitserve.requests import Request
from jitserve.scheduling.base import Policy
from jitserve.sidecar.api import Endpoint, ParsedRequest, parse_request
from jitserve.sidecar.backend import BackendError, BackendUnavailable, VLLMBackend
from jitserve.sidecar.bounds import Analyzer
from jitserve.sidecar.config import ConfigWatcher, SidecarSettings, TenantKeys
from jitserve.sidecar.dispatcher import (
    Dispatcher,
    PolicyFactory,
    default_policy_factory,
)
from jitserve.sidecar.errors import APIError, backend_down, bad_request
from jitserve.sidecar.jobs import Event, EventKind, Job
from jitserve.sidecar.metrics import SidecarMetrics
from jitserve.slo import SLOError

log = logging.getLogger("jitserve.sidecar")

_TENANT_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error_response(err: APIError) -> web.Response:
    return web.json_response(err.body(), status=err.status, headers=err.headers())


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except APIError as err:
        return _error_response(err)
    except web.HTTPRequestEntityTooLarge as err:
        return _error_response(APIError(413, f"request body too large: {err.text}",
                                        code="request_too_large"))
    except web.HTTPException as err:
        if err.status < 400:
            raise
        type_ = "invalid_request_error" if err.status < 500 else "server_error"
        return _error_response(APIError(err.status, err.reason, type_=type_,
                                        code="not_found" if err.status == 404 else None))


class SidecarServer:
    """Wires settings, policy file, backend client, dispatcher, metrics and routes."""

    def __init__(
        self,
        settings: SidecarSettings,
        *,
        policy_factory: PolicyFactory = default_policy_factory,
        analyzer: Analyzer | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = SidecarMetrics()
        self.watcher = ConfigWatcher(settings.config_path, self._on_spec, self._on_reload,
                                     settings.reload_interval_s)
        self.keys = TenantKeys(settings)
        self.keys.rebuild(self.watcher.spec)
        self.backend = VLLMBackend(settings.backend_url)
        self.dispatcher = Dispatcher(
            self.backend, self.watcher.spec, self.metrics, max_running=settings.max_running,
            engine_queue=settings.engine_queue, policy_factory=policy_factory, analyzer=analyzer,
            min_frame_s=settings.min_frame_s,
            max_frame_s=settings.max_frame_s, health_interval_s=settings.health_interval_s)
        self.dispatcher.apply_spec(self.watcher.spec)
        self.app = web.Application(client_max_size=settings.max_body_bytes, middlewares=[_errors])
        self.app.add_routes([
            web.post("/v1/chat/completions", self.chat_completions),
            web.post("/v1/completions", self.completions),
            web.get("/v1/models", self.list_models),
            web.get("/health", self.health),
            web.get("/ready", self.ready),
            web.get("/metrics", self.metrics_handler),
            web.get("/debug/scheduler", self.debug_scheduler),
        ])
        self.app.on_startup.append(self._startup)
        self.app.on_cleanup.append(self._cleanup)
        self._watch_task: asyncio.Task[None] | None = None
        self._analyzer_client: Any = None
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    # ---- lifecycle ----------------------------------------------------------------------
    @property
    def spec(self) -> SLOPolicySpec:
        return self.dispatcher.spec

    @property
    def policy(self) -> Policy:
        return self.dispatcher.policy

    def _on_spec(self, spec: SLOPolicySpec) -> None:
        self.dispatcher.apply_spec(spec)
        try:
            self.keys.rebuild(spec)
        except (OSError, ValueError) as err:
            log.error("tenant keys not reloaded: %s", err)

    def _on_reload(self, result: str) -> None:
        self.metrics.config_reloads.labels(result).inc()

    def _connect_analyzer(self) -> None:
        """The analyzer's asyncio client, when ``--analyzer`` is set and the analyzer
        component is installed; otherwise bounds come from the local estimator."""
        if not self.settings.analyzer or self.dispatcher.analyzer is not None:
            return
        try:
            from jitserve.analyzer.client import AsyncAnalyzerClient
        except ImportError as err:
            log.warning("--analyzer %s ignored: the analyzer client is not installed (%s); "
                        "using the local length estimator", self.settings.analyzer, err)
            return
        self._analyzer_client = AsyncAnalyzerClient(
            self.settings.analyzer, quantile=self.spec.scheduler.length_quantile)
        self.dispatcher.analyzer = self._analyzer_client
        log.info("length bounds from the analyzer at %s", self.settings.analyzer)

    async def _startup(self, app: web.Application) -> None:
        self._connect_analyzer()
        await self.dispatcher.start()
        self._watch_task = asyncio.create_task(self._watch(), name="jitserve-config")

    async def _watch(self) -> None:
        """Poll the policy file and the tenant keys (a Secret can change on its own)."""
        while True:
            await asyncio.sleep(self.settings.reload_interval_s)
            try:
                self.watcher.poll()
                self.keys.rebuild(self.spec)
            except Exception:  # never let a reload bug stop serving
                log.exception("policy or keys reload failed")

    async def _cleanup(self, app: web.Application) -> None:
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch_task
        await self.dispatcher.shutdown()
        if self._analyzer_client is not None:
            await self._analyzer_client.close()

    async def start(self) -> int:
        """Serve on settings.host:port (port 0: any free port); returns the port."""
        self._runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.host, self.settings.port,
                           reuse_address=True)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1]) if sockets else self.settings.port
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ---- probes, metrics ----------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def ready(self, request: web.Request) -> web.Response:
        d = self.dispatcher
        ready = d.ready and not d.draining
        body: dict[str, Any] = {"ready": ready, "backend": self.settings.backend_url,
                                "policy": d.policy.name, "models": d.models}
        if not ready:
            body["reason"] = "shutting down" if d.draining else d.health.reason
        if self.watcher.last_error:
            body["config_error"] = self.watcher.last_error
        return web.json_response(body, status=200 if ready else 503)

    async def metrics_handler(self, request: web.Request) -> web.Response:
        """The sidecar's families, then the process-wide registry (the analyzer client's
        fallback counters, process and Python collectors)."""
        self.dispatcher._gauges()
        body = self.metrics.render() + generate_latest(REGISTRY)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def debug_scheduler(self, request: web.Request) -> web.Response:
        snap = self.dispatcher.snapshot()
        snap["config_error"] = self.watcher.last_error
        return web.json_response(snap)

    async def list_models(self, request: web.Request) -> web.Response:
        try:
            return web.json_response(await self.backend.models())
        except BackendUnavailable as err:
            raise backend_down(message=f"the model backend is unavailable: {err}") from err

    # ---- generation -----------------------------------------------------------------------
    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completions")

    def _tenant(self, request: web.Request) -> str:
        claimed = request.headers.get("x-tenant")
        if self.keys.enabled:
            auth = request.headers.get("Authorization", "")
            key = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
            tenant = self.keys.tenant_of(key) if key else None
            if tenant is None:
                raise APIError(401, "missing or invalid API key (Authorization: Bearer KEY)",
                               type_="authentication_error", code="invalid_api_key")
            if claimed and claimed != tenant:
                raise APIError(403, f"x-tenant: this API key belongs to tenant {tenant!r}, "
                               f"it cannot act as {claimed!r}", type_="permission_error",
                               param="x-tenant", code="tenant_mismatch")
            return tenant
        if claimed is None:
            return "default"
        if not _TENANT_RE.match(claimed):
            raise bad_request("x-tenant", "must be 1-63 letters, digits, '-', '_' or '.'")
        return claimed

    async def _read_json(self, request: web.Request) -> Any:
        length = request.content_length
        if length is not None and length > self.settings.max_body_bytes:
            raise APIError(413, f"request body of {length} bytes is over the limit of "
                           f"{self.settings.max_body_bytes} bytes", code="request_too_large")
        raw = await request.read()
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as err:
            raise bad_request("body", f"invalid JSON: {err}", code="invalid_json") from err

    def _model(self, parsed: ParsedRequest) -> str:
        models = self.dispatcher.models
        if parsed.model is None:
            if not models:
                raise backend_down(message="the model backend is unavailable (no model list yet)")
            return models[0]
        if models and parsed.model not in models:
            raise APIError(404, f"model {parsed.model!r} is not served here (serving: "
                           f"{', '.join(models)})", param="model", code="model_not_found")
        return parsed.model

    async def _submit(self, request: web.Request,
                      endpoint: Endpoint) -> tuple[Job, ParsedRequest]:
        arrival = time.monotonic()
        tenant = self._tenant(request)
        raw = await self._read_json(request)
        parsed = parse_request(endpoint, raw, request.headers, self.spec.slo_defaults,
                               self.spec.fairness.default_class_of(tenant))
        d = self.dispatcher
        if not d.ready:
            d.metrics.rejections.labels("backend_down").inc()
            raise backend_down(d.retry_after_s(),
                               f"the model backend is unavailable: {d.health.reason}")
        model = self._model(parsed)
        max_len: int | None = None
        if parsed.prompt_ids is not None:
            prompt_ids = parsed.prompt_ids
        else:
            try:
                prompt_ids, max_len = await self.backend.tokenize(
                    model, prompt=parsed.prompt, messages=parsed.messages)
            except BackendUnavailable as err:
                raise backend_down(message=f"the model backend is unavailable: {err}") from err
            except BackendError as err:
                param = err.param or ("messages" if endpoint == "chat" else "prompt")
                raise APIError(400, err.message, param=param) from err
        if not prompt_ids:
            raise bad_request("messages" if endpoint == "chat" else "prompt",
                              "tokenizes to nothing")
        max_tokens = parsed.max_tokens
        if max_tokens is None:
            max_tokens = self.settings.default_max_tokens
            if max_len is not None:
                max_tokens = max(1, min(max_tokens, max_len - len(prompt_ids)))
        if max_len is not None and len(prompt_ids) + max_tokens > max_len:
            raise bad_request("max_tokens", f"prompt ({len(prompt_ids)} tokens) + max_tokens "
                              f"({max_tokens}) exceeds the model's context of {max_len} tokens")
        prefix = "chatcmpl" if endpoint == "chat" else "cmpl"
        try:
            req = Request(
                request_id=d.new_request_id(prefix), tenant=tenant, slo=parsed.slo,
                prompt_tokens=len(prompt_ids), arrival_s=arrival, max_tokens=max_tokens,
                slo_class=parsed.slo_class, app=parsed.app, model=model,
                prompt_text=parsed.prompt,
                program_id=parsed.program.program_id if parsed.program else None,
                stage=parsed.program.stage if parsed.program else 0,
            )
        except SLOError as err:
            raise bad_request(err.field, str(err)) from err
        job = await d.submit(req, model=model, prompt_ids=prompt_ids, max_tokens=max_tokens,
                             sampling=parsed.sampling, min_tokens=parsed.min_tokens,
                             program=parsed.program)
        return job, parsed

    async def _generate(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        job, parsed = await self._submit(request, endpoint)
        d = self.dispatcher
        try:
            first = await job.events.get()
            if first.kind is EventKind.ERROR:
                assert first.error is not None
                return _error_response(first.error)
            if parsed.stream:
                return await self._stream(request, job, parsed, first)
            return await self._collect(job, parsed, first)
        finally:
            if not job.done:
                d.cancel(job)

    # ---- response bodies -------------------------------------------------------------------
    def _extension(self, job: Job) -> dict[str, Any]:
        live = job.live
        return {"request_id": job.request_id, "tenant": live.req.tenant,
                "slo_kind": live.req.kind.value, "slo_class": live.req.slo_class,
                "preemptions": live.preemptions, "outcome": job.outcome}

    def _usage(self, job: Job) -> dict[str, int]:
        prompt = len(job.prompt_ids)
        completion = len(job.generated_ids)
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion}

    async def _collect(self, job: Job, parsed: ParsedRequest, first: Event) -> web.Response:
        texts: list[str] = []
        event = first
        while True:
            if event.kind is EventKind.TOKENS:
                texts.append(event.text)
            elif event.kind is EventKind.ERROR:
                assert event.error is not None
                return _error_response(event.error)
            else:
                break
            event = await job.events.get()
        text = "".join(texts)
        choice: dict[str, Any] = {"index": 0, "finish_reason": event.finish_reason,
                                  "logprobs": None}
        if parsed.endpoint == "chat":
            choice["message"] = {"role": "assistant", "content": text}
            obj = "chat.completion"
        else:
            choice["text"] = text
            obj = "text_completion"
        if parsed.return_token_ids:
            choice["token_ids"] = job.generated_ids
        body = {"id": job.request_id, "object": obj, "created": int(time.time()),
                "model": job.model, "choices": [choice], "usage": self._usage(job),
                "jitserve": self._extension(job)}
        return web.json_response(body, headers={"x-jitserve-request-id": job.request_id})

    async def _stream(self, request: web.Request, job: Job, parsed: ParsedRequest,
                      first: Event) -> web.StreamResponse:
        resp = web.StreamResponse(headers={
            "Content-Type": "text/event-stream", "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no", "x-jitserve-request-id": job.request_id})
        await resp.prepare(request)
        chat = parsed.endpoint == "chat"
        head = json.dumps({"id": job.request_id,
                           "object": "chat.completion.chunk" if chat else "text_completion",
                           "created": int(time.time()), "model": job.model})[:-1]
        with_ids = parsed.return_token_ids
        # Pre-rendered chunk pieces: the per-token work is one json.dumps of the text.
        if chat:
            before = f'data: {head}, "choices": [{{"index": 0, "delta": {{"content": '
            after_open = '}, "logprobs": null, "finish_reason": null'
        else:
            before = f'data: {head}, "choices": [{{"index": 0, "text": '
            after_open = ', "logprobs": null, "finish_reason": null'
        parts: list[str] = []
        if chat:
            parts.append(f'data: {head}, "choices": [{{"index": 0, "delta": {{"role": "assistant", '
                         f'"content": ""}}, "logprobs": null, "finish_reason": null}}]}}\n\n')
        event: Event | None = first
        final: Event | None = None
        while True:
            while event is not None:
                if event.kind is EventKind.TOKENS:
                    ids = f', "token_ids": {json.dumps(event.token_ids)}' if with_ids else ""
                    parts.append(f"{before}{json.dumps(event.text)}{after_open}{ids}}}]}}\n\n")
                else:
                    final = event
                    break
                event = job.events.get_nowait() if not job.events.empty() else None
            if final is not None:
                parts.append(self._stream_tail(job, parsed, head, final))
            if parts:
                try:
                    await resp.write("".join(parts).encode())
                except ConnectionError:  # the client left; the caller cancels the job
                    return resp
                parts.clear()
            if final is not None:
                break
            event = await job.events.get()
        with contextlib.suppress(ConnectionError):
            await resp.write_eof()
        return resp

    def _stream_tail(self, job: Job, parsed: ParsedRequest, head: str, final: Event) -> str:
        if final.kind is EventKind.ERROR:
            assert final.error is not None
            return f"data: {json.dumps(final.error.body())}\n\ndata: [DONE]\n\n"
        chat = parsed.endpoint == "chat"
        delta = '"delta": {}, ' if chat else '"text": "", '
        out = (f'data: {head}, "choices": [{{"index": 0, {delta}"logprobs": null, '
               f'"finish_reason": {json.dumps(final.finish_reason)}}}]}}\n\n')
        if parsed.include_usage:
            out += (f'data: {head}, "choices": [], "usage": {json.dumps(self._usage(job))}, '
                    f'"jitserve": {json.dumps(self._extension(job))}}}\n\n')
        return out + "data: [DONE]\n\n"


async def serve(settings: SidecarSettings, stop: asyncio.Event | None = None,
                drain_s: float = 20.0) -> None:
    """Run a sidecar until ``stop`` is set (or forever); then refuse new requests, let
    the queued and running ones finish for up to ``drain_s``, and stop."""
    server = SidecarServer(settings)
    port = await server.start()
    log.info("jitserve sidecar on http://%s:%d -> %s (policy %s)", settings.host, port,
             settings.backend_url, server.policy.name)
    try:
        await (stop.wait() if stop is not None else asyncio.Event().wait())
        log.info("stopping: draining for up to %.0f s", drain_s)
        await server.dispatcher.drain(drain_s)
    finally:
        await server.stop()
