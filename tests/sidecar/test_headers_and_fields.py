"""Issue 19 without a server: llm-d's current header names and their deprecated aliases,
and the body fields jitserve leaves to vLLM (owner: sidecar)."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from jitserve.policy import load_policy
from jitserve.sidecar import headers, intake
from jitserve.sidecar.api import ParsedRequest, parse_request
from jitserve.sidecar.config import SidecarSettings, TenantKeys
from jitserve.sidecar.errors import APIError
from jitserve.slo import DeadlineSLO, LatencySLO

SPEC = load_policy({"sloDefaults": {"classes": [
    {"name": "interactive", "kind": "latency", "ttftSeconds": 0.5, "tbtSeconds": 0.05},
    {"name": "batch", "kind": "deadline", "deadlineSeconds": 90}]}})
MESSAGES = [{"role": "user", "content": "hi"}]


def chat(body: dict[str, Any], hdrs: dict[str, str] | None = None) -> ParsedRequest:
    return parse_request("chat", {"messages": MESSAGES, **body}, hdrs or {}, SPEC.slo_defaults)


def _request(hdrs: dict[str, str]) -> web.Request:
    return make_mocked_request("POST", "/v1/chat/completions", headers=hdrs)


@pytest.mark.parametrize("name", ["x-llm-d-inference-fairness-id",
                                  "x-gateway-inference-fairness-id",
                                  "X-LLM-D-Inference-Fairness-Id"])
def test_the_fairness_id_and_its_alias_name_the_tenant(name: str) -> None:
    assert intake.tenant_of(_request({name: "team-b"}), TenantKeys(SidecarSettings())) == "team-b"


def test_the_current_fairness_id_wins_and_x_tenant_before_both() -> None:
    off = TenantKeys(SidecarSettings())
    both = {"x-llm-d-inference-fairness-id": "new", "x-gateway-inference-fairness-id": "old"}
    assert intake.tenant_of(_request(both), off) == "new"
    assert intake.tenant_of(_request({**both, "x-tenant": "t"}), off) == "t"
    on = TenantKeys(SidecarSettings(api_keys={"k1": "team-a"}))
    on.rebuild(SPEC)
    with pytest.raises(APIError) as err:
        intake.tenant_of(_request({"Authorization": "Bearer k1",
                                   "x-llm-d-inference-fairness-id": "team-b"}), on)
    assert err.value.status == 403 and err.value.param == "x-llm-d-inference-fairness-id"


def test_objective_class_and_deadline_headers_with_their_aliases() -> None:
    for name in ("x-llm-d-inference-objective", "x-gateway-inference-objective",
                 "x-llm-d-slo-class", "x-slo-class"):
        assert chat({}, {name: "interactive"}).slo == LatencySLO(0.5, 0.05)
    assert chat({}, {"x-llm-d-inference-objective": "batch",
                     "x-gateway-inference-objective": "interactive"}).slo_class == "batch"
    assert chat({}, {"x-llm-d-slo-class": "batch",
                     "x-llm-d-inference-objective": "interactive"}).slo_class == "batch"
    for name in ("x-llm-d-slo-deadline-ms", "x-slo-deadline-ms"):
        assert chat({}, {name: "1500"}).slo == DeadlineSLO(1.5)
    assert chat({}, {"x-llm-d-slo-deadline-ms": "1500",
                     "x-slo-deadline-ms": "900"}).slo == DeadlineSLO(1.5)


@pytest.mark.parametrize(("raw", "seconds"), [
    ("1500ms", 1.5), ("2s", 2.0), ("1m30s", 90.0), ("1.5h", 5400.0), (".25s", 0.25),
    ("250000us", 0.25), ("250000\u00b5s", 0.25), ("0", None), ("0s", None)])
def test_the_queue_ttl_is_a_go_duration(raw: str, seconds: float | None) -> None:
    assert chat({}, {"x-llm-d-inference-ttl": raw}).queue_ttl_s == seconds
    assert chat({}).queue_ttl_s is None


@pytest.mark.parametrize("raw", ["", "5", "-1s", "1x", "1s2", "ms", "soon"])
def test_a_bad_queue_ttl_is_a_400_naming_the_header(raw: str) -> None:
    with pytest.raises(APIError) as err:
        chat({}, {"x-llm-d-inference-ttl": raw})
    assert err.value.status == 400 and err.value.param == "x-llm-d-inference-ttl"


@pytest.mark.parametrize("name", ["x-llm-d-slo-tpot-ms", "x-slo-tpot-ms", "x-slo-tbt-ms",
                                  "x-llm-d-slo-deadline-ms", "x-llm-d-inference-objective",
                                  "x-llm-d-slo-class"])
def test_a_bad_header_is_named_as_sent(name: str) -> None:
    with pytest.raises(APIError) as err:
        chat({}, {name: "gold"})
    assert err.value.status == 400 and err.value.param == name


def test_every_alias_has_one_current_name() -> None:
    seen = [alias for aliases in headers.ALIASES.values() for alias in aliases]
    assert len(seen) == len(set(seen)) and not set(seen) & set(headers.ALIASES)
    assert headers.names(headers.SLO_TTFT) == ("x-llm-d-slo-ttft-ms", "x-slo-ttft-ms")


@pytest.mark.parametrize("extra", [
    {"kv_transfer_params": {"do_remote_decode": True}}, {"cache_salt": "tenant-b"},
    {"structural_tag": '{"type": "structural_tag"}'}, {"return_tokens_as_token_ids": True},
    {"a_field_of_a_newer_vllm": {"x": [1]}},
])
def test_vllm_fields_and_unknown_ones_are_forwarded_unchanged(extra: dict[str, Any]) -> None:
    p = chat({**extra, "slo": {"deadline_s": 5}, "max_tokens": 3})
    assert p.forward == {"messages": MESSAGES, **extra, "max_tokens": 3}
    assert p.slo == DeadlineSLO(5.0)
    comp = parse_request("completions", {"prompt": "hi", **extra}, {}, SPEC.slo_defaults)
    assert comp.forward == {"prompt": "hi", **extra}


def test_neutral_values_keep_the_token_path() -> None:
    for extra in ({"return_tokens_as_token_ids": False}, {"cache_salt": None},
                  {"unknown_but_null": None}):
        assert chat(extra).forward is None


def test_media_parts_are_forwarded_and_text_parts_are_not() -> None:
    image = [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]
    p = parse_request("chat", {"messages": image}, {}, SPEC.slo_defaults)
    assert p.forward == {"messages": image}
    text = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert parse_request("chat", {"messages": text}, {}, SPEC.slo_defaults).forward is None
