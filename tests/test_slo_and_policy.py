import math

import pytest

from jitserve.policy import PolicyError, SLOPolicySpec, dump_policy_yaml, load_policy
from jitserve.requests import Request
from jitserve.slo import CompoundSLO, DeadlineSLO, LatencySLO, SLOError, SLOKind


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: LatencySLO(ttft_s=-1, tbt_s=0.1), "ttft_s"),
        (lambda: LatencySLO(ttft_s=2, tbt_s=0), "tbt_s"),
        (lambda: LatencySLO(ttft_s=math.inf, tbt_s=0.1), "ttft_s"),
        (lambda: DeadlineSLO(deadline_s=math.nan), "deadline_s"),
        (lambda: CompoundSLO(deadline_s=0), "deadline_s"),
        (lambda: LatencySLO(ttft_s="2", tbt_s=0.1), "ttft_s"),  # type: ignore[arg-type]
    ],
)
def test_invalid_slo_values_name_the_field(build, field):  # type: ignore[no-untyped-def]
    with pytest.raises(SLOError) as info:
        build()
    assert info.value.field == field
    assert field in str(info.value)


def test_request_rejects_empty_prompt_and_tenant() -> None:
    with pytest.raises(SLOError, match="prompt_tokens"):
        Request("r", "t", DeadlineSLO(5), prompt_tokens=0, arrival_s=0)
    with pytest.raises(SLOError, match="tenant"):
        Request("r", "", DeadlineSLO(5), prompt_tokens=3, arrival_s=0)


def test_best_effort_is_its_own_kind() -> None:
    assert DeadlineSLO(100, best_effort=True).kind is SLOKind.BEST_EFFORT
    assert DeadlineSLO(100).kind is SLOKind.DEADLINE


@pytest.mark.parametrize(
    ("document", "path"),
    [
        ({"scheduler": {"cutoff": {"value": 3}}}, "scheduler.cutoff.value"),
        ({"fairness": {"weight": 1.5}}, "fairness.weight"),
        ({"sloDefaults": {"latency": {"ttftSeconds": -1}}}, "sloDefaults.latency.ttftSeconds"),
        ({"admission": {"overloadAction": "explode"}}, "admission.overloadAction"),
        ({"scheduler": {"frameSteps": 0}}, "scheduler.frameSteps"),
        ({"scheduler": {"bogus": 1}}, "scheduler.bogus"),
    ],
)
def test_policy_errors_name_the_wire_field(document, path):  # type: ignore[no-untyped-def]
    with pytest.raises(PolicyError) as info:
        load_policy(document)
    assert path in str(info.value)


def test_policy_round_trips_through_yaml() -> None:
    import yaml

    spec = load_policy(
        {"scheduler": {"cutoff": {"mode": "fixed", "value": 0.7}}, "fairness": {"weight": 0.3}}
    )
    again = load_policy(yaml.safe_load(dump_policy_yaml(spec)))
    assert again == spec
    assert again.scheduler.cutoff.value == 0.7


def test_slo_defaults_follow_the_paper() -> None:
    d = SLOPolicySpec().slo_defaults
    assert d.slo_for(SLOKind.LATENCY) == LatencySLO(2.0, 0.1)
    assert d.slo_for(SLOKind.DEADLINE) == DeadlineSLO(20.0)
    assert d.slo_for(SLOKind.COMPOUND, stages=3) == CompoundSLO(60.0)
