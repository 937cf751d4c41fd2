"""The sidecar's HTTP server (aiohttp): OpenAI-compatible API in front of vLLM.

Owner: sidecar. Routes:

- ``POST /v1/chat/completions``, ``POST /v1/completions``: the scheduled routes
  (:mod:`~jitserve.sidecar.completions`): stream and non-stream, with a ``usage`` block;
  per-request SLO (see :mod:`jitserve.sidecar.api`); tenants from API keys or the
  ``x-tenant`` header (:class:`~jitserve.sidecar.config.TenantKeys`); requests using
  structured outputs, tools, logprobs or ``n`` are forwarded to vLLM's own endpoint
  (:mod:`~jitserve.sidecar.passthrough`); ``X-Request-Id`` is echoed as
  ``x-request-id`` (:mod:`~jitserve.sidecar.request_ids`);
- ``GET /v1/models``: vLLM's model list;
- vLLM's other routes (``/v1/responses``, ``/v1/embeddings``, ``/pooling``, ``/score``,
  ``/rerank``, ``/tokenize``...): passed through unscheduled, with the tenant's key and
  accounting (:mod:`~jitserve.sidecar.vllm_routes`);
- ``GET /health`` (liveness: the process serves), ``GET /ready`` (readiness: vLLM answers,
  the policy is loaded and, with keys on, keys loaded; 503 with the reason otherwise),
  ``GET /metrics`` (Prometheus), ``GET /debug/scheduler`` (policy figures, recent frames
  and dispatches), ``GET /v1/replica`` (the replica report a gateway places from:
  :mod:`~jitserve.sidecar.replica`). With ``--admin-port`` the last three are served
  there only; otherwise,
  with keys on, they need an admin key (:func:`~jitserve.sidecar.intake.check_admin`).

Reading requests safely is :mod:`~jitserve.sidecar.intake`, writing answers
:mod:`~jitserve.sidecar.responses`; this module wires the parts and owns start and stop.
Connections must send their headers within ``header_timeout_s`` (idle keep-alive
connections close after it too). Shutdown (:func:`serve`) is bounded by ``drain_s`` in
all: the queued and running requests get all but the last :data:`CLOSE_S` of it to
finish, then every one still open gets a final error event and the server closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from jitserve.policy import AUTO, SLOPolicySpec
from jitserve.scheduling.base import Policy
from jitserve.sidecar import intake, request_ids, responses
from jitserve.sidecar.access_log import JSONAccessLogger, access_logger
from jitserve.sidecar.backend import VLLMBackend
from jitserve.sidecar.bounds import Analyzer
from jitserve.sidecar.completions import CompletionRoutes
from jitserve.sidecar.config import ConfigWatcher, SidecarSettings, TenantKeys
from jitserve.sidecar.dispatcher import Dispatcher
from jitserve.sidecar.errors import backend_down
from jitserve.sidecar.in_effect import PolicyFactory, default_policy_factory
from jitserve.sidecar.metrics import SidecarMetrics
from jitserve.sidecar.prompts import PromptReader
from jitserve.sidecar.replica import EngineMetrics, ReplicaReporter
from jitserve.sidecar.tuning import LiveTuner, Replayer, auto_profile
from jitserve.sidecar.upstream import BackendUnavailable
from jitserve.sidecar.vllm_routes import TenantGate, add_vllm_routes

log = logging.getLogger("jitserve.sidecar")


def simulator_only(spec: SLOPolicySpec) -> list[str]:
    """What ``spec`` asks that a live pod does not do (the simulator does): said in the
    log at start and on every reload, so a setting never does nothing silently."""
    if not spec.scheduler.batch_constructor:
        return []
    return ["scheduler.batchConstructor is on, but only jitserve bench's simulator builds "
            "batches with it: this pod's vLLM schedules its own batches"]

CLOSE_S = 1.0
"""The end of the drain reserved for ending open requests with an error and closing."""
HANDLER_GRACE_S = 0.5
"""How long open handlers get to send their final error event (within CLOSE_S)."""


async def serve_app(app: web.Application, host: str, port: int,
                    header_timeout_s: float, access_log: bool = False,
                    ) -> tuple[web.AppRunner, int]:
    """Serve ``app`` on host:port (port 0: any free one): its runner and the bound port.
    The sidecar's and the gateway's ports are served this way; ``access_log``: a JSON
    line per answer (:mod:`jitserve.sidecar.access_log`)."""
    # keepalive_timeout also closes a connection that has not sent a whole request
    # (headers) this long after it opened or after its last answer: slowloris.
    logging_args: dict[str, Any] = {"access_log": None}
    if access_log:
        logging_args = {"access_log": access_logger(), "access_log_class": JSONAccessLogger}
    runner = web.AppRunner(app, handler_cancellation=True, **logging_args,
                           keepalive_timeout=header_timeout_s,
                           shutdown_timeout=HANDLER_GRACE_S)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    sockets = getattr(site._server, "sockets", None) or []
    return runner, int(sockets[0].getsockname()[1]) if sockets else port


class SidecarServer:
    """Wires settings, policy file, backend client, dispatcher, metrics and routes."""

    def __init__(
        self,
        settings: SidecarSettings,
        *,
        policy_factory: PolicyFactory = default_policy_factory,
        analyzer: Analyzer | None = None,
        replayer: Replayer | None = None,
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
            engine_queue=settings.engine_queue,
            engine_queue_unstarted=settings.engine_queue_unstarted,
            policy_factory=policy_factory, analyzer=analyzer,
            min_frame_s=settings.min_frame_s, max_frame_s=settings.max_frame_s,
            health_interval_s=settings.health_interval_s)
        self.tuner = LiveTuner(self.dispatcher, self.metrics, settings.engine_profile, replayer)
        self._apply(self.watcher.spec)
        self.metrics.built(settings.policy_name, self.spec.scheduler.policy)
        self._update_tenants()
        self.completion_routes = CompletionRoutes(settings, self.keys, self.dispatcher,
                                                  PromptReader(self.backend))
        self.app = web.Application(client_max_size=settings.max_body_bytes,
                                   middlewares=[responses.errors_middleware])
        self.app.add_routes([
            web.post("/v1/chat/completions", self.completion_routes.chat_completions),
            web.post("/v1/completions", self.completion_routes.completions),
            web.get("/v1/models", self.list_models),
            web.get("/health", self.health),
            web.get("/ready", self.ready),
        ])
        # /v1/responses, /v1/embeddings, /score..., /tokenize: to vLLM, unscheduled
        add_vllm_routes(self.app, self.backend, TenantGate(self.keys, self.metrics),
                        read_timeout_s=settings.stall_timeout_s or None)
        self.engine_metrics = EngineMetrics(settings.backend_url)
        # named as bound; a gateway names it by the URL it reaches it at instead
        self.replica = ReplicaReporter(self.dispatcher, self._is_ready,
                                       lambda: f"{settings.host}:{self.port or settings.port}",
                                       self.engine_metrics)
        self.admin_app: web.Application | None = None
        if settings.admin_port is None:
            self.app.add_routes([web.get("/metrics", self.metrics_handler),
                                 web.get("/debug/scheduler", self.debug_scheduler),
                                 web.get("/v1/replica", self.replica_report)])
        else:
            self.admin_app = web.Application(middlewares=[responses.errors_middleware])
            self.admin_app.add_routes([web.get("/metrics", self.metrics_handler),
                                       web.get("/debug/scheduler", self.debug_scheduler),
                                       web.get("/v1/replica", self.replica_report),
                                       web.get("/health", self.health),
                                       web.get("/ready", self.ready)])
        self.app.on_response_prepare.append(request_ids.on_prepare)
        self.app.on_startup.append(self._startup)
        self.app.on_cleanup.append(self._cleanup)
        self._watch_task: asyncio.Task[None] | None = None
        self._analyzer_client: Any = None
        self._runners: list[web.AppRunner] = []
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
        """What the schema cannot check: the scheduler exists, with ``auto`` each candidate
        and the engine profile (ValueError otherwise)."""
        if spec.scheduler.policy == AUTO:
            auto_profile(spec, self.settings.engine_profile)
            return
        current = getattr(self, "dispatcher", None)
        if current is None or spec.scheduler.policy != current.spec.scheduler.policy:
            self._policy_factory(spec)

    def _apply(self, spec: SLOPolicySpec) -> None:
        self.dispatcher.apply_spec(spec)
        self.tuner.configure(spec)
        self.metrics.fairness.settings = spec.fairness
        for warning in simulator_only(spec):
            log.warning("%s", warning)

    def _on_spec(self, spec: SLOPolicySpec) -> None:
        self._apply(spec)
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
        self.engine_metrics.start()
        self.tuner.start()
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
        await self.engine_metrics.stop()
        await self.tuner.stop()
        await self.dispatcher.shutdown()
        if self._analyzer_client is not None:
            await self._analyzer_client.close()

    async def _serve_app(self, app: web.Application, port: int, access_log: bool = False) -> int:
        runner, bound = await serve_app(app, self.settings.host, port,
                                        self.settings.header_timeout_s, access_log)
        self._runners.append(runner)
        return bound

    async def start(self) -> int:
        """Serve on settings.host:port (port 0: any free port); returns the port. The
        admin port is bound first: once the API answers, both are served (the other way
        round, a taken admin port ended the process just after its API had said ready)."""
        if self.admin_app is not None:
            assert self.settings.admin_port is not None
            self.admin_port = await self._serve_app(self.admin_app, self.settings.admin_port)
        self.port = await self._serve_app(self.app, self.settings.port,
                                          self.settings.access_log)
        return self.port

    async def shutdown(self, drain_s: float) -> None:
        """Refuse new requests, let the queued and running ones finish for up to
        ``drain_s - CLOSE_S``, then end every one still open with an error event."""
        d = self.dispatcher
        await d.drain(max(0.0, drain_s - CLOSE_S))
        log.info("drain over: %d open requests end with an error event", len(d.jobs))
        with contextlib.suppress(TimeoutError):  # a stuck task must not hold the exit
            async with asyncio.timeout(HANDLER_GRACE_S):
                await d.shutdown()  # every open request gets its final error event
        deadline = time.monotonic() + HANDLER_GRACE_S
        while self.completion_routes.open_handlers and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        log.info("shutdown: %d handlers still open", self.completion_routes.open_handlers)

    async def stop(self) -> None:
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()
        log.info("stopped")

    # ---- probes, metrics ----------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    def _is_ready(self) -> bool:
        d = self.dispatcher
        return d.ready and not d.admission.draining and self.keys.unavailable is None

    async def replica_report(self, request: web.Request) -> web.Response:
        """What a gateway places from (:mod:`~jitserve.sidecar.replica`)."""
        self._admin(request)
        await self.engine_metrics.awake()
        return web.json_response(self.replica.json())

    async def ready(self, request: web.Request) -> web.Response:
        d = self.dispatcher
        auth_down = self.keys.unavailable
        ready = self._is_ready()
        body: dict[str, Any] = {"ready": ready, "backend": self.settings.backend_url,
                                "policy": d.policy.name, "models": d.models}
        if not ready:
            body["reason"] = ("shutting down" if d.admission.draining else
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
        self.dispatcher.update_gauges()
        body = self.metrics.render() + generate_latest(REGISTRY)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def debug_scheduler(self, request: web.Request) -> web.Response:
        self._admin(request)
        snap = self.dispatcher.snapshot()
        snap["config_error"] = self.watcher.last_error
        snap["auto"] = self.tuner.explain()
        return web.json_response(snap)

    async def list_models(self, request: web.Request) -> web.Response:
        try:
            return web.json_response(await self.backend.models())
        except BackendUnavailable as err:
            raise backend_down(message=f"the model backend is unavailable: {err}") from err


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
