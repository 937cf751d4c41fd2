"""The scheduled completion routes: one HTTP request to a queued job and back (owner: sidecar).

``POST /v1/chat/completions`` and ``POST /v1/completions``, stream and non-stream, with a
``usage`` block:

- the tenant (API key or ``x-tenant``) and the body are read safely
  (:mod:`~jitserve.sidecar.intake`), the body and its per-request SLO parsed
  (:mod:`jitserve.sidecar.api`);
- a request is refused while the sidecar drains or vLLM is down, and (429) when a new
  compound program would pass ``limits.maxPrograms``
  (:class:`~jitserve.sidecar.admission.Admission`);
- the prompt is tokenized and ``max_tokens`` settled
  (:class:`~jitserve.sidecar.prompts.PromptReader`), and the request is queued in the
  :class:`~jitserve.sidecar.dispatcher.Dispatcher`;
- its events are answered as one body or an SSE stream
  (:mod:`~jitserve.sidecar.responses`) or, for a request using structured outputs, tools,
  logprobs or ``n``, as vLLM's own endpoint answered it
  (:mod:`~jitserve.sidecar.passthrough`); a handler that ends before its job does
  cancels it (the client went away).

:class:`~jitserve.sidecar.server.SidecarServer` registers the routes and, at shutdown,
waits for :attr:`CompletionRoutes.open_handlers` to reach 0.
"""

from __future__ import annotations

import time

from aiohttp import web

from jitserve.goodput import goodput_if_met
from jitserve.policy import SLOPolicySpec
from jitserve.requests import Request
from jitserve.sidecar import intake, passthrough, request_ids, responses
from jitserve.sidecar.access_log import JOB_KEY
from jitserve.sidecar.api import Endpoint, ParsedRequest, parse_request
from jitserve.sidecar.claims import hold_to_contract
from jitserve.sidecar.config import SidecarSettings, TenantKeys
from jitserve.sidecar.dispatcher import Dispatcher
from jitserve.sidecar.errors import APIError, bad_request
from jitserve.sidecar.jobs import EventKind, Job
from jitserve.sidecar.prompts import PromptReader, served_model
from jitserve.slo import SLOError


class CompletionRoutes:
    """The two scheduled routes' handlers, over one dispatcher."""

    def __init__(self, settings: SidecarSettings, keys: TenantKeys, dispatcher: Dispatcher,
                 prompts: PromptReader) -> None:
        self.settings = settings
        self.keys = keys
        self.dispatcher = dispatcher
        self.prompts = prompts
        self.open_handlers = 0
        """Handlers running now (shutdown gives them a grace to send their last event)."""

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completions")

    def _held_to_contract(self, parsed: ParsedRequest, tenant: str,
                          spec: SLOPolicySpec) -> ParsedRequest:
        """``parsed`` as the tenant's contract allows it; every claim beyond it counted."""
        counter = self.dispatcher.report.metrics.claims_beyond_contract
        try:
            held, clamped = hold_to_contract(parsed, tenant, spec.fairness)
        except APIError as err:
            counter.labels(tenant, err.param or "slo", "refused").inc()
            raise
        for field in clamped:
            counter.labels(tenant, field, "clamped").inc()
        return held

    async def _submit(self, request: web.Request,
                      endpoint: Endpoint) -> tuple[Job, ParsedRequest]:
        arrival = time.monotonic()
        request_ids.client_id(request)
        tenant = intake.tenant_of(request, self.keys)
        raw = await intake.read_json(request, self.settings)
        spec = self.dispatcher.spec
        parsed = parse_request(endpoint, raw, request.headers, spec.slo_defaults,
                               spec.fairness.default_class_of(tenant), spec.limits,
                               forward_chat=self.settings.reasoning_parser is not None)
        d = self.dispatcher
        parsed = self._held_to_contract(parsed, tenant, spec)
        d.report.metrics.arrivals.labels(parsed.slo.kind.value).inc()
        d.admission.check_open()
        d.admission.check_program_room(parsed.program, tenant)
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
                             forward_path=passthrough.path_of(parsed),
                             queue_ttl_s=parsed.queue_ttl_s)
        events.on_overflow = lambda: d.cancel(job)
        d.report.metrics.fairness.asked(
            tenant, goodput_if_met(req.slo, req.prompt_tokens, req.max_tokens or 0))
        return job, parsed

    async def _generate(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        self.open_handlers += 1
        try:
            return await self._run_job(request, endpoint)
        finally:
            self.open_handlers -= 1

    async def _run_job(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        job, parsed = await self._submit(request, endpoint)
        request[JOB_KEY] = job  # for the access log, written when the answer ends
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
