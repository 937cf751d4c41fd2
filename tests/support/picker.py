"""The endpoint picker on a real loopback gRPC server, and the ext_proc messages Envoy
sends it, built with Envoy's generated protos (``xds-protos``) as the endpoint-picker
protocol specifies them. No Envoy binary can be installed here: these messages are what
Envoy's ext_proc filter writes on the stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from google.protobuf import struct_pb2

from jitserve.gateway.picker import EndpointPicker
from jitserve.gateway.picker_server import PickerServer
from jitserve.gateway.picker_wire import DESTINATION, LB_NAMESPACE, SERVED, SUBSET, SUBSET_NAMESPACE
from jitserve.placement.base import ReplicaReport

TIMEOUT = 10.0
"""Bound against a hang only."""


def report(replica: str, **fields: Any) -> ReplicaReport:
    base = ReplicaReport(replica=replica, ready=True, at_s=1.0, max_running=8, running=0,
                         waiting=0)
    return replace(base, **fields)


@dataclass
class StaticReports:
    """A fixed fleet (the gateway's Fleet polls real sidecars; the picker only reads)."""

    items: list[ReplicaReport] = field(default_factory=list)

    def reports(self) -> list[ReplicaReport]:
        return list(self.items)


@dataclass
class Connected:
    server: PickerServer | None
    channel: grpc.aio.Channel
    stub: Any

    async def exchange(self, *messages: ep.ProcessingRequest) -> list[ep.ProcessingResponse]:
        """Send ``messages`` as one stream, half-close, and read every answer."""
        call = self.stub.Process()
        for message in messages:
            await call.write(message)
        await call.done_writing()
        return [answer async for answer in call]


@asynccontextmanager
async def connect(target: str, server: PickerServer | None = None
                  ) -> AsyncIterator[Connected]:
    """An ext_proc client of the picker at ``target`` (``host:port``)."""
    channel = grpc.aio.insecure_channel(target)
    try:
        yield Connected(server, channel, ep_grpc.ExternalProcessorStub(channel))
    finally:
        await channel.close()


@asynccontextmanager
async def running_picker(picker: EndpointPicker, ready: bool = True
                         ) -> AsyncIterator[Connected]:
    """``picker`` on a real gRPC server on a free loopback port, and a client of it."""
    server = PickerServer(picker, "127.0.0.1:0")
    port = await server.start()
    if ready:
        await server.ready(True)
    try:
        async with connect(f"127.0.0.1:{port}", server) as connected:
            yield connected
    finally:
        await server.stop(0)


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, TIMEOUT))


def _header_map(headers: Mapping[str, str]) -> base_pb2.HeaderMap:
    return base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode())
                                       for k, v in headers.items()])


def request_headers(path: str = "/v1/completions", extra: Mapping[str, str] | None = None, *,
                    method: str = "POST", end_of_stream: bool = False,
                    subset: Sequence[str] | None = None,
                    modes: tuple[int, int] | None = None) -> ep.ProcessingRequest:
    headers = {":method": method, ":path": path, ":authority": "gateway",
               "content-type": "application/json", **(extra or {})}
    message = ep.ProcessingRequest(request_headers=ep.HttpHeaders(
        headers=_header_map(headers), end_of_stream=end_of_stream))
    if subset is not None:
        hint = struct_pb2.Struct()
        hint.fields[SUBSET].list_value.extend(list(subset))
        message.metadata_context.filter_metadata[SUBSET_NAMESPACE].CopyFrom(hint)
    if modes is not None:
        message.protocol_config.request_body_mode = modes[0]  # type: ignore[assignment]
        message.protocol_config.response_body_mode = modes[1]  # type: ignore[assignment]
    return message


def request_body(body: bytes | dict[str, Any], end_of_stream: bool = True
                 ) -> ep.ProcessingRequest:
    raw = json.dumps(body).encode() if isinstance(body, dict) else body
    return ep.ProcessingRequest(request_body=ep.HttpBody(body=raw, end_of_stream=end_of_stream))


def response_headers(status: str = "200", served: str | None = None) -> ep.ProcessingRequest:
    message = ep.ProcessingRequest(response_headers=ep.HttpHeaders(
        headers=_header_map({":status": status, "content-type": "text/event-stream"})))
    if served is not None:
        entry = struct_pb2.Struct()
        entry.fields[SERVED].string_value = served
        message.metadata_context.filter_metadata[LB_NAMESPACE].CopyFrom(entry)
    return message


def response_body(chunk: bytes, end_of_stream: bool = False) -> ep.ProcessingRequest:
    return ep.ProcessingRequest(response_body=ep.HttpBody(body=chunk,
                                                          end_of_stream=end_of_stream))


def set_headers(answer: ep.ProcessingResponse, phase: str = "request_headers"
                ) -> dict[str, str]:
    common = getattr(answer, phase).response
    return {h.header.key: (h.header.raw_value.decode() or h.header.value)
            for h in common.header_mutation.set_headers}


def metadata_destination(answer: ep.ProcessingResponse) -> str:
    return str(answer.dynamic_metadata.fields[LB_NAMESPACE].struct_value
               .fields[DESTINATION].string_value)


def immediate_of(answer: ep.ProcessingResponse) -> tuple[int, dict[str, str], dict[str, Any]]:
    """(status, headers, JSON body) of an immediate response."""
    assert answer.WhichOneof("response") == "immediate_response", answer
    reply = answer.immediate_response
    headers = {h.header.key: h.header.raw_value.decode() for h in reply.headers.set_headers}
    return int(reply.status.code), headers, json.loads(reply.body)
