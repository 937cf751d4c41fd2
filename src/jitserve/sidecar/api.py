"""Request bodies of the sidecar's OpenAI-compatible API and their SLO (owner: sidecar).

Parses ``POST /v1/chat/completions`` and ``POST /v1/completions`` bodies into a
:class:`ParsedRequest`: what to send to vLLM (prompt or messages, sampling parameters
passed through) and the request's SLO. The SLO comes from, in this order:

1. the body's ``slo`` object (``kind``, ``ttft_ms``, ``tbt_ms``/``tpot_ms``,
   ``deadline_s``/``deadline_ms``, ``class``, compound ``program_id``/``stage``/
   ``parent_ids``/``stages``);
2. the headers gateways use (:mod:`~jitserve.sidecar.headers`, current names first, the
   deprecated ones as aliases): llm-d's ``x-llm-d-slo-ttft-ms`` / ``x-llm-d-slo-tpot-ms``,
   jitserve's ``x-llm-d-slo-deadline-ms`` / ``x-llm-d-slo-class``, and llm-d's
   ``x-llm-d-inference-objective`` (an SLO class of that name in the policy);
3. the named class's values, then the policy's per-kind defaults (``sloDefaults``).

A request with no SLO at all is best effort (the policy's default deadline). Every
invalid value raises :class:`~jitserve.sidecar.errors.APIError` (400) naming the field
with the path the client used (``slo.ttft_ms``, ``x-llm-d-slo-ttft-ms``, ``max_tokens``...).
The policy's ``limits`` bound what a client may ask, body and headers alike: every SLO
value (``maxSloSeconds``), a program's ``stages`` (``maxStages``) and its deadline,
given or derived from its stages (``maxProgramSeconds``).

Body fields (:mod:`~jitserve.sidecar.fields`): the ones named here and the sampling
parameters go the token-id path; a request with any other field (structured outputs,
tools, logprobs, ``n``, ``kv_transfer_params``, ``cache_salt``..., one jitserve does not
know, or a chat content part other than text) is *forwarded* as the client sent it to
vLLM's own endpoint (:attr:`ParsedRequest.forward`), which honours or ignores it as it
would without jitserve. ``priority`` and ``request_id`` are refused (jitserve sets them).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from jitserve.policy import LimitsSettings, SLODefaults
from jitserve.sidecar import headers as hdr
from jitserve.sidecar.errors import APIError, bad_request
from jitserve.sidecar.fields import (
    PASSTHROUGH,
    check_fields,
    choices,
    forward_body,
    has_media,
)
from jitserve.slo import SLO, CompoundSLO, DeadlineSLO, LatencySLO, SLOError, SLOKind

Endpoint = Literal["chat", "completions"]
_TYPE_TAG = re.compile(r"(str|int|float|bool|none|(list|dict|tuple)\[.*\]|function-.*)")



class SLOBody(BaseModel):
    """The ``slo`` object of a request body (all fields optional)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    kind: SLOKind | None = None
    class_name: str | None = Field(None, alias="class", min_length=1, max_length=63)
    ttft_ms: float | None = Field(None, gt=0, le=86_400_000)
    tbt_ms: float | None = Field(None, gt=0, le=86_400_000)
    tpot_ms: float | None = Field(None, gt=0, le=86_400_000)
    deadline_s: float | None = Field(None, gt=0, le=86_400)
    deadline_ms: float | None = Field(None, gt=0, le=86_400_000)
    program_id: str | None = Field(None, min_length=1, max_length=256)
    stage: int | None = Field(None, ge=0, le=10_000)
    stages: int | None = Field(None, ge=1, le=10_000)
    final: bool = Field(
        False,
        description="compound: this call belongs to the program's last stage; the program "
        "ends (and is scored) when the calls of that stage finish",
    )
    parent_ids: list[Annotated[str, Field(max_length=256)]] = Field(default_factory=list,
                                                                     max_length=1024)


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = Field(None, max_length=256)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = Field(None, ge=1)
    min_tokens: int | None = Field(None, ge=0)
    slo: SLOBody | None = None
    app: str | None = Field(None, min_length=1, max_length=63)
    user: str | None = None
    return_token_ids: bool = False


class CompletionBody(_Body):
    prompt: str | list[int] | list[str] | list[list[int]]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str = Field(min_length=1, max_length=32)
    content: str | list[dict[str, Any]] | None = None


class ChatBody(_Body):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)


@dataclass(slots=True)
class ProgramRef:
    """A compound request's place in its program."""

    program_id: str
    stage: int
    parent_ids: tuple[str, ...]
    stages: int | None
    final: bool = False


