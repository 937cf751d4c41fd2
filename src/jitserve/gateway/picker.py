"""The endpoint picker: jitserve's placement behind any Gateway API Inference Extension
gateway (owner: gateway).

An Envoy external processor (gRPC ``envoy.service.ext_proc.v3.ExternalProcessor/Process``,
one bidirectional stream per HTTP request) speaking the endpoint-picker protocol of the
Inference Extension (docs/gateway.md, "Endpoint picker"):

1. it reads the request headers and, unless the request has none or Envoy does not send
   it, the body (full-duplex streaming: the chunks are held until the last one, then the
   header answer and the body go back in that order; buffered: the headers are answered
   at once and the pick rides on the body's answer);
2. it builds the request's :class:`~jitserve.placement.base.Ask` (:mod:`.picker_ask`:
   the sidecar's own SLO parser, the gateway's Ask);
3. it keeps the replicas the data plane allows (the subset hint; an empty list, or none
   of them ready, is an immediate 503) and places among them as ``jitserve gateway``
   does (:class:`~jitserve.gateway.routing.Router`: compound programs sticky to the
   replica holding their book, else the :class:`Placer`);
4. it answers ``x-gateway-destination-endpoint: ip:port[,ip:port...]`` (primary first,
   then the fallbacks) as a header AND as ``dynamic_metadata["envoy.lb"]``, or an
   immediate 503 (nothing ready) / 429 (every replica would shed) with a JSON body and
   ``Retry-After`` (a body over ``max_body_bytes`` is a 413: the picker holds the body it
   reads; any other bad request is forwarded for the sidecar to answer, as the gateway
   does);
5. the response phases pass through unchanged; the endpoint that served the response
   (``x-gateway-destination-endpoint-served``) is counted as placed there when it is a
   fallback.

Collaborators are injected: the reports come from a :class:`ReportSource` (the gateway's
:class:`~jitserve.gateway.fleet.Fleet` in production, a static list in the tests), the
placement from a :class:`~jitserve.placement.base.Placer`. The transport and the health
services are in :mod:`.picker_server`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from jitserve.gateway import picker_wire as wire
from jitserve.gateway.picker_ask import AskBuilder
from jitserve.gateway.routing import Router, refusal_error
from jitserve.placement.base import Ask, Pick, Placer, Refusal, ReplicaReport
from jitserve.sidecar.errors import APIError

log = logging.getLogger("jitserve.picker")


class ReportSource(Protocol):
    """Where the picker reads the replicas' reports (the fresh and ready ones)."""

    def reports(self) -> list[ReplicaReport]: ...


@dataclass(slots=True)
class PickerStats:
    """What the picker decided, for logs and tests."""

    picks: int = 0
    sticky: int = 0
    refusals: dict[int, int] = field(default_factory=dict)
    served_by_fallback: int = 0


class EndpointPicker:
    """One per process: places every stream's request through the gateway's
    :class:`~jitserve.gateway.routing.Router` (none ready: 503; every one shedding: 429;
    a compound program's call to the replica holding its book; else the placer) among the
    replicas the subset hint allows, and keeps the placer told of new reports (so its
    count of what it sent since a replica's last report stays right)."""

    def __init__(self, source: ReportSource, placer: Placer, asks: AskBuilder | None = None,
                 ) -> None:
        self.source = source
        self.router = Router(placer)
        self.asks = asks or AskBuilder()
        self.stats = PickerStats()
        self._seen: dict[str, float] = {}

    @property
    def placer(self) -> Placer:
        return self.router.placer

    def _fresh_reports(self) -> list[ReplicaReport]:
        reports = [r for r in self.source.reports() if r.ready]
        for report in reports:
            if self._seen.get(report.replica) != report.at_s:
                self._seen[report.replica] = report.at_s
                self.placer.reported(report)
        if len(self._seen) > 2 * len(reports) + 16:  # replicas that left the fleet
            present = {r.replica for r in reports}
            self._seen = {k: v for k, v in self._seen.items() if k in present}
        return reports

    def place(self, ask: Ask, subset: Sequence[str] | None) -> Pick | Refusal:
        """Place ``ask`` among the ready replicas ``subset`` allows (None: all)."""
        reports = self._fresh_reports()
        decision: Pick | Refusal
        if subset is not None:
            allowed = set(subset)
            reports = [r for r in reports if r.replica in allowed]
        if subset is not None and not reports:
            named = ", ".join(subset[:8]) or "none"
            decision = Refusal(503, f"no endpoint of the subset hint is ready (hint: {named})")
        else:
            routed = self.router.place(ask, reports)
            decision = routed.outcome
            self.stats.sticky += routed.sticky
        if isinstance(decision, Pick):
            self.router.placed(ask, decision.replica)
            self.stats.picks += 1
        else:
            self.stats.refusals[decision.status] = self.stats.refusals.get(decision.status, 0) + 1
        return decision

    def served(self, ask: Ask, pick: Pick, endpoint: str) -> None:
        """The data plane reports who served: a fallback took the request the primary did
        not, so it is counted there too until its next report (and a program's book is
        there now)."""
        if endpoint != pick.replica:
            self.stats.served_by_fallback += 1
            self.router.placed(ask, endpoint)

    async def Process(self, requests: AsyncIterator[ep.ProcessingRequest],
                      context: Any) -> AsyncIterator[ep.ProcessingResponse]:
        """The ext_proc stream of one HTTP request."""
        stream = _Stream(self)
        async for message in requests:
            for answer in stream.receive(message):
                yield answer
            if stream.ended:
                return


