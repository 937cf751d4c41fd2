"""The sidecar's HTTP server (aiohttp): OpenAI-compatible API in front of vLLM.

Owner: sidecar. Routes:

- ``POST /v1/chat/completions``, ``POST /v1/completions``: stream and non-stream, with a
  ``usage`` block; per-request SLO (see :mod:`jitserve.sidecar.api`); tenants from API
  keys or the ``x-tenant`` header (:class:`~jitserve.sidecar.config.TenantKeys`);
  requests using structured outputs, tools, logprobs or ``n`` are forwarded to vLLM's
  own endpoint (:mod:`~jitserve.sidecar.passthrough`); ``X-Request-Id`` is echoed as
  ``x-request-id`` (:mod:`~jitserve.sidecar.request_ids`);
- ``GET /v1/models``: vLLM's model list;
- vLLM's other routes (``/v1/responses``, ``/v1/embeddings``, ``/pooling``, ``/score``,
  ``/rerank``, ``/tokenize``...): passed through unscheduled, with the tenant's key and
  accounting (:mod:`~jitserve.sidecar.vllm_routes`);
- ``GET /health`` (liveness: the process serves), ``GET /ready`` (readiness: vLLM answers,
  the policy is loaded and, with keys on, keys loaded; 503 with the reason otherwise),
  ``GET /metrics`` (Prometheus), ``GET /debug/scheduler`` (policy figures, recent frames
  and dispatches). With ``--admin-port`` the last two are served there only; otherwise,
  with keys on, they need an admin key (:func:`~jitserve.sidecar.intake.check_admin`).

Reading requests safely is :mod:`~jitserve.sidecar.intake`, writing answers
:mod:`~jitserve.sidecar.responses`. Connections must send their headers within
``header_timeout_s`` (idle keep-alive connections close after it too). Shutdown
(:func:`serve`) is bounded by ``drain_s`` in all: the queued and running requests get all
but the last :data:`CLOSE_S` of it to finish, then every one still open gets a final error
event and the server closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from jitserve.policy import SLOPolicySpec
from jitserve.requests import Request
from jitserve.scheduling.base import Policy
from jitserve.sidecar import intake, passthrough, request_ids, responses
from jitserve.sidecar.api import Endpoint, ParsedRequest, parse_request
from jitserve.sidecar.backend import BackendUnavailable, VLLMBackend
from jitserve.sidecar.bounds import Analyzer
from jitserve.sidecar.config import ConfigWatcher, SidecarSettings, TenantKeys
from jitserve.sidecar.dispatcher import Dispatcher, PolicyFactory, default_policy_factory
from jitserve.sidecar.errors import APIError, backend_down, bad_request
from jitserve.sidecar.jobs import EventKind, Job
from jitserve.sidecar.metrics import SidecarMetrics
from jitserve.sidecar.prompts import PromptReader, served_model
from jitserve.sidecar.vllm_routes import TenantGate, add_vllm_routes
from jitserve.slo import SLOError

log = logging.getLogger("jitserve.sidecar")

CLOSE_S = 1.0
"""The end of the drain reserved for ending open requests with an error and closing."""
HANDLER_GRACE_S = 0.5
"""How long open handlers get to send their final error event (within CLOSE_S)."""


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
        self._policy_factory = policy_factory
        self.watcher = ConfigWatcher(settings.config_path, self._on_spec, self._on_reload,
                                     settings.reload_interval_s, validate=self._validate_spec)
        self.keys = TenantKeys(settings)
        self.keys.rebuild(self.watcher.spec)
        self.backend = VLLMBackend(settings.backend_url, stall_timeout_s=settings.stall_timeout_s)
        self.dispatcher = Dispatcher(
            self.backend, self.watcher.spec, self.metrics, max_running=settings.max_running,
            engine_queue=settings.engine_queue, policy_factory=policy_factory, analyzer=analyzer,
            min_frame_s=settings.min_frame_s, max_frame_s=settings.max_frame_s,
            health_interval_s=settings.health_interval_s)
        self.dispatcher.apply_spec(self.watcher.spec)
        self.metrics.built(settings.policy_name, self.spec.scheduler.policy)
        self._update_tenants()
        self.app = web.Application(client_max_size=settings.max_body_bytes,
                                   middlewares=[responses.errors_middleware])
        self.app.add_routes([
            web.post("/v1/chat/completions", self.chat_completions),
            web.post("/v1/completions", self.completions),
            web.get("/v1/models", self.list_models),
            web.get("/health", self.health),
            web.get("/ready", self.ready),
        ])
        # /v1/responses, /v1/embeddings, /score..., /tokenize: to vLLM, unscheduled
        add_vllm_routes(self.app, self.backend, TenantGate(self.keys, self.metrics),
                        read_timeout_s=settings.stall_timeout_s or None)
        self.admin_app: web.Application | None = None
        if settings.admin_port is None:
            self.app.add_routes([web.get("/metrics", self.metrics_handler),
                                 web.get("/debug/scheduler", self.debug_scheduler)])
        else:
            self.admin_app = web.Application(middlewares=[responses.errors_middleware])
            self.admin_app.add_routes([web.get("/metrics", self.metrics_handler),
                                       web.get("/debug/scheduler", self.debug_scheduler),
                                       web.get("/health", self.health),
                                       web.get("/ready", self.ready)])
        self.app.on_response_prepare.append(request_ids.on_prepare)
        self.prompts = PromptReader(self.backend)
        self.app.on_startup.append(self._startup)
        self.app.on_cleanup.append(self._cleanup)
        self._watch_task: asyncio.Task[None] | None = None
        self._analyzer_client: Any = None
        self._runners: list[web.AppRunner] = []
        self._open_handlers = 0
        self.port: int | None = None
        self.admin_port: int | None = None

    # ---- lifecycle ----------------------------------------------------------------------
    @property
    def spec(self) -> SLOPolicySpec:
        return self.dispatcher.spec

    @property
    def policy(self) -> Policy:
        return self.dispatcher.policy

    def _validate_spec(self, spec: SLOPolicySpec) -> None:
        """What the schema cannot check: the scheduler exists (ValueError otherwise)."""
        current = getattr(self, "dispatcher", None)
        if current is None or spec.scheduler.policy != current.spec.scheduler.policy:
            self._policy_factory(spec)

    def _on_spec(self, spec: SLOPolicySpec) -> None:
        self.dispatcher.apply_spec(spec)
        self.metrics.built(self.settings.policy_name, spec.scheduler.policy)
        self.keys.rebuild(spec)
        self._update_tenants()

    def _on_reload(self, result: str) -> None:
        self.metrics.config_reloads.labels(result).inc()

    def _update_tenants(self) -> None:
        """The tenant label set: the policy's tenants, the key owners and ``default``."""
        self.metrics.known_tenants = frozenset(
            {"default", *(t.name for t in self.spec.fairness.tenants), *self.keys.keys.values()})

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
                self._update_tenants()
            except Exception:  # a bug in a reload must not stop serving
                log.exception("policy or keys reload failed")

    async def _cleanup(self, app: web.Application) -> None:
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch_task
        await self.dispatcher.shutdown()
        if self._analyzer_client is not None:
            await self._analyzer_client.close()

    async def _serve_app(self, app: web.Application, port: int) -> int:
        # keepalive_timeout also closes a connection that has not sent a whole request
        # (headers) this long after it opened or after its last answer: slowloris.
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                               keepalive_timeout=self.settings.header_timeout_s,
                               shutdown_timeout=HANDLER_GRACE_S)
        await runner.setup()
        self._runners.append(runner)
        site = web.TCPSite(runner, self.settings.host, port, reuse_address=True)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        return int(sockets[0].getsockname()[1]) if sockets else port

    async def start(self) -> int:
        """Serve on settings.host:port (port 0: any free port); returns the port."""
        self.port = await self._serve_app(self.app, self.settings.port)
        if self.admin_app is not None:
            assert self.settings.admin_port is not None
            self.admin_port = await self._serve_app(self.admin_app, self.settings.admin_port)
        return self.port

    async def shutdown(self, drain_s: float) -> None:
        """Refuse new requests, let the queued and running ones finish for up to
        ``drain_s - CLOSE_S``, then end every one still open with an error event."""
        d = self.dispatcher
        d.draining = True
        deadline = time.monotonic() + max(0.0, drain_s - CLOSE_S)
        while d.jobs and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        log.info("drain over: %d open requests end with an error event", len(d.jobs))
        with contextlib.suppress(TimeoutError):  # a stuck task must not hold the exit
            async with asyncio.timeout(HANDLER_GRACE_S):
                await d.shutdown()  # every open request gets its final error event
        deadline = time.monotonic() + HANDLER_GRACE_S
        while self._open_handlers and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        log.info("shutdown: %d handlers still open", self._open_handlers)

    async def stop(self) -> None:
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()
        log.info("stopped")

    # ---- probes, metrics ----------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def ready(self, request: web.Request) -> web.Response:
        d = self.dispatcher
        auth_down = self.keys.unavailable
        ready = d.ready and not d.draining and auth_down is None
        body: dict[str, Any] = {"ready": ready, "backend": self.settings.backend_url,
                                "policy": d.policy.name, "models": d.models}
        if not ready:
            body["reason"] = ("shutting down" if d.draining else
                              auth_down if auth_down is not None else d.health.reason)
        if self.watcher.last_error:
            body["config_error"] = self.watcher.last_error
        if self.keys.error:
            body["keys_error"] = self.keys.error
        return web.json_response(body, status=200 if ready else 503)

    def _admin(self, request: web.Request) -> None:
        if self.admin_app is None:
            intake.check_admin(request, self.keys, self.settings)

    async def metrics_handler(self, request: web.Request) -> web.Response:
        """The sidecar's families, then the process-wide registry (the analyzer client's
        fallback counters, process and Python collectors)."""
        self._admin(request)
        self.dispatcher._gauges()
        body = self.metrics.render() + generate_latest(REGISTRY)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def debug_scheduler(self, request: web.Request) -> web.Response:
        self._admin(request)
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

    def _check_program_room(self, parsed: ParsedRequest, tenant: str) -> None:
        if parsed.program is None:
            return
        d, cap = self.dispatcher, self.spec.limits.max_programs
        live = d.programs.programs
        if (tenant, parsed.program.program_id) not in live and len(live) >= cap:
            raise APIError(429, f"too many compound programs in flight ({cap}, "
                           "limits.maxPrograms of the policy)", type_="rate_limit_error",
                           param="slo.program_id", code="too_many_programs",
                           retry_after_s=d.retry_after_s())

    async def _submit(self, request: web.Request,
                      endpoint: Endpoint) -> tuple[Job, ParsedRequest]:
        arrival = time.monotonic()
        request_ids.client_id(request)
        tenant = intake.tenant_of(request, self.keys)
        raw = await intake.read_json(request, self.settings)
        parsed = parse_request(endpoint, raw, request.headers, self.spec.slo_defaults,
                               self.spec.fairness.default_class_of(tenant), self.spec.limits,
                               forward_chat=self.settings.reasoning_parser is not None)
        d = self.dispatcher
        if d.draining:
            raise APIError(503, "the sidecar is shutting down", type_="service_unavailable",
                           code="shutting_down", retry_after_s=2)
        if not d.ready:
            d.metrics.rejections.labels("backend_down").inc()
            raise backend_down(d.retry_after_s(),
                               f"the model backend is unavailable: {d.health.reason}")
        self._check_program_room(parsed, tenant)
        model = served_model(parsed, d.models)
        max_len: int | None = None
        if parsed.prompt_ids is not None:
            prompt_ids = parsed.prompt_ids
        else:
            prompt_ids, max_len = await self.prompts.tokenize(parsed, model)
        if not prompt_ids:
            raise bad_request("messages" if endpoint == "chat" else "prompt",
                              "tokenizes to nothing")
        max_tokens = await self.prompts.max_tokens(parsed, model, len(prompt_ids), max_len,
                                                   self.settings.default_max_tokens)
        prefix = "chatcmpl" if endpoint == "chat" else "cmpl"
        try:
            req = Request(
                request_id=d.new_request_id(prefix), tenant=tenant, slo=parsed.slo,
                prompt_tokens=len(prompt_ids), arrival_s=arrival,
                max_tokens=max_tokens * parsed.n,
                slo_class=parsed.slo_class, app=parsed.app, model=model,
                prompt_text=parsed.prompt,
                program_id=parsed.program.program_id if parsed.program else None,
                stage=parsed.program.stage if parsed.program else 0,
                preemptible=parsed.forward is None,
            )
        except SLOError as err:
            raise bad_request(err.field, str(err)) from err
        request_ids.remember(request, req.request_id)
        events = responses.BoundedEvents(self.settings.max_buffered_tokens)
        job = await d.submit(req, model=model, prompt_ids=prompt_ids,
                             max_tokens=max_tokens * parsed.n, sampling=parsed.sampling,
                             min_tokens=parsed.min_tokens, program=parsed.program,
                             events=events, forward=parsed.forward,
                             forward_path=passthrough.path_of(parsed))
        events.on_overflow = lambda: d.cancel(job)
        return job, parsed

    async def _generate(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        self._open_handlers += 1
        try:
            return await self._run_job(request, endpoint)
        finally:
            self._open_handlers -= 1

    async def _run_job(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        job, parsed = await self._submit(request, endpoint)
        d = self.dispatcher
        try:
            first = await job.events.get()
            if first.kind is EventKind.ERROR:
                assert first.error is not None
                return responses.error_response(first.error)
            if job.forward is not None:
                if parsed.stream:
                    return await passthrough.stream(request, job, parsed, first,
                                                    self.settings.body_timeout_s)
                return await passthrough.collect(job, first)
            if parsed.stream:
                return await responses.stream(request, job, parsed, first,
                                              self.settings.body_timeout_s)
            return await responses.collect(job, parsed, first)
        finally:
            if not job.done:
                d.cancel(job)


async def serve(settings: SidecarSettings, stop: asyncio.Event | None = None,
                drain_s: float = 20.0) -> None:
    """Run a sidecar until ``stop`` is set (or forever); then refuse new requests, let
    the queued and running ones finish, end the rest with an error event, and stop:
    ``drain_s`` in all."""
    server = SidecarServer(settings)
    port = await server.start()
    log.info("jitserve sidecar on http://%s:%d -> %s (policy %s)%s", settings.host, port,
             settings.backend_url, server.policy.name,
             f"; admin on :{server.admin_port}" if server.admin_port is not None else "")
    try:
        await (stop.wait() if stop is not None else asyncio.Event().wait())
        log.info("stopping: draining for up to %.0f s", drain_s)
        await server.shutdown(drain_s)
    finally:
        await server.stop()
