"""The endpoint picker over real gRPC on loopback, driven with Envoy's generated protos as
the Gateway API Inference Extension's endpoint-picker protocol specifies
(/work/shared/data/gaie/endpoint-picker-protocol.md; docs/gateway.md "Endpoint picker").

The placements are the real ones (:func:`jitserve.placement.registry.make_placer`); the
replica reports are a static list (the gateway's Fleet reads them from live sidecars)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from grpc_health.v1 import health_pb2, health_pb2_grpc

from jitserve.gateway.picker import EndpointPicker
from jitserve.gateway.picker_ask import AskBuilder
from jitserve.gateway.picker_server import EXT_PROC_SERVICE, LIVENESS, READINESS
from jitserve.placement.base import Ask, Pick, Placer, Refusal, ReplicaReport, program_key
from jitserve.placement.registry import make_placer
from jitserve.policy import load_policy
from jitserve.slo import DeadlineSLO, LatencySLO, SLOKind
from tests.support.picker import (
    StaticReports,
    immediate_of,
    metadata_destination,
    report,
    request_body,
    request_headers,
    response_body,
    response_headers,
    run,
    running_picker,
    set_headers,
)

A, B, C = "10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080"
Mode = processing_mode_pb2.ProcessingMode


def fleet(*reports: ReplicaReport) -> StaticReports:
    return StaticReports(list(reports))


def by_load() -> StaticReports:
    """Three replicas whose outstanding tokens order them C, A, B (least-loaded's order)."""
    return fleet(report(A, outstanding_tokens=500), report(B, outstanding_tokens=900),
                 report(C, outstanding_tokens=100))


@dataclass
class Recording:
    """The real placer, with the asks it was given kept for the test to read."""

    inner: Placer
    asks: list[Ask] = field(default_factory=list)
    placed_on: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.inner.name

    def place(self, ask: Ask, reports: Any, now_s: float) -> Pick | Refusal:
        self.asks.append(ask)
        return self.inner.place(ask, reports, now_s)

    def placed(self, ask: Ask, replica: str) -> None:
        self.placed_on.append(replica)
        self.inner.placed(ask, replica)

    def reported(self, report: ReplicaReport) -> None:
        self.inner.reported(report)


def picker(source: StaticReports, placement: str = "least-loaded", **asks: Any
           ) -> EndpointPicker:
    return EndpointPicker(source, Recording(make_placer(placement)), AskBuilder(**asks))


COMPLETION = {"model": "m", "prompt": [1, 2, 3, 4, 5], "max_tokens": 40,
              "slo": {"ttft_ms": 200, "tbt_ms": 50}}


def test_full_duplex_answers_the_headers_after_the_body_with_header_and_metadata() -> None:
    p = picker(by_load())
    raw = json.dumps(COMPLETION).encode()

    async def scenario() -> list[Any]:
        async with running_picker(p) as picker_rpc:
            return await picker_rpc.exchange(
                request_headers(extra={"x-request-id": "r1", "x-tenant": "acme"}),
                request_body(raw[:10], end_of_stream=False), request_body(raw[10:]))

    first, second = run(scenario())
    assert first.WhichOneof("response") == "request_headers"
    headers = set_headers(first)
    # primary first (the least outstanding tokens), then the fallbacks in order
    assert headers["x-gateway-destination-endpoint"] == f"{C},{A},{B}"
    assert metadata_destination(first) == headers["x-gateway-destination-endpoint"]
    assert headers["content-length"] == str(len(raw))
    assert first.request_headers.response.clear_route_cache
    # the body goes on unchanged, whole, after the header answer
    assert second.WhichOneof("response") == "request_body"
    streamed = second.request_body.response.body_mutation.streamed_response
    assert streamed.body == raw and streamed.end_of_stream
    ask = p.placer.asks[0]  # type: ignore[attr-defined]
    assert (ask.request_id, ask.tenant, ask.prompt_tokens, ask.output_bound) == ("r1", "acme",
                                                                                 5, 40)
    assert ask.arrival_s == pytest.approx(time.time(), abs=600)  # the placers' clock
    assert ask.slo == LatencySLO(0.2, 0.05)
    assert p.placer.placed_on == [C]  # type: ignore[attr-defined]


def test_the_ask_carries_the_policys_class_and_a_compound_program() -> None:
    spec = load_policy({"sloDefaults": {"classes": [
        {"name": "batch", "kind": "deadline", "deadlineSeconds": 600}]}})
    p = picker(by_load(), spec=spec)
    chat = {"messages": [{"role": "user", "content": "x" * 400}],
            "slo": {"program_id": "plan-7", "stage": 1, "deadline_s": 30}}

    async def scenario() -> None:
        async with running_picker(p) as rpc:
            await rpc.exchange(request_headers("/v1/completions", {"x-llm-d-slo-class": "batch"}),
                               request_body({"prompt": "hello"}))
            await rpc.exchange(request_headers("/v1/chat/completions", {"x-tenant": "t1"}),
                               request_body(chat))

    run(scenario())
    by_class, compound = p.placer.asks  # type: ignore[attr-defined]
    assert by_class.slo == DeadlineSLO(600)
    assert compound.program == program_key("t1", "plan-7") and compound.slo.deadline_s == 30
    assert compound.prompt_tokens == 100  # 400 characters, no tokenizer


def test_headers_only_requests_are_picked_on_their_headers() -> None:
    p = picker(by_load())

    async def scenario() -> list[Any]:
        async with running_picker(p) as rpc:
            models = await rpc.exchange(request_headers("/v1/models", method="GET",
                                                        end_of_stream=True))
            slo = await rpc.exchange(request_headers(
                extra={"x-llm-d-slo-ttft-ms": "300", "x-llm-d-slo-tpot-ms": "40"},
                end_of_stream=True))
            return [*models, *slo]

    models, by_headers = run(scenario())
    for answer in (models, by_headers):
        headers = set_headers(answer)
        assert headers["x-gateway-destination-endpoint"].split(",")[0] == C
        assert metadata_destination(answer) == headers["x-gateway-destination-endpoint"]
        assert "content-length" not in headers
    assert p.placer.asks[1].slo == LatencySLO(0.3, 0.04)  # type: ignore[attr-defined]


def test_the_subset_hint_limits_the_pick_to_its_endpoints() -> None:
    p = picker(by_load())

    async def scenario() -> list[Any]:
        async with running_picker(p) as rpc:
            return await rpc.exchange(
                request_headers(subset=[B, "10.9.9.9:8080", A]), request_body(COMPLETION))

    first, _ = run(scenario())
    # C is the least loaded, but the data plane allows only A and B (10.9.9.9 is unknown)
    assert set_headers(first)["x-gateway-destination-endpoint"] == f"{A},{B}"
    assert metadata_destination(first) == f"{A},{B}"


@pytest.mark.parametrize("subset", [[], ["10.9.9.9:8080"]], ids=["empty", "none-eligible"])
def test_an_empty_or_ineligible_subset_is_an_immediate_503(subset: list[str]) -> None:
    p = picker(by_load())

    async def scenario() -> list[Any]:
        async with running_picker(p) as rpc:
            return await rpc.exchange(request_headers(subset=subset), request_body(COMPLETION))

    (answer,) = run(scenario())
    status, headers, body = immediate_of(answer)
    assert status == 503 and headers["retry-after"] == "1"
    assert headers["content-type"] == "application/json"
    assert body["error"]["code"] == "no_replica"
    assert headers["x-llm-d-request-dropped-reason"] == "rejected-no-endpoints"
    assert p.placer.asks == []  # type: ignore[attr-defined]


def test_no_ready_replica_is_an_immediate_503() -> None:
    p = picker(fleet(report(A, ready=False)))

    async def scenario() -> list[Any]:
        async with running_picker(p) as rpc:
            return await rpc.exchange(request_headers(), request_body(COMPLETION))

    (answer,) = run(scenario())
    status, headers, body = immediate_of(answer)
    assert status == 503 and int(headers["retry-after"]) >= 1
    assert body["error"]["type"] == "service_unavailable"


def test_every_replica_shedding_is_an_immediate_429() -> None:
    p = picker(fleet(report(A, shedding=True), report(B, shedding=True)), "round-robin")

    async def scenario() -> list[Any]:
        async with running_picker(p) as rpc:
            shed = await rpc.exchange(request_headers(), request_body(COMPLETION))
            p.source.items.append(report(C))  # type: ignore[attr-defined]
            taken = await rpc.exchange(request_headers(), request_body(COMPLETION))
            return [*shed, *taken]

    shed, taken, _ = run(scenario())
    status, headers, body = immediate_of(shed)
    assert status == 429 and int(headers["retry-after"]) >= 1
    assert body["error"]["type"] == "rate_limit_error"
    assert body["error"]["code"] == "all_replicas_shedding"
    assert headers["x-should-retry"] == "true"
    assert headers["x-llm-d-request-dropped-reason"] == "rejected-saturated"
    # one replica with room takes it; the shedding ones are not offered as fallbacks
    assert set_headers(taken)["x-gateway-destination-endpoint"] == C
    assert p.stats.refusals == {429: 1} and p.stats.picks == 1


@pytest.mark.parametrize("body", [
    b"{not json",
    {"prompt": "hi", "slo": {"ttft_ms": -1}},
    {"prompt": "hi", "slo": {"class": "nope"}},
    b"[" * 100 + b"]" * 100,
], ids=["not-json", "bad-ttft", "unknown-class", "too-deep"])
def test_a_bad_request_is_placed_for_the_sidecar_to_answer(body: Any) -> None:
    """The sidecar owns request validation (as behind ``jitserve gateway``): the picker
    never refuses what a replica would answer itself, it places it as best effort."""
    p = picker(by_load())
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()

    async def scenario() -> list[Any]:
        async with running_picker(p) as rpc:
            return await rpc.exchange(request_headers(), request_body(raw))

    head, passed = run(scenario())
    assert set_headers(head)["x-gateway-destination-endpoint"].startswith(C)
    assert passed.request_body.response.body_mutation.streamed_response.body == raw
    (ask,) = p.placer.asks  # type: ignore[attr-defined]
    assert ask.kind is SLOKind.BEST_EFFORT


def test_a_body_over_the_limit_is_413_before_it_is_all_read() -> None:
    p = picker(by_load(), max_body_bytes=64)

    async def scenario() -> list[Any]:
        async with running_picker(p) as rpc:
            return await rpc.exchange(request_headers(),
                                      request_body(b"[" * 100, end_of_stream=False))

    (answer,) = run(scenario())
    assert immediate_of(answer)[0] == 413


def test_the_response_phases_pass_through_and_the_served_endpoint_is_read() -> None:
    p = picker(by_load())
    chunks = [b'data: {"choices":[{"text":"a"}]}\n\n', b"data: [DONE]\n\n"]

    async def scenario() -> list[Any]:
        async with running_picker(p) as rpc:
            return await rpc.exchange(
                request_headers(), request_body(COMPLETION),
                response_headers(served=A),  # the primary C failed; the fallback A served
                response_body(chunks[0]), response_body(chunks[1], end_of_stream=True))

    _, _, head, *bodies = run(scenario())
    assert head.WhichOneof("response") == "response_headers"
    assert not head.response_headers.response.HasField("header_mutation")
    streamed = [b.response_body.response.body_mutation.streamed_response for b in bodies]
    assert [s.body for s in streamed] == chunks
    assert [s.end_of_stream for s in streamed] == [False, True]
    assert p.stats.served_by_fallback == 1
    assert p.placer.placed_on == [C, A]  # type: ignore[attr-defined]


def test_a_programs_call_goes_to_the_replica_holding_its_book() -> None:
    """As through ``jitserve gateway``: the holder first (here B, the most loaded), even
    while it sheds (it answers 429 itself rather than splitting the program)."""
    source = fleet(report(A, outstanding_tokens=500),
                   report(B, outstanding_tokens=900, shedding=True,
                          programs=frozenset({program_key("t1", "plan-7")})),
                   report(C, outstanding_tokens=100))
    p = picker(source)
    call = {"prompt": "next stage", "slo": {"program_id": "plan-7", "stage": 2}}

    async def scenario() -> list[Any]:
        async with running_picker(p) as rpc:
            return await rpc.exchange(request_headers(extra={"x-tenant": "t1"}),
                                      request_body(call))

    head, _ = run(scenario())
    assert set_headers(head)["x-gateway-destination-endpoint"].split(",")[0] == B
    assert p.stats.sticky == 1


def test_a_keyed_requests_tenant_is_a_digest_of_its_key() -> None:
    p = picker(by_load())

    async def scenario() -> None:
        async with running_picker(p) as rpc:
            for key in ("sk-one", "sk-one", "sk-two"):
                await rpc.exchange(request_headers(extra={"authorization": f"Bearer {key}"}),
                                   request_body(COMPLETION))

    run(scenario())
    one, again, two = (a.tenant for a in p.placer.asks)  # type: ignore[attr-defined]
    assert one == again != two and one.startswith("key:") and "sk-one" not in one


def test_buffered_mode_answers_the_headers_at_once_and_picks_on_the_body() -> None:
    p = picker(by_load())

    async def scenario() -> list[Any]:
        async with running_picker(p) as rpc:
            return await rpc.exchange(
                request_headers(modes=(Mode.BUFFERED, Mode.NONE)), request_body(COMPLETION),
                response_headers(), response_body(b"{}", end_of_stream=True))

    head, body, resp_head, resp_body = run(scenario())
    assert head.WhichOneof("response") == "request_headers"
    assert not head.request_headers.response.HasField("header_mutation")
    assert set_headers(body, "request_body")["x-gateway-destination-endpoint"] == f"{C},{A},{B}"
    assert metadata_destination(body) == f"{C},{A},{B}"
    assert resp_head.WhichOneof("response") == "response_headers"
    assert not resp_body.response_body.response.HasField("body_mutation")


def test_when_envoy_sends_no_body_the_pick_is_made_on_the_headers() -> None:
    """Request body mode NONE: the headers come without end_of_stream, no body follows."""
    p = picker(by_load())

    async def scenario() -> list[Any]:
        async with running_picker(p) as rpc:
            return await rpc.exchange(request_headers(
                extra={"x-llm-d-slo-deadline-ms": "9000"}, modes=(Mode.NONE, Mode.NONE)))

    (head,) = run(scenario())
    assert set_headers(head)["x-gateway-destination-endpoint"] == f"{C},{A},{B}"
    assert p.placer.asks[0].slo == DeadlineSLO(9.0)  # type: ignore[attr-defined]


def test_trailers_end_a_full_duplex_body() -> None:
    p = picker(by_load())
    raw = json.dumps(COMPLETION).encode()

    async def scenario() -> list[Any]:
        async with running_picker(p) as rpc:
            return await rpc.exchange(
                request_headers(), request_body(raw, end_of_stream=False),
                ep.ProcessingRequest(request_trailers=ep.HttpTrailers()))

    head, body, trailers = run(scenario())
    assert set_headers(head)["x-gateway-destination-endpoint"].startswith(C)
    streamed = body.request_body.response.body_mutation.streamed_response
    assert streamed.body == raw and not streamed.end_of_stream
    assert trailers.WhichOneof("response") == "request_trailers"
    assert p.placer.asks[0].slo == LatencySLO(0.2, 0.05)  # type: ignore[attr-defined]


def test_health_services_follow_the_picker_readiness() -> None:
    p = picker(by_load())

    async def check(channel: Any, service: str) -> int:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=service))
        return int(reply.status)

    async def scenario() -> tuple[list[int], list[int], Any]:
        async with running_picker(p, ready=False) as rpc:
            services = [LIVENESS, READINESS, EXT_PROC_SERVICE]
            before = [await check(rpc.channel, s) for s in services]
            assert rpc.server is not None
            await rpc.server.ready(True)
            after = [await check(rpc.channel, s) for s in services]
            try:
                await check(rpc.channel, "no.such.Service")
            except grpc.aio.AioRpcError as err:
                return before, after, err.code()
            return before, after, None

    serving, not_serving = (health_pb2.HealthCheckResponse.SERVING,
                            health_pb2.HealthCheckResponse.NOT_SERVING)
    before, after, unknown = run(scenario())
    assert EXT_PROC_SERVICE == "envoy.service.ext_proc.v3.ExternalProcessor"
    assert before == [serving, not_serving, not_serving]
    assert after == [serving, serving, serving]
    assert unknown == grpc.StatusCode.NOT_FOUND


def test_the_ask_is_held_to_the_tenants_contract_as_the_sidecar_holds_it() -> None:
    """A claim past a tenant's contract is ranked at its bound (the sidecar behind clamps
    it the same way); a refused one is picked as best effort (the sidecar refuses it)."""
    spec = load_policy({"fairness": {"tenants": [
        {"name": "a", "tightest": {"ttftMs": 800, "tbtMs": 100}}]}})
    p = picker(by_load(), spec=spec)
    tight = {"prompt": "hello", "slo": {"ttft_ms": 50, "tbt_ms": 10}}

    async def scenario() -> None:
        async with running_picker(p) as rpc:
            for tenant in ("a", "b"):
                await rpc.exchange(request_headers("/v1/completions", {"x-tenant": tenant}),
                                   request_body(tight))

    run(scenario())
    held, free = p.placer.asks  # type: ignore[attr-defined]
    assert held.slo == LatencySLO(0.8, 0.1)
    assert free.slo == LatencySLO(0.05, 0.01)