@dataclass(slots=True)
class ParsedRequest:
    endpoint: Endpoint
    model: str | None
    stream: bool
    include_usage: bool
    max_tokens: int | None
    min_tokens: int
    prompt: str | None
    prompt_ids: list[int] | None
    messages: list[dict[str, Any]] | None
    sampling: dict[str, Any]
    slo: SLO
    slo_class: str
    app: str
    program: ProgramRef | None = None
    return_token_ids: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    forward: dict[str, Any] | None = None
    """The body as the client sent it, less jitserve's own fields, when it uses a field
    of :data:`~jitserve.sidecar.fields.FORWARDED`: sent as is to vLLM's endpoint (never
    preempted)."""
    n: int = 1
    queue_ttl_s: float | None = None
    """How long it may wait before it is sent to the engine (``x-llm-d-inference-ttl``);
    None: the policy's ``admission.maxWaitingSeconds`` alone."""
    asked_class: tuple[str, str] | None = None
    """The SLO class the client asked for and where (body field or header); None: none
    asked (a default class applies)."""


def _field_path(loc: tuple[int | str, ...]) -> str:
    # drop pydantic's union-branch tags (``str``, ``list[int]``...) from the path
    parts = [str(p) for p in loc if not (isinstance(p, str) and _TYPE_TAG.fullmatch(p))]
    return ".".join(parts) or "body"


def _validation_error(err: ValidationError) -> APIError:
    first = err.errors()[0]
    path = _field_path(first["loc"])
    if path == "slo.class_name":
        path = "slo.class"
    return bad_request(path, first["msg"])


