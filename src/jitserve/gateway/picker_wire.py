"""The endpoint picker's messages: Envoy ext_proc protobufs in and out (owner: gateway).

Pure functions between Envoy's generated protos (the ``xds-protos`` package) and plain
Python, as the Gateway API Inference Extension's endpoint-picker protocol names them:

- in: a request's headers (:func:`headers_of`), the endpoint subset the data plane allows
  (:func:`subset_hint`, ``metadata_context.filter_metadata["envoy.lb.subset_hint"]
  ["x-gateway-destination-endpoint-subset"]``), the endpoint that served the response
  (:func:`served_endpoint`, ``filter_metadata["envoy.lb"]
  ["x-gateway-destination-endpoint-served"]``) and how Envoy sends bodies
  (:func:`body_modes`, from ``protocol_config``);
- out: the pick (:func:`pick_headers`: the header ``x-gateway-destination-endpoint`` and
  the same value in ``dynamic_metadata["envoy.lb"]``), the body passed back in
  full-duplex streaming (:func:`streamed_body`), an immediate response (:func:`immediate`:
  status, JSON body, ``Retry-After``) and the pass-through answers of the other phases.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from jitserve.sidecar.errors import APIError

DESTINATION = "x-gateway-destination-endpoint"
"""The header, and the key in ``dynamic_metadata["envoy.lb"]``, naming the picked
endpoints (``ip:port``, the primary first, fallbacks after, comma-separated)."""
SUBSET = "x-gateway-destination-endpoint-subset"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SERVED = "x-gateway-destination-endpoint-served"
LB_NAMESPACE = "envoy.lb"

Mode = processing_mode_pb2.ProcessingMode
FULL_DUPLEX = Mode.FULL_DUPLEX_STREAMED
BUFFERED_MODES = frozenset({Mode.BUFFERED, Mode.BUFFERED_PARTIAL})


@dataclass(frozen=True, slots=True)
class BodyModes:
    """How Envoy sends this stream's request and response bodies."""

    request: int = FULL_DUPLEX
    response: int = FULL_DUPLEX


def body_modes(message: ep.ProcessingRequest) -> BodyModes | None:
    """The body modes Envoy announces on a stream's first message, or None when it says
    nothing (an Envoy before ``protocol_config``: the protocol's required mode, full-duplex
    streaming, is assumed)."""
    if not message.HasField("protocol_config"):
        return None
    config = message.protocol_config
    return BodyModes(config.request_body_mode, config.response_body_mode)


def headers_of(headers: ep.HttpHeaders) -> dict[str, str]:
    """The header map, names lower-cased (Envoy sends ``raw_value`` bytes; ``value`` is
    read when only it is set). A repeated header keeps its values comma-joined."""
    out: dict[str, str] = {}
    for item in headers.headers.headers:
        value = item.raw_value.decode("utf-8", "replace") if item.raw_value else item.value
        key = item.key.lower()
        out[key] = f"{out[key]},{value}" if key in out else value
    return out


def _namespace(message: ep.ProcessingRequest, namespace: str) -> struct_pb2.Struct | None:
    if not message.HasField("metadata_context"):
        return None
    found: struct_pb2.Struct | None = message.metadata_context.filter_metadata.get(namespace)
    return found


def subset_hint(message: ep.ProcessingRequest) -> list[str] | None:
    """The endpoints the data plane allows (``ip:port`` each), or None when it sets no
    hint. A list, or one string of comma-separated endpoints, is read; an empty list means
    none is allowed."""
    entry = _namespace(message, SUBSET_NAMESPACE)
    if entry is None or SUBSET not in entry.fields:
        return None
    value = entry.fields[SUBSET]
    kind = value.WhichOneof("kind")
    if kind == "list_value":
        items = [v.string_value for v in value.list_value.values
                 if v.WhichOneof("kind") == "string_value"]
    elif kind == "string_value":
        items = value.string_value.split(",")
    else:
        items = []
    return [item.strip() for item in items if item.strip()]


def served_endpoint(message: ep.ProcessingRequest) -> str | None:
    """The endpoint that produced the response (the data plane reports it in the response
    phases, as the primary or a fallback)."""
    entry = _namespace(message, LB_NAMESPACE)
    if entry is None or SERVED not in entry.fields:
        return None
    value = entry.fields[SERVED]
    return value.string_value or None


def _header(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode()),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )


def destination(endpoints: Sequence[str]) -> str:
    return ",".join(endpoints)


def _lb_metadata(value: str) -> struct_pb2.Struct:
    metadata = struct_pb2.Struct()
    metadata.fields[LB_NAMESPACE].struct_value.fields[DESTINATION].string_value = value
    return metadata


def pick_headers(endpoints: Sequence[str], body_length: int | None) -> ep.ProcessingResponse:
    """The answer to the request headers: the destination header (one value for the
    header and the metadata, as the protocol requires), the route cache cleared so the
    header is routed on, and ``Content-Length`` when the body passes back through us."""
    value = destination(endpoints)
    set_headers = [_header(DESTINATION, value)]
    if body_length is not None:
        set_headers.append(_header("content-length", str(body_length)))
    common = ep.CommonResponse(header_mutation=ep.HeaderMutation(set_headers=set_headers),
                               clear_route_cache=True)
    return ep.ProcessingResponse(request_headers=ep.HeadersResponse(response=common),
                                 dynamic_metadata=_lb_metadata(value))


def pick_body(endpoints: Sequence[str]) -> ep.ProcessingResponse:
    """The pick on a buffered body's answer (Envoy applies a body response's header
    mutation in buffered mode; the headers were already answered)."""
    value = destination(endpoints)
    common = ep.CommonResponse(
        header_mutation=ep.HeaderMutation(set_headers=[_header(DESTINATION, value)]),
        clear_route_cache=True)
    return ep.ProcessingResponse(request_body=ep.BodyResponse(response=common),
                                 dynamic_metadata=_lb_metadata(value))


def streamed_body(body: bytes, *, response: bool = False,
                  end_of_stream: bool = True) -> ep.ProcessingResponse:
    """A body passed back unchanged in full-duplex streaming (Envoy forwards what the
    processor sends)."""
    mutation = ep.BodyMutation(
        streamed_response=ep.StreamedBodyResponse(body=body, end_of_stream=end_of_stream))
    answer = ep.BodyResponse(response=ep.CommonResponse(body_mutation=mutation))
    if response:
        return ep.ProcessingResponse(response_body=answer)
    return ep.ProcessingResponse(request_body=answer)


def unchanged(phase: str) -> ep.ProcessingResponse:
    """Continue without a change (``phase``: the ProcessingResponse field to answer)."""
    if phase in ("request_headers", "response_headers"):
        return ep.ProcessingResponse(**{phase: ep.HeadersResponse()})
    if phase in ("request_body", "response_body"):
        return ep.ProcessingResponse(**{phase: ep.BodyResponse()})
    return ep.ProcessingResponse(**{phase: ep.TrailersResponse()})


def immediate(error: APIError, extra_headers: Mapping[str, str] | None = None
              ) -> ep.ProcessingResponse:
    """End the request here: ``error.status`` with its OpenAI-shaped JSON body and
    headers (``Retry-After`` when it has one)."""
    headers = {"content-type": "application/json", **error.headers(), **(extra_headers or {})}
    answer = ep.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=error.status),
        headers=ep.HeaderMutation(set_headers=[_header(k.lower(), v)
                                               for k, v in headers.items()]),
        body=json.dumps(error.body()).encode(),
        details=error.code or "",
    )
    return ep.ProcessingResponse(immediate_response=answer)
