"""Issue 19 against the real tiny vLLM: llm-d's header names, vLLM's own body fields and
vLLM's other routes behave through jitserve as on the bare vLLM (owner: sidecar).

Each answer is compared with the bare vLLM's answer to the same request: same status,
same structure (keys and value types; ids and timestamps differ), and for greedy
decoding the same text. What jitserve adds is checked on what it reports: the tenant in
the ``jitserve`` extension and in ``/metrics``.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.http import get_json, get_text, metric, post
from tests.support.json_shape import shape
from tests.support.sidecar import Factory
from tests.support.waiting import body_timeout

pytestmark = body_timeout(300)

POLICY = {"fairness": {"tenants": [{"name": "team-b"}, {"name": "team-c"}]}}


@pytest.fixture(scope="module")
def model(vllm_url: str) -> str:
    status, doc = get_json(vllm_url + "/v1/models")
    assert status == 200, doc
    name: str = doc["data"][0]["id"]
    return name


def without_jitserve(doc: Any) -> Any:
    return {k: v for k, v in doc.items() if k != "jitserve"} if isinstance(doc, dict) else doc


def test_the_llm_d_fairness_id_names_the_tenant_and_the_old_one_still_works(
        sidecar: Factory) -> None:
    s = sidecar(POLICY)
    url = s.url + "/v1/completions"
    body = {"prompt": [5, 17, 99], "max_tokens": 2, "ignore_eos": True}
    status, _, new = post(url, body, {"x-llm-d-inference-fairness-id": "team-b"})
    assert status == 200 and new["jitserve"]["tenant"] == "team-b"
    status, _, old = post(url, body, {"x-gateway-inference-fairness-id": "team-c"})
    assert status == 200 and old["jitserve"]["tenant"] == "team-c"
    text = get_text(s.url + "/metrics")
    assert metric(text, "jitserve_requests_total", tenant="team-b", outcome="met") == 1
    assert metric(text, "jitserve_requests_total", tenant="team-c", outcome="met") == 1
    assert metric(text, "jitserve_generation_tokens_total", tenant="team-b") == 2
    assert metric(text, "jitserve_prompt_tokens_total", tenant="team-c") == 3


def test_kv_transfer_params_and_cache_salt_reach_vllm_unchanged(
        sidecar: Factory, vllm_url: str, model: str) -> None:
    s = sidecar(POLICY)
    body = {"model": model, "prompt": "hello there", "max_tokens": 6, "temperature": 0,
            "cache_salt": "team-b", "kv_transfer_params": {"do_remote_decode": False}}
    bare_status, _, bare = post(vllm_url + "/v1/completions", body)
    status, _, ours = post(s.url + "/v1/completions", body,
                           {"x-llm-d-inference-fairness-id": "team-b"})
    assert (status, bare_status) == (200, 200), (ours, bare)
    assert "kv_transfer_params" in bare and shape(without_jitserve(ours)) == shape(bare)
    assert ours["choices"][0]["text"] == bare["choices"][0]["text"]
    assert ours["jitserve"]["tenant"] == "team-b"
    # a value vLLM refuses is refused by vLLM through jitserve too: the field reached it
    bad = {**body, "cache_salt": ""}
    bare_status, _, bare = post(vllm_url + "/v1/completions", bad)
    status, _, ours = post(s.url + "/v1/completions", bad)
    assert bare_status == status == 400, (bare, ours)
    assert "cache_salt" in bare["error"]["message"] and "cache_salt" in ours["error"]["message"]


def test_the_responses_api_is_passed_through_as_vllm_answers_it(
        sidecar: Factory, vllm_url: str, model: str) -> None:
    s = sidecar(POLICY, api_keys={"key-b": "team-b"})
    body = {"model": model, "input": "hello", "max_output_tokens": 6, "temperature": 0}
    bare_status, _, bare = post(vllm_url + "/v1/responses", body)
    assert bare_status == 200, bare
    status, _, doc = post(s.url + "/v1/responses", body)
    assert status == 401 and doc["error"]["code"] == "invalid_api_key"
    status, _, ours = post(s.url + "/v1/responses", body,
                                 {"Authorization": "Bearer key-b"})
    assert status == 200 and shape(ours) == shape(bare)
    status, _, emb = post(s.url + "/v1/embeddings", {"model": model, "input": "hi"},
                          {"Authorization": "Bearer key-b"})
    bare_status, _, bare_emb = post(vllm_url + "/v1/embeddings", {"model": model, "input": "hi"})
    assert status == bare_status and shape(emb) == shape(bare_emb)


def test_passthrough_answers_are_counted_per_tenant(sidecar: Factory, model: str) -> None:
    s = sidecar(POLICY)
    for _ in range(2):
        status, _, _doc = post(s.url + "/v1/responses",
                               {"model": model, "input": "hi", "max_output_tokens": 2},
                               {"x-llm-d-inference-fairness-id": "team-c"})
        assert status == 200
    text = get_text(s.url + "/metrics")
    assert metric(text, "jitserve_passthrough_requests_total", tenant="team-c",
                  route="/v1/responses", code="200") == 2


def test_an_image_part_gets_the_bare_vllms_answer(sidecar: Factory, vllm_url: str,
                                                   model: str) -> None:
    s = sidecar(POLICY)
    body = {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]}
    bare_status, _, bare = post(vllm_url + "/v1/chat/completions", body)
    status, _, ours = post(s.url + "/v1/chat/completions", body)
    assert status == bare_status, (ours, bare)
    if bare_status == 200:
        assert shape(without_jitserve(ours)) == shape(bare)
    else:
        assert bare["error"]["message"] in ours["error"]["message"]