def _header_ms(headers: Mapping[str, str], key: str) -> tuple[float | None, str, float]:
    """(value in ms or None, the header name sent, scale to seconds) of ``key`` or an
    alias."""
    found = hdr.lookup(headers, key)
    if found is None:
        return None, key, 1e-3
    name, raw = found
    try:
        value = float(raw)
    except ValueError:
        raise bad_request(name, f"must be a number of milliseconds, got {raw[:40]!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise bad_request(name, f"must be a positive number of milliseconds, got {raw[:40]!r}")
    return value, name, 1e-3


@dataclass(slots=True)
class _Value:
    """An SLO value in seconds and the field it came from (for the error message)."""

    seconds: float
    param: str


def _first(*candidates: tuple[float | None, str, float]) -> _Value | None:
    """The first given of (value, param, scale to seconds)."""
    for value, param, scale in candidates:
        if value is not None:
            return _Value(value * scale, param)
    return None


def _check_limit(value: _Value | None, limit: float, setting: str) -> None:
    if value is not None and value.seconds > limit:
        raise bad_request(value.param, f"must be at most {limit:g} s (limits.{setting} of the "
                          "policy)")


def _class_of(body: SLOBody, headers: Mapping[str, str]) -> tuple[str | None, str]:
    """The SLO class asked for and where: ``slo.class``, the class header, the objective."""
    if body.class_name:
        return body.class_name, "slo.class"
    for name in (*hdr.names(hdr.SLO_CLASS), *hdr.names(hdr.OBJECTIVE)):
        value = headers.get(name)
        if value:
            return value, name
    return None, "slo.class"


def asked_class(body: SLOBody | None, headers: Mapping[str, str]) -> tuple[str, str] | None:
    """(the SLO class the client asked for, the field or header it came in), if any."""
    name, param = _class_of(body or SLOBody.model_validate({}), headers)
    return None if name is None else (name, param)


def resolve_slo(
    body: SLOBody | None,
    headers: Mapping[str, str],
    defaults: SLODefaults,
    tenant_class: str | None = None,
    limits: LimitsSettings | None = None,
) -> tuple[SLO, str, ProgramRef | None]:
    """The request's SLO, its SLO class label and (compound) its program reference. A
    request with no SLO field at all gets the tenant's default class (``tenant_class``,
    else the policy's ``sloDefaults.defaultClass``; none: best effort)."""
    lim = limits or LimitsSettings()
    b = body or SLOBody.model_validate({})
    ttft = _first((b.ttft_ms, "slo.ttft_ms", 1e-3), _header_ms(headers, hdr.SLO_TTFT))
    tbt = _first((b.tbt_ms, "slo.tbt_ms", 1e-3), (b.tpot_ms, "slo.tpot_ms", 1e-3),
                 _header_ms(headers, hdr.SLO_TPOT))
    deadline = _first((b.deadline_s, "slo.deadline_s", 1.0),
                      (b.deadline_ms, "slo.deadline_ms", 1e-3),
                      _header_ms(headers, hdr.SLO_DEADLINE))
    for value in (ttft, tbt, deadline):
        _check_limit(value, lim.max_slo_seconds, "maxSloSeconds")
    if b.stages is not None and b.stages > lim.max_stages:
        raise bad_request("slo.stages", f"must be at most {lim.max_stages} (limits.maxStages "
                          "of the policy)")
    if b.stage is not None and b.stage >= lim.max_stages:
        raise bad_request("slo.stage", f"must be below {lim.max_stages} (limits.maxStages "
                          "of the policy)")
    class_name, class_param = _class_of(b, headers)
    no_slo_fields = body is None and ttft is None and tbt is None and deadline is None
    if class_name is None and no_slo_fields:
        class_name = defaults.unspecified_class(tenant_class)

    base: SLO | None = None
    if class_name is not None:
        base = defaults.class_slo(class_name)
        if base is None:
            known = ", ".join(c.name for c in defaults.classes) or "none configured"
            raise bad_request(class_param, f"unknown SLO class {class_name[:63]!r} "
                              f"(known: {known})")

    kind = b.kind
    if kind is None:
        if b.program_id is not None:
            kind = SLOKind.COMPOUND
        elif ttft is not None or tbt is not None:
            kind = SLOKind.LATENCY
        elif deadline is not None:
            kind = SLOKind.DEADLINE
        elif base is not None:
            kind = base.kind
        else:
            kind = SLOKind.BEST_EFFORT

    program: ProgramRef | None = None
    try:
        if kind is SLOKind.LATENCY:
            if deadline is not None and b.kind is SLOKind.LATENCY:
                raise bad_request(deadline.param,
                                  "a latency SLO takes ttft_ms and tbt_ms, not a deadline")
            lat = base if isinstance(base, LatencySLO) else defaults.slo_for(SLOKind.LATENCY)
            assert isinstance(lat, LatencySLO)
            slo: SLO = LatencySLO(ttft.seconds if ttft is not None else lat.ttft_s,
                                  tbt.seconds if tbt is not None else lat.tbt_s)
        elif kind is SLOKind.DEADLINE:
            seconds = deadline.seconds if deadline is not None else (
                base.deadline_s if isinstance(base, DeadlineSLO | CompoundSLO)
                else defaults.deadline_seconds)
            slo = DeadlineSLO(seconds)
        elif kind is SLOKind.COMPOUND:
            if b.program_id is None:
                raise bad_request("slo.program_id", "a compound request needs program_id")
            if deadline is None:
                derived = (base.deadline_s if isinstance(base, CompoundSLO | DeadlineSLO)
                           else defaults.compound_seconds_per_stage * (b.stages or 1))
                deadline = _Value(derived, "slo.stages" if b.stages else "slo.deadline_s")
            _check_limit(deadline, lim.max_program_seconds, "maxProgramSeconds")
            slo = CompoundSLO(deadline.seconds)
            program = ProgramRef(b.program_id, b.stage or 0, tuple(b.parent_ids), b.stages,
                                 b.final)
        else:
            if ttft is not None or tbt is not None:
                raise bad_request("slo.kind", "best_effort takes no latency targets")
            slo = DeadlineSLO(deadline.seconds if deadline is not None
                              else defaults.best_effort_deadline_seconds, best_effort=True)
    except SLOError as err:
        raise bad_request(f"slo.{err.field}", str(err)) from err
    label = class_name or "default"
    return slo, label, program


def parse_request(
    endpoint: Endpoint,
    raw: Any,
    headers: Mapping[str, str],
    defaults: SLODefaults,
    tenant_class: str | None = None,
    limits: LimitsSettings | None = None,
    forward_chat: bool = False,
) -> ParsedRequest:
    """Validate a decoded JSON body; raises APIError(400) naming the field.
    ``forward_chat``: every chat request goes to vLLM's own endpoint (vLLM runs a
    reasoning parser, which only its chat endpoint applies)."""
    if not isinstance(raw, dict):
        raise bad_request("body", "must be a JSON object")
    try:
        model = ChatBody if endpoint == "chat" else CompletionBody
        body: _Body = model.model_validate(raw)
    except ValidationError as err:
        raise _validation_error(err) from err
    forwarded = check_fields(raw)
    extra = body.model_extra or {}
    sampling = {k: extra[k] for k in PASSTHROUGH if k in extra and extra[k] is not None}
    slo, slo_class, program = resolve_slo(body.slo, headers, defaults, tenant_class, limits)
    include_usage = bool((body.stream_options or {}).get("include_usage", False))
    prompt: str | None = None
    prompt_ids: list[int] | None = None
    messages: list[dict[str, Any]] | None = None
    max_tokens = body.max_tokens
    if isinstance(body, ChatBody):
        messages = [m.model_dump(exclude_none=True) for m in body.messages]
        forwarded = forwarded or forward_chat or has_media(messages)
        if body.max_completion_tokens is not None:
            max_tokens = body.max_completion_tokens
    else:
        assert isinstance(body, CompletionBody)
        p = body.prompt
        if isinstance(p, str):
            if not p:
                raise bad_request("prompt", "must not be empty")
            prompt = p
        elif p and all(isinstance(x, int) for x in p):
            prompt_ids = [int(x) for x in p]  # type: ignore[arg-type]
            if any(x < 0 for x in prompt_ids):
                raise bad_request("prompt", "token ids must be >= 0")
        elif not p:
            raise bad_request("prompt", "must not be empty")
        else:
            raise bad_request("prompt", "batched prompts are not supported; send one request each",
                              code="unsupported")
    return ParsedRequest(
        endpoint=endpoint, model=body.model, stream=body.stream, include_usage=include_usage,
        max_tokens=max_tokens, min_tokens=body.min_tokens or 0, prompt=prompt,
        prompt_ids=prompt_ids, messages=messages, sampling=sampling, slo=slo,
        slo_class=slo_class, app=body.app or endpoint, program=program,
        return_token_ids=body.return_token_ids,
        forward=forward_body(raw) if forwarded else None, n=choices(raw),
        queue_ttl_s=hdr.queue_ttl_s(headers), asked_class=asked_class(body.slo, headers),
    )