class _Stream:
    """One HTTP request's exchange (the state between its ext_proc messages)."""

    def __init__(self, picker: EndpointPicker) -> None:
        self.picker = picker
        self.modes: wire.BodyModes | None = None
        self.headers: dict[str, str] = {}
        self.subset: list[str] | None = None
        self.body = bytearray()
        self.ask: Ask | None = None
        self.pick: Pick | None = None
        self.served: str | None = None
        self.ended = False

    @property
    def request_mode(self) -> int:
        return (self.modes or wire.BodyModes()).request

    def receive(self, message: ep.ProcessingRequest) -> list[ep.ProcessingResponse]:
        if self.modes is None:
            self.modes = wire.body_modes(message) or wire.BodyModes()
        phase = message.WhichOneof("request")
        if phase in ("request_headers", "request_body", "request_trailers"):
            hint = wire.subset_hint(message)
            if hint is not None:
                self.subset = hint
        if phase == "request_headers":
            return self._request_headers(message.request_headers)
        if phase == "request_body":
            return self._request_body(message.request_body)
        if phase == "request_trailers":
            return self._request_trailers()
        served = wire.served_endpoint(message)
        if served is not None and self.served is None:
            self.served = served
            if self.ask is not None and self.pick is not None:
                self.picker.served(self.ask, self.pick, served)
        if phase == "response_body" and self.modes.response == wire.FULL_DUPLEX:
            chunk = message.response_body
            return [wire.streamed_body(chunk.body, response=True,
                                       end_of_stream=chunk.end_of_stream)]
        return [wire.unchanged(phase)] if phase else []

    def _decide(self, body: bytes | None) -> ep.ProcessingResponse | list[str]:
        """The endpoints to answer, or the immediate response that ends the request."""
        self.ask = self.picker.asks.ask(self.headers, body)
        decision = self.picker.place(self.ask, self.subset)
        if isinstance(decision, Refusal):
            log.info("refused %s: %d %s", self.ask.request_id, decision.status, decision.reason)
            return self._end(refusal_error(decision))
        self.pick = decision
        log.debug("picked %s for %s (tenant %s, %s)", decision.replica, self.ask.request_id,
                  self.ask.tenant, self.ask.slo)
        return [decision.replica, *decision.fallbacks]

    def _end(self, error: APIError) -> ep.ProcessingResponse:
        self.ended = True
        return wire.immediate(error)

    def _request_headers(self, headers: ep.HttpHeaders) -> list[ep.ProcessingResponse]:
        self.headers = wire.headers_of(headers)
        mode = self.request_mode
        if headers.end_of_stream or mode not in (wire.FULL_DUPLEX, *wire.BUFFERED_MODES):
            # no body will come, or none the pick could still act on (Envoy's NONE and
            # STREAMED modes route on the headers' answer): pick on the headers
            decided = self._decide(None)
            if isinstance(decided, ep.ProcessingResponse):
                return [decided]
            return [wire.pick_headers(decided, None)]
        if mode in wire.BUFFERED_MODES:
            return [wire.unchanged("request_headers")]
        return []  # full duplex: the answer waits for the body

    def _request_body(self, chunk: ep.HttpBody) -> list[ep.ProcessingResponse]:
        mode = self.request_mode
        if self.pick is not None or mode not in (wire.FULL_DUPLEX, *wire.BUFFERED_MODES):
            if mode == wire.FULL_DUPLEX:
                return [wire.streamed_body(chunk.body, end_of_stream=chunk.end_of_stream)]
            return [wire.unchanged("request_body")]
        self.body += chunk.body
        limit = self.picker.asks.max_body_bytes
        if len(self.body) > limit:
            return [self._end(APIError(413, f"request body over the limit of {limit} bytes",
                                       code="request_too_large"))]
        if mode in wire.BUFFERED_MODES:
            decided = self._decide(bytes(self.body))
            if isinstance(decided, ep.ProcessingResponse):
                return [decided]
            return [wire.pick_body(decided)]
        if not chunk.end_of_stream:
            return []
        return self._release(end_of_stream=True)

    def _release(self, end_of_stream: bool) -> list[ep.ProcessingResponse]:
        """Full duplex: pick on the whole body, then answer the headers and send the body
        on."""
        body = bytes(self.body)
        decided = self._decide(body or None)
        if isinstance(decided, ep.ProcessingResponse):
            return [decided]
        self.body = bytearray()
        return [wire.pick_headers(decided, len(body) if body else None),
                wire.streamed_body(body, end_of_stream=end_of_stream)]

    def _request_trailers(self) -> list[ep.ProcessingResponse]:
        answers: list[ep.ProcessingResponse] = []
        if self.pick is None and self.request_mode == wire.FULL_DUPLEX:
            answers = self._release(end_of_stream=False)  # trailers end the body
            if self.ended:
                return answers
        return [*answers, wire.unchanged("request_trailers")]
