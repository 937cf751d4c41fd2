"""Fair by contract (issue 27): a tenant cannot buy service with its SLO claims. Its entry
in ``fairness.tenants[]`` bounds the classes it may ask for and the tightest targets it
may claim; past them a claim is clamped or refused, and counted (owner: sidecar)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jitserve.devstack.vllm import free_port
from jitserve.policy import PolicyError, SLOPolicySpec, dump_policy_yaml, load_policy
from jitserve.sidecar.api import ParsedRequest, parse_request
from jitserve.sidecar.claims import hold_to_contract
from jitserve.sidecar.errors import APIError
from jitserve.slo import CompoundSLO, DeadlineSLO, LatencySLO
from tests.support.fake_vllm import FakeVLLM
from tests.support.http import get_text, metric, metric_total, post
from tests.support.sidecar import SidecarProcess

CLASSES = [{"name": "interactive", "kind": "latency", "ttftSeconds": 0.5, "tbtSeconds": 0.05},
           {"name": "batch", "kind": "deadline", "deadlineSeconds": 90}]


def policy(action: str = "clamp") -> SLOPolicySpec:
    return load_policy({"sloDefaults": {"classes": CLASSES}, "fairness": {
        "beyondContract": action,
        "tenants": [{"name": "a", "classes": ["batch"],
                     "tightest": {"ttftMs": 800, "tbtMs": 100, "deadlineSeconds": 30}},
                    {"name": "b"}]}})


def held(body: dict[str, Any], tenant: str = "a", action: str = "clamp",
         hdrs: dict[str, str] | None = None) -> tuple[ParsedRequest, list[str]]:
    spec = policy(action)
    parsed = parse_request("completions", {"prompt": "hi", **body}, hdrs or {},
                           spec.slo_defaults, spec.fairness.default_class_of(tenant))
    return hold_to_contract(parsed, tenant, spec.fairness)


def test_a_claim_tighter_than_the_contract_is_served_at_its_bound_and_named() -> None:
    parsed, beyond = held({"slo": {"ttft_ms": 100, "tbt_ms": 20}})
    assert parsed.slo == LatencySLO(0.8, 0.1)
    assert beyond == ["slo.ttft_ms", "slo.tbt_ms"]
    parsed, beyond = held({"slo": {"deadline_s": 5}})
    assert parsed.slo == DeadlineSLO(30.0) and beyond == ["slo.deadline_s"]
    parsed, beyond = held({"slo": {"kind": "compound", "program_id": "p", "deadline_s": 4}})
    assert parsed.slo == CompoundSLO(30.0) and beyond == ["slo.deadline_s"]
    # a program's bound is per stage, as its default deadline is
    three = {"kind": "compound", "program_id": "q", "stages": 3}
    parsed, beyond = held({"slo": {**three, "deadline_s": 40}})
    assert parsed.slo == CompoundSLO(90.0) and beyond == ["slo.deadline_s"]
    parsed, beyond = held({"slo": {**three, "deadline_s": 95}})
    assert parsed.slo == CompoundSLO(95.0) and beyond == []


def test_claims_within_the_contract_and_best_effort_are_untouched() -> None:
    parsed, beyond = held({"slo": {"ttft_ms": 900, "tbt_ms": 150}})
    assert parsed.slo == LatencySLO(0.9, 0.15) and beyond == []
    parsed, beyond = held({"slo": {"kind": "best_effort"}})
    assert isinstance(parsed.slo, DeadlineSLO) and parsed.slo.best_effort and beyond == []


def test_refuse_names_the_field() -> None:
    with pytest.raises(APIError) as err:
        held({"slo": {"ttft_ms": 100}}, action="refuse")
    assert err.value.status == 403 and err.value.param == "slo.ttft_ms"
    assert err.value.code == "slo_beyond_contract"


@pytest.mark.parametrize(("body", "hdrs", "param"), [
    ({"slo": {"class": "interactive"}}, {}, "slo.class"),
    ({}, {"x-llm-d-slo-class": "interactive"}, "x-llm-d-slo-class"),
    ({}, {"x-llm-d-inference-objective": "interactive"}, "x-llm-d-inference-objective"),
])
def test_a_class_outside_the_tenants_classes_is_refused_from_body_or_header(
    body: dict[str, Any], hdrs: dict[str, str], param: str
) -> None:
    with pytest.raises(APIError) as err:
        held(body, hdrs=hdrs)
    assert err.value.status == 403 and err.value.param == param
    assert err.value.code == "class_not_in_contract" and "batch" in str(err.value)
    parsed, _ = held({"slo": {"class": "batch"}})
    assert parsed.slo_class == "batch"


def test_a_tenant_without_bounds_and_an_unlisted_tenant_keep_todays_behaviour() -> None:
    for tenant in ("b", "nobody"):
        parsed, beyond = held({"slo": {"ttft_ms": 10, "tbt_ms": 1, "class": "interactive"}},
                              tenant=tenant)
        assert parsed.slo == LatencySLO(0.01, 0.001) and beyond == []


def test_the_contract_is_checked_against_the_classes() -> None:
    """The webhook's rules (the CRD states them in CEL too: tests/operator/test_cel.py)."""
    gold = load_policy({"sloDefaults": {"classes": CLASSES},
                        "fairness": {"tenants": [{"name": "a", "classes": ["gold"]}]}})
    assert any(p.startswith("fairness.tenants[0].classes") for p in gold.cel_problems())
    wrong_default = load_policy({"sloDefaults": {"classes": CLASSES}, "fairness": {"tenants": [
        {"name": "a", "classes": ["batch"], "defaultClass": "interactive"}]}})
    assert any(p.startswith("fairness.tenants[0].defaultClass")
               for p in wrong_default.cel_problems())
    assert not [p for p in policy().cel_problems() if p.startswith("fairness")]
    with pytest.raises(PolicyError, match="beyondContract"):
        load_policy({"fairness": {"beyondContract": "ignore"}})


