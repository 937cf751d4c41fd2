"""``jitserve gateway``'s HTTP server (aiohttp): the OpenAI API in front of N sidecars
(owner: gateway).

Routes on the API port: ``POST /v1/chat/completions`` and ``/v1/completions`` (placed
from the request's SLO), ``GET /v1/models`` and every other path (vLLM's routes the
sidecars pass through: ``/v1/embeddings``, ``/tokenize``...: placed as best-effort
work), ``/health`` and ``/ready``. On the admin port: ``/health``, ``/ready`` (200 while
at least one replica is in the picks), ``/metrics`` and ``/debug/fleet`` (every
replica's last report, age and error).

What happens to one request, in order: the in-flight bound (429 ``gateway_busy`` past
``--max-in-flight``: memory stays bounded under any overload); the door's limits, the
sidecar's own code (:mod:`jitserve.sidecar.intake`: body size, body read timeout, JSON
depth; headers are bounded by the keep-alive timeout as in the sidecar); the
:class:`~jitserve.placement.base.Ask`, from the sidecar's own parser
(:func:`jitserve.sidecar.api.parse_request`) and policy file; placement
(:class:`~jitserve.gateway.routing.Router`: 503 none ready, 429 all shedding, compound
programs sticky, else ``--placement``); forwarding (:mod:`~jitserve.gateway.proxy`).

Tenant keys are checked in one place, the sidecar: the gateway forwards
``Authorization`` untouched and passes the sidecar's 401/403 through. The sidecar already
owns the keys (the policy's tenants, the mounted Secret, hot reloaded); a second copy
in the gateway would be a second owner to keep in step, and the gateway holds no state
a key protects. A body the gateway's parser refuses (an SLO class its policy file does
not know, say) is still forwarded, placed as best effort, so that the sidecar, the one
owner of request validation, answers it: the gateway never refuses what its replicas
would serve because its own copy of the policy is older.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from jitserve.gateway.fleet import Fleet
from jitserve.gateway.metrics import GatewayMetrics
from jitserve.gateway.proxy import PLACED_ON, Forwarder
from jitserve.gateway.routing import (
    CHARS_PER_TOKEN,
    Router,
    ask_of,
    placement_tenant,
    refusal_error,
)
from jitserve.gateway.settings import GatewaySettings
from jitserve.placement.base import Ask, Refusal
from jitserve.placement.registry import make_placer, use_policy
from jitserve.placement.wire import report_to_json
from jitserve.policy import SLOPolicySpec
from jitserve.sidecar import intake, responses
from jitserve.sidecar.api import Endpoint, parse_request
from jitserve.sidecar.claims import hold_to_contract
from jitserve.sidecar.config import ConfigWatcher
from jitserve.sidecar.errors import APIError, queue_full, request_timeout, shutting_down
from jitserve.sidecar.server import serve_app
from jitserve.slo import DeadlineSLO

log = logging.getLogger("jitserve.gateway")

JSON_TYPES = ("application/json", "")


class GatewayServer:
    def __init__(self, settings: GatewaySettings, fleet: Fleet) -> None:
        self.settings = settings
        self.door = settings.door()
        self.fleet = fleet
        self.metrics = GatewayMetrics()
        self.watcher = ConfigWatcher(settings.config_path, self._use_policy,
                                     lambda result: None, settings.reload_interval_s)
        self.router = Router(make_placer(settings.placement, settings.seed, self.watcher.spec))
        fleet.listeners.append(self.router.placer.reported)
        self.forwarder = Forwarder(fleet, self.metrics, settings.connect_timeout_s)
        self.in_flight = 0
        self.draining = False
        self.app = web.Application(client_max_size=settings.max_body_bytes,
                                   middlewares=[responses.errors_middleware])
        self.app.add_routes([
            web.post("/v1/chat/completions", self.chat_completions),
            web.post("/v1/completions", self.completions),
            web.get("/health", self.health),
            web.get("/ready", self.ready),
            web.route("*", "/{tail:.*}", self.other),
        ])
        self.admin_app = web.Application(middlewares=[responses.errors_middleware])
        self.admin_app.add_routes([web.get("/health", self.health),
                                   web.get("/ready", self.ready),
                                   web.get("/metrics", self.metrics_handler),
                                   web.get("/debug/fleet", self.debug_fleet)])
        self._runners: list[web.AppRunner] = []
        self._watch_task: asyncio.Task[None] | None = None
        self.port: int | None = None
        self.admin_port: int | None = None

    # ---- lifecycle ----------------------------------------------------------------------
    def _use_policy(self, spec: SLOPolicySpec) -> None:
        use_policy(self.router.placer, spec)

    async def _serve_app(self, app: web.Application, port: int) -> int:
        runner, bound = await serve_app(app, self.settings.host, port,
                                        self.settings.header_timeout_s)
        self._runners.append(runner)
        return bound

    async def start(self) -> int:
        await self.fleet.start()
        await self.forwarder.start()
        self._watch_task = asyncio.create_task(self._watch(), name="gateway-config")
        self.port = await self._serve_app(self.app, self.settings.port)
        if self.settings.admin_port is not None:
            self.admin_port = await self._serve_app(self.admin_app, self.settings.admin_port)
        return self.port

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reload_interval_s)
            try:
                self.watcher.poll()
            except Exception:  # a reload bug must not stop serving
                log.exception("policy reload failed")

    async def shutdown(self, drain_s: float) -> None:
        """Refuse new requests (503), let open ones finish for up to ``drain_s``."""
        self.draining = True
        deadline = time.monotonic() + drain_s
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch_task
        await self.forwarder.stop()
        await self.fleet.stop()

    # ---- probes and metrics -------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def ready(self, request: web.Request) -> web.Response:
        ready = [r.replica for r in self.fleet.reports()]
        ok = bool(ready) and not self.draining
        body: dict[str, Any] = {"ready": ok, "replicas": ready,
                                "known": [s.name for s in self.fleet.states()],
                                "placement": self.router.placer.name}
        if not ok:
            body["reason"] = "shutting down" if self.draining else "no replica is ready"
        return web.json_response(body, status=200 if ok else 503)

    async def debug_fleet(self, request: web.Request) -> web.Response:
        """Every replica as this gateway sees it: its last good report, how old, why its
        last poll failed, whether it is in the picks."""
        now = time.monotonic()
        return web.json_response({"placement": self.router.placer.name,
                                  "sticky_programs": len(self.router.programs),
                                  "replicas": [{
            "name": s.name, "api_url": s.api_url, "admin_url": s.admin_url,
            "in_picks": s.pickable(now, self.fleet.max_age_s), "error": s.error,
            "age_s": None if s.report is None else round(now - s.received_s, 3),
            "report": None if s.report is None else report_to_json(s.report),
        } for s in self.fleet.states()]})

    async def metrics_handler(self, request: web.Request) -> web.Response:
        self.metrics.in_flight.set(self.in_flight)
        body = self.metrics.render(len(self.fleet.replicas), len(self.fleet.reports()))
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    # ---- requests -----------------------------------------------------------------------
    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._bounded(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._bounded(request, "completions")

    async def other(self, request: web.Request) -> web.StreamResponse:
        return await self._bounded(request, None)

    async def _bounded(self, request: web.Request,
                       endpoint: Endpoint | None) -> web.StreamResponse:
        if self.draining:
            raise shutting_down("the gateway")
        if self.in_flight >= self.settings.max_in_flight:
            self.metrics.answered(None, "shed")
            raise queue_full(1, f"the gateway has {self.settings.max_in_flight} requests in "
                             "flight (--max-in-flight)", code="gateway_busy")
        self.in_flight += 1
        try:
            return await self._handle(request, endpoint)
        except asyncio.CancelledError:
            self.forwarder.answered(request, request.get(PLACED_ON), "cancelled")
            raise
        finally:
            self.in_flight -= 1

    def tenant(self, request: web.Request) -> str:
        """Who the request says it is, for placement only (the sidecar checks keys)."""
        return placement_tenant(request.headers)

    async def _read(self, request: web.Request,
                    endpoint: Endpoint | None) -> tuple[Any, bytes | None]:
        """(the JSON document or None, the body) within the door's limits; chat and
        completions bodies are JSON whatever their content type says (as the sidecar
        reads them)."""
        if request.method in ("GET", "HEAD", "DELETE", "OPTIONS") and not request.body_exists:
            return None, None
        if endpoint is not None or request.content_type in JSON_TYPES:
            doc = await intake.read_json(request, self.door)
            return doc, await request.read()  # aiohttp keeps the bytes it read
        try:
            async with asyncio.timeout(self.door.body_timeout_s):
                return None, await request.read()
        except TimeoutError:
            raise request_timeout(self.door.body_timeout_s) from None

    def _ask(self, request: web.Request, endpoint: Endpoint | None, doc: Any) -> Ask:
        tenant = self.tenant(request)
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
        now = time.time()  # the reports' clock (ReplicaReport.at_s), what the placer is given
        if endpoint is not None:
            spec = self.watcher.spec
            try:
                parsed = parse_request(endpoint, doc, request.headers, spec.slo_defaults,
                                       spec.fairness.default_class_of(tenant), spec.limits)
                held, _ = hold_to_contract(parsed, tenant, spec.fairness)  # as the sidecar
                return ask_of(held, tenant, request_id, now)
            except APIError:
                pass  # the sidecar answers it (module docstring)
        slo = DeadlineSLO(self.watcher.spec.slo_defaults.best_effort_deadline_seconds,
                          best_effort=True)
        size = max(1, (request.content_length or 0) // CHARS_PER_TOKEN)
        return Ask(request_id, tenant, slo, prompt_tokens=size, output_bound=1,
                   typical_output=1, arrival_s=now)

    async def _handle(self, request: web.Request,
                      endpoint: Endpoint | None) -> web.StreamResponse:
        doc, body = await self._read(request, endpoint)
        ask = self._ask(request, endpoint, doc)
        started = time.perf_counter()
        decision = self.router.place(ask, self.fleet.reports())
        self.metrics.placement.observe(time.perf_counter() - started)
        outcome = decision.outcome
        if isinstance(outcome, Refusal):
            self.metrics.answered(None, "shed" if outcome.status == 429 else "no_replica")
            raise refusal_error(outcome)
        return await self.forwarder.forward(
            request, body, (outcome.replica, *outcome.fallbacks),
            lambda replica: self.router.placed(ask, replica))


async def serve(settings: GatewaySettings, fleet: Fleet, stop: asyncio.Event | None = None,
                drain_s: float = 20.0) -> None:
    server = GatewayServer(settings, fleet)
    port = await server.start()
    log.info("jitserve gateway on http://%s:%d (placement %s, %d replicas named%s); admin on "
             ":%s", settings.host, port, server.router.placer.name, len(fleet.replicas),
             f", discovering {len(fleet.discover)}" if fleet.discover else "",
             server.admin_port)
    try:
        await (stop.wait() if stop is not None else asyncio.Event().wait())
        await server.shutdown(drain_s)
    finally:
        await server.stop()
