"""The API a tenant's code already speaks, through a real sidecar in front of a real vLLM,
with the official ``openai`` client (owner: sidecar; issue 12).

It runs on the session's shared vLLM (tests/conftest.py), which has the tool-call flags
``jitserve up`` passes (``--enable-auto-tool-choice --tool-call-parser pythonic``: a named
``tool_choice`` needs them), and one sidecar in front of it. Structured outputs, forced
tool calls, logprobs and ``n`` are forwarded to vLLM's own endpoint; every feature's
response is compared field by field with the bare vLLM's answer to the same body.
``JITSERVE_TEST_SIDECAR_URL`` points the module at a sidecar in front of that vLLM
instead (``jitserve up --config`` with :data:`POLICY`): the acceptance run through
``jitserve up``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from jitserve import sse
from tests.support.http import post
from tests.support.json_shape import shape, stream_shape
from tests.support.sidecar import SidecarProcess, keeping_every_request

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"color": {"type": "string", "enum": ["red", "green", "blue"]},
                   "ok": {"type": "boolean"}},
    "required": ["color", "ok"],
    "additionalProperties": False,
}
TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                       "required": ["city"], "additionalProperties": False},
    },
}
FORCED = {"type": "function", "function": {"name": "get_weather"}}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
# overload control off: the latency tests here are about headers and classes, and a first
# token a busy machine makes late must not turn their request into a 429
POLICY = keeping_every_request({"sloDefaults": {"classes": [
    {"name": "interactive", "kind": "latency", "ttftSeconds": 1.5, "tbtSeconds": 0.09},
    {"name": "batch", "kind": "deadline", "deadlineSeconds": 120},
]}})


@pytest.fixture(scope="module")
def sidecar_url(vllm_url: str) -> Iterator[str]:
    existing = os.environ.get("JITSERVE_TEST_SIDECAR_URL")
    if existing:  # e.g. `jitserve up --config <POLICY as YAML>` and its vLLM as the one above
        yield existing.rstrip("/")
        return
    config = Path(tempfile.mkdtemp(prefix="jitserve-openai-")) / "policy.yaml"
    config.write_text(yaml.safe_dump(POLICY))
    s = SidecarProcess(vllm_url, config=config, max_running=8)
    try:
        s.wait_ready()
        yield s.url
    finally:
        s.close()


@pytest.fixture(scope="module")
def client(sidecar_url: str) -> Any:
    return openai.OpenAI(base_url=sidecar_url + "/v1", api_key="none", max_retries=0,
                         timeout=120)


@pytest.fixture(scope="module")
def bare(vllm_url: str) -> Any:
    return openai.OpenAI(base_url=vllm_url + "/v1", api_key="none", max_retries=0,
                         timeout=120)


@pytest.fixture(scope="module")
def model(client: Any) -> str:
    return client.models.list().data[0].id


def check_schema(doc: Any) -> None:
    assert isinstance(doc, dict) and set(doc) == {"color", "ok"}, doc
    assert doc["color"] in ("red", "green", "blue") and isinstance(doc["ok"], bool), doc


def test_json_schema_response_validates(client: Any, model: str) -> None:
    resp = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=400, seed=7,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "answer", "schema": SCHEMA}},
        extra_body={"slo": {"deadline_s": 120}})
    choice = resp.choices[0]
    assert choice.finish_reason == "stop", choice
    check_schema(json.loads(choice.message.content or ""))
    extension = resp.model_extra["jitserve"] if resp.model_extra else {}
    assert extension["slo_kind"] == "deadline" and extension["preemptions"] == 0


def test_vllm_structured_outputs_field(client: Any, model: str) -> None:
    resp = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=400, seed=3,
        extra_body={"structured_outputs": {"json": SCHEMA}})
    check_schema(json.loads(resp.choices[0].message.content or ""))


def test_forced_tool_call_comes_back_as_tool_calls(client: Any, model: str) -> None:
    resp = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=300, seed=1,
        tools=[TOOL], tool_choice=FORCED)
    calls = resp.choices[0].message.tool_calls or []
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    args = json.loads(calls[0].function.arguments)
    assert args == {"city": args["city"]} and args["city"] in ("Paris", "Oslo")


def test_forced_tool_call_streamed(client: Any, model: str) -> None:
    stream = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=300, seed=1, stream=True,
        tools=[TOOL], tool_choice=FORCED)
    name, arguments, chunks = "", "", 0
    for chunk in stream:
        chunks += 1
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                if call.function is not None:
                    name += call.function.name or ""
                    arguments += call.function.arguments or ""
    assert chunks > 3 and name == "get_weather"
    assert json.loads(arguments)["city"] in ("Paris", "Oslo")


def test_logprobs_n_and_request_id(client: Any, model: str) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=MESSAGES, max_tokens=6, n=2, extra_body={"ignore_eos": True},
        logprobs=True, top_logprobs=2, extra_headers={"X-Request-Id": "tenant-req-42"})
    resp = raw.parse()
    assert resp._request_id == "tenant-req-42"
    assert len(resp.choices) == 2 and {c.index for c in resp.choices} == {0, 1}
    for choice in resp.choices:
        assert choice.logprobs is not None and choice.logprobs.content
        assert len(choice.logprobs.content[0].top_logprobs) == 2
    assert resp.usage is not None and resp.usage.completion_tokens == 12
    plain = client.completions.create(model=model, prompt="hello", max_tokens=3, logprobs=2,
                                      stop=["zz"], logit_bias={"5": -100})
    assert plain.choices[0].logprobs is not None and plain.choices[0].logprobs.top_logprobs


def test_errors_say_whether_to_retry(sidecar_url: str, client: Any) -> None:
    status, headers, body = post(sidecar_url + "/v1/chat/completions",
                                 {"messages": MESSAGES, "priority": 1},
                                 headers={"X-Request-Id": "bad-1"})
    assert status == 400 and body["error"]["param"] == "priority"
    lower = {k.lower(): v for k, v in headers.items()}
    assert lower["x-should-retry"] == "false" and lower["x-request-id"] == "bad-1"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="x", messages=MESSAGES,
                                       extra_body={"request_id": "mine"})
    assert "X-Request-Id" in str(err.value)


def test_llm_d_headers_give_the_latency_slo(client: Any, model: str) -> None:
    resp = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=3,
        extra_headers={"x-llm-d-slo-ttft-ms": "1800", "x-llm-d-slo-tpot-ms": "70"})
    ext = (resp.model_extra or {})["jitserve"]
    assert ext["slo_kind"] == "latency" and ext["slo"] == {"ttft_ms": 1800.0, "tbt_ms": 70.0}
    old = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=3,
        extra_headers={"x-slo-ttft-ms": "900", "x-slo-tpot-ms": "60"})
    assert (old.model_extra or {})["jitserve"]["slo"] == {"ttft_ms": 900.0, "tbt_ms": 60.0}


def test_gateway_objective_and_fairness_id(client: Any, model: str) -> None:
    resp = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=3,
        extra_headers={"x-gateway-inference-objective": "interactive",
                       "x-gateway-inference-fairness-id": "team-a"})
    ext = (resp.model_extra or {})["jitserve"]
    assert ext["slo_class"] == "interactive" and ext["tenant"] == "team-a"
    assert ext["slo"] == {"ttft_ms": 1500.0, "tbt_ms": 90.0}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=3,
            extra_headers={"x-gateway-inference-objective": "nonesuch"})
    assert err.value.response.headers["x-should-retry"] == "false"


# ---- same body, same shape: through jitserve vs the bare vLLM ------------------------------
FEATURES: dict[str, dict[str, Any]] = {
    "json_schema": {"response_format": {"type": "json_schema",
                                        "json_schema": {"name": "a", "schema": SCHEMA}},
                    "max_tokens": 400},
    "json_object": {"response_format": {"type": "json_object"}, "max_tokens": 8},
    "text": {"response_format": {"type": "text"}, "max_tokens": 4},
    "structured_outputs": {"structured_outputs": {"choice": ["yes", "no"]}, "max_tokens": 8},
    "tools": {"tools": [TOOL], "tool_choice": FORCED, "max_tokens": 300},
    "logprobs": {"logprobs": True, "top_logprobs": 3, "max_tokens": 4},
    "n": {"n": 2, "max_tokens": 4},
    "stop_seed_bias": {"stop": ["\n\n"], "seed": 5, "logit_bias": {"7": 5}, "max_tokens": 4},
    "chat_template_kwargs": {"chat_template_kwargs": {"enable_thinking": False},
                             "max_tokens": 4},
}


def _without_extension(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "jitserve"}


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_same_shape_as_bare_vllm(feature: str, client: Any, bare: Any,
                                 model: str) -> None:
    body = {"model": model, "messages": MESSAGES, "seed": 11, **FEATURES[feature]}
    ours = client.post("/chat/completions", cast_to=object, body=body)
    theirs = bare.post("/chat/completions", cast_to=object, body=body)
    assert isinstance(ours, dict) and isinstance(theirs, dict)
    assert shape(_without_extension(ours)) == shape(theirs), feature
    assert len(ours["choices"]) == len(theirs["choices"])
    if feature == "json_schema":
        check_schema(json.loads(ours["choices"][0]["message"]["content"]))


@pytest.mark.parametrize("feature", ["tools", "logprobs", "json_schema"])
def test_same_stream_shape_as_bare_vllm(feature: str, sidecar_url: str, vllm_url: str,
                                        model: str) -> None:
    body = {"model": model, "messages": MESSAGES, "seed": 11, "stream": True,
            "stream_options": {"include_usage": True}, **FEATURES[feature]}
    ours = _sse_docs(sidecar_url, body)
    theirs = _sse_docs(vllm_url, body)
    assert stream_shape([_without_extension(d) for d in ours]) == stream_shape(theirs)
    assert ours[-1]["usage"]["completion_tokens"] > 0 and not ours[-1]["choices"]
    assert ours[-1]["jitserve"]["outcome"] in ("met", "missed")


def _sse_docs(base: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    import urllib.request

    request = urllib.request.Request(base + "/v1/chat/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    docs: list[dict[str, Any]] = []
    with urllib.request.urlopen(request, timeout=120) as resp:
        events, _ = sse.split(resp.read())
        for payload in map(sse.data, events):
            if payload is not None and payload != sse.DONE:
                docs.append(json.loads(payload))
    return docs