def test_through_the_sidecar_a_claim_beyond_is_clamped_or_refused_and_counted(
    tmp_path: Path,
) -> None:
    """A real sidecar in front of the suite's FAKE vLLM (the contract is the sidecar's;
    no engine behaviour matters here)."""
    fake = FakeVLLM(free_port())
    config = tmp_path / "policy.yaml"
    config.write_text(dump_policy_yaml(policy()))
    s = SidecarProcess(f"http://127.0.0.1:{fake.port}", config=config)
    try:
        s.wait_ready()
        url = s.url + "/v1/completions"
        tight = {"prompt": [1, 2, 3], "max_tokens": 4, "slo": {"ttft_ms": 50, "tbt_ms": 100}}
        status, _, body = post(url, tight, {"x-tenant": "a"})
        assert status == 200, body
        status, _, body = post(url, {"prompt": [1], "max_tokens": 2},
                               {"x-tenant": "a", "x-llm-d-slo-class": "interactive"})
        assert status == 403 and body["error"]["param"] == "x-llm-d-slo-class", body
        status, _, body = post(url, tight, {"x-tenant": "b"})
        # b's own 50 ms stands (no contract, nothing clamped): on a busy machine the first
        # token can come later than that, and overload control retires the request
        assert status == 200 or body["error"]["code"] == "slo_unreachable", body
        text = get_text(s.url + "/metrics")
        name = "jitserve_slo_claims_beyond_contract_total"
        assert metric(text, name, tenant="a", field="slo.ttft_ms", action="clamped") == 1
        assert metric(text, name, tenant="a", field="x-llm-d-slo-class",
                      action="refused") == 1
        assert metric_total(text, name, tenant="b") == 0
        # demand, in goodput units: an admitted latency request would earn its 4 output
        # tokens (its prompt never counts); the refused one asked for nothing
        demand = "jitserve_tenant_demand_tokens_total"
        assert metric(text, demand, tenant="a") == 4 and metric(text, demand, tenant="b") == 4
    finally:
        s.close()
        fake.close()
