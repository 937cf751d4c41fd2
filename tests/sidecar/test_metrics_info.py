"""Issue 19 without a server: the metrics vLLM users look for — token counters by
``model_name``, ``jitserve_build_info`` with the policy — and chat forwarded when vLLM
runs a reasoning parser (owner: sidecar)."""

from __future__ import annotations

from jitserve import __version__
from jitserve.policy import load_policy
from jitserve.requests import LiveRequest, Request
from jitserve.sidecar.api import parse_request
from jitserve.sidecar.metrics import SidecarMetrics
from jitserve.sidecar.reporting import Reporter
from jitserve.slo import DeadlineSLO

SPEC = load_policy({})


def _sample(metrics: SidecarMetrics, line_start: str) -> list[str]:
    return [line for line in metrics.render().decode().splitlines()
            if line.startswith(line_start)]


def test_build_info_names_version_policy_and_scheduler_and_a_reload_replaces_it() -> None:
    m = SidecarMetrics()
    m.built("chat", "gmax")
    m.built("chat", "fcfs")
    assert _sample(m, "jitserve_build_info{") == [
        f'jitserve_build_info{{policy="chat",scheduler="fcfs",version="{__version__}"}} 1.0']


def test_token_counters_by_tenant_and_model_name() -> None:
    m = SidecarMetrics()
    m.known_tenants = {"team-b", "default"}
    report = Reporter(m)
    for tenant, generated in (("team-b", 7), ("team-b", 0), ("made-up", 3)):
        live = LiveRequest(Request(f"r-{tenant}-{generated}", tenant, DeadlineSLO(5.0), 11, 0.0,
                                   model="tiny"))
        live.generated = generated
        report.ended(live)
    assert _sample(m, "jitserve_prompt_tokens_total{") == [
        'jitserve_prompt_tokens_total{model_name="tiny",tenant="team-b"} 22.0',
        'jitserve_prompt_tokens_total{model_name="tiny",tenant="other"} 11.0']
    assert _sample(m, "jitserve_generation_tokens_total{") == [
        'jitserve_generation_tokens_total{model_name="tiny",tenant="team-b"} 7.0',
        'jitserve_generation_tokens_total{model_name="tiny",tenant="other"} 3.0']


def test_with_a_reasoning_parser_chat_goes_to_vllms_chat_endpoint() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
            "slo": {"deadline_s": 9}}
    plain = parse_request("chat", body, {}, SPEC.slo_defaults)
    assert plain.forward is None
    reasoning = parse_request("chat", body, {}, SPEC.slo_defaults, forward_chat=True)
    assert reasoning.forward == {"messages": body["messages"], "max_tokens": 5}
    completion = parse_request("completions", {"prompt": "hi"}, {}, SPEC.slo_defaults,
                               forward_chat=True)
    assert completion.forward is None
