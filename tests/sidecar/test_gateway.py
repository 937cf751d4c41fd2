"""Issue 12 without a server: which requests are forwarded, unknown fields, gateway
headers, retry hints, request ids, the default ``max_tokens`` and non-preemptible
requests in the lifecycle (owner: sidecar)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from jitserve.policy import AdmissionSettings, MaxWaitingRetires, load_policy
from jitserve.requests import Request
from jitserve.scheduling.base import FramePlan, RetireReason
from jitserve.scheduling.estimators import QuantileEstimator
from jitserve.scheduling.registry import make_policy
from jitserve.serving.lifecycle import Lifecycle
from jitserve.serving.speed import SpeedMeter
from jitserve.sidecar import intake, passthrough, request_ids
from jitserve.sidecar.api import ParsedRequest, parse_request
from jitserve.sidecar.config import SidecarSettings, TenantKeys
from jitserve.sidecar.errors import APIError, backend_down, bad_request, queue_full
from jitserve.sidecar.prompts import PromptReader
from jitserve.sidecar.reporting import retirement_error
from jitserve.slo import DeadlineSLO, LatencySLO

SPEC = load_policy({"sloDefaults": {"classes": [
    {"name": "interactive", "kind": "latency", "ttftSeconds": 0.5, "tbtSeconds": 0.05}]}})
MESSAGES = [{"role": "user", "content": "hi"}]


def chat(body: dict[str, Any], headers: dict[str, str] | None = None) -> ParsedRequest:
    return parse_request("chat", {"messages": MESSAGES, **body}, headers or {},
                         SPEC.slo_defaults)


@pytest.mark.parametrize("body", [
    {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {}}}},
    {"response_format": {"type": "text"}}, {"structured_outputs": {"json": {}}},
    {"guided_json": {"type": "object"}}, {"logprobs": True, "top_logprobs": 2}, {"n": 2},
    {"logit_bias": {"5": 1}}, {"chat_template_kwargs": {"x": 1}},
    {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"},
])
def test_vllm_only_features_are_forwarded_as_sent(body: dict[str, Any]) -> None:
    p = chat({**body, "slo": {"deadline_s": 9}, "app": "agent", "user": "u", "seed": 3})
    assert p.forward == {"messages": MESSAGES, **body, "seed": 3}
    assert p.slo == DeadlineSLO(9.0) and p.app == "agent"


def test_plain_requests_keep_the_token_path() -> None:
    for body in ({}, {"n": 1}, {"logprobs": False}, {"stop": ["x"], "seed": 1}):
        assert chat(body).forward is None
    assert chat({"n": 3, "logprobs": True}).n == 3


def test_owned_fields_are_refused_by_name() -> None:
    for body, param in (({"priority": 1}, "priority"), ({"request_id": "x"}, "request_id")):
        with pytest.raises(APIError) as err:
            chat(body)
        assert err.value.status == 400 and err.value.param == param
        assert param in err.value.message


def test_llm_d_headers_and_their_old_aliases() -> None:
    new = chat({}, {"x-llm-d-slo-ttft-ms": "800", "x-llm-d-slo-tpot-ms": "40"})
    assert isinstance(new.slo, LatencySLO)
    assert (new.slo.ttft_s, new.slo.tbt_s) == (pytest.approx(0.8), pytest.approx(0.04))
    old = chat({}, {"x-slo-ttft-ms": "700", "x-slo-tpot-ms": "30"})
    assert isinstance(old.slo, LatencySLO)
    assert (old.slo.ttft_s, old.slo.tbt_s) == (pytest.approx(0.7), pytest.approx(0.03))
    both = chat({}, {"x-llm-d-slo-ttft-ms": "800", "x-slo-ttft-ms": "700"})
    assert isinstance(both.slo, LatencySLO) and both.slo.ttft_s == pytest.approx(0.8)


def test_objective_header_maps_to_the_class_of_that_name() -> None:
    p = chat({}, {"x-gateway-inference-objective": "interactive"})
    assert p.slo_class == "interactive" and p.slo == LatencySLO(0.5, 0.05)
    with pytest.raises(APIError) as err:
        chat({}, {"x-gateway-inference-objective": "gold"})
    assert err.value.param == "x-gateway-inference-objective"


def _request(headers: dict[str, str]) -> web.Request:
    return make_mocked_request("POST", "/v1/chat/completions", headers=headers)


def test_fairness_id_is_the_tenant_when_keys_allow() -> None:
    off = TenantKeys(SidecarSettings())
    assert intake.tenant_of(_request({"x-gateway-inference-fairness-id": "team-a"}), off) \
        == "team-a"
    assert intake.tenant_of(_request({"x-tenant": "t", "x-gateway-inference-fairness-id": "u"}),
                            off) == "t"
    on = TenantKeys(SidecarSettings(api_keys={"k1": "team-a"}))
    on.rebuild(SPEC)
    auth = {"Authorization": "Bearer k1"}
    assert intake.tenant_of(_request({**auth, "x-gateway-inference-fairness-id": "team-a"}),
                            on) == "team-a"
    with pytest.raises(APIError) as err:
        intake.tenant_of(_request({**auth, "x-gateway-inference-fairness-id": "team-b"}), on)
    assert err.value.status == 403 and err.value.param == "x-gateway-inference-fairness-id"


def test_should_retry_only_when_a_retry_can_help() -> None:
    final = [bad_request("x", "y"),
             retirement_error(RetireReason.UNREACHABLE, 3, AdmissionSettings(), streaming=True),
             APIError(404, "no", code="model_not_found")]
    for error in final:
        assert error.headers()["x-should-retry"] == "false", error.code
    shed = [retirement_error(reason, 2, AdmissionSettings()) for reason in RetireReason]
    assert [(e.status, e.code) for e in shed] == [(429, "waiting_time_exceeded"),
                                                  (429, "slo_unreachable"),
                                                  (429, "would_start_late")]
    for error in (queue_full(2), backend_down(), *shed):
        assert error.headers()["x-should-retry"] == "true", error.code
        assert "Retry-After" in error.headers()


def test_a_request_retired_past_its_wait_is_told_which_rule_retired_it() -> None:
    every = retirement_error(RetireReason.MAX_WAITING, 2, AdmissionSettings())
    late = retirement_error(RetireReason.MAX_WAITING, 2, AdmissionSettings(
        max_waiting_seconds=7, max_waiting_retires=MaxWaitingRetires.LATE))
    assert str(every) == "waiting time exceeded: not scheduled within 5 s"
    assert str(late) == ("waiting time exceeded: not scheduled within 7 s, and started now "
                         "it would miss its SLO")
    assert every.code == late.code == "waiting_time_exceeded"


def test_request_ids_echoed_and_checked() -> None:
    request = _request({"X-Request-Id": "abc-1"})
    assert request_ids.client_id(request) == "abc-1"
    response = web.Response()
    asyncio.run(request_ids.on_prepare(request, response))
    assert response.headers["x-request-id"] == "abc-1"
    own = _request({})
    request_ids.remember(own, "chatcmpl-9")
    asyncio.run(request_ids.on_prepare(own, response := web.Response()))
    assert response.headers["x-request-id"] == "chatcmpl-9"
    with pytest.raises(APIError) as err:
        request_ids.client_id(_request({"X-Request-Id": "x" * 300}))
    assert err.value.param == "x-request-id"


class _Models:
    async def models(self) -> dict[str, Any]:
        return {"data": [{"id": "m", "max_model_len": 2048}]}


def test_max_tokens_defaults_to_the_rest_of_the_context() -> None:
    reader = PromptReader(_Models())  # type: ignore[arg-type]
    parsed = chat({})

    async def run() -> tuple[int, int, int]:
        return (await reader.max_tokens(parsed, "m", 48, None, None),
                await reader.max_tokens(parsed, "m", 48, 1000, None),
                await reader.max_tokens(parsed, "m", 48, None, 64))

    assert asyncio.run(run()) == (2000, 952, 64)
    with pytest.raises(APIError) as err:
        asyncio.run(reader.max_tokens(chat({"max_tokens": 2001}), "m", 48, None, None))
    assert err.value.param == "max_tokens"


def test_token_counting_of_forwarded_chunks() -> None:
    delta = {"choices": [{"index": 0, "delta": {"content": "a"}},
                         {"index": 1, "delta": {"tool_calls": [{"index": 0}]}}]}
    assert passthrough.tokens_in(delta, 0) == 2
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    assert passthrough.tokens_in(role, 0) == 0
    lp = {"choices": [{"logprobs": {"content": [{}, {}, {}]}, "message": {}}]}
    assert passthrough.tokens_in(lp, 0) == 3
    assert passthrough.tokens_in({"choices": [], "usage": {"completion_tokens": 9}}, 7) == 2
    assert passthrough.finish_reason({"choices": [{"finish_reason": "tool_calls"}]}) == \
        "tool_calls"
    body = passthrough.vllm_body({"stream": True, "stream_options": {"x": 1}}, "m", 4, "r-1")
    assert body["priority"] == 4 and body["stream_options"] == {"x": 1, "include_usage": True}


class _NoIO:
    def sync(self, now_s: float) -> None:
        pass

    def stop(self, r: Any) -> None:
        pass


def test_a_frame_plan_never_preempts_a_non_preemptible_request() -> None:
    policy = make_policy(SPEC)
    lc = Lifecycle(policy, QuantileEstimator(0.95), _NoIO(),
                   SpeedMeter(decode_step_s=0.02, prefill_s_per_token=1e-3, token_s=1e-3))
    fixed = Request("fwd", "t", DeadlineSLO(10.0), 5, 0.0, max_tokens=50, preemptible=False)
    plain = Request("tok", "t", DeadlineSLO(10.0), 5, 0.0, max_tokens=50)
    for req in (fixed, plain):
        lc.arrive(req, 0.0)
        live = lc.start_next(0.0)
        assert live is not None
        lc.delivered(live, np.array([0.01]), live.generated)
    policy.frame = lambda view: FramePlan(preempt=list(lc.running))  # type: ignore[method-assign]
    result = lc.frame(0.1, 2)
    assert [r.req.request_id for r in result.preempted] == ["tok"]
    assert [r.req.request_id for r in lc.running] == ["fwd"]
