"""Request parsing, SLO resolution, policy-file reloads and tenant keys (no server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from jitserve.policy import SLODefaults, SLOPolicySpec, dump_policy_yaml, load_policy
from jitserve.scheduling.registry import make_policy
from jitserve.sidecar.api import parse_request, resolve_slo
from jitserve.sidecar.config import ConfigWatcher, SidecarSettings, TenantKeys
from jitserve.sidecar.errors import APIError
from jitserve.sidecar.server import simulator_only
from jitserve.slo import CompoundSLO, DeadlineSLO, LatencySLO, SLOKind

DEFAULTS = load_policy(
    {
        "sloDefaults": {
            "classes": [
                {"name": "interactive", "kind": "latency", "ttftSeconds": 0.5, "tbtSeconds": 0.05},
                {"name": "batch", "kind": "deadline", "deadlineSeconds": 600},
            ]
        }
    }
).slo_defaults


def parse(
    body: dict[str, object], headers: dict[str, str] | None = None, endpoint: str = "completions"
):  # type: ignore[no-untyped-def]
    return parse_request(endpoint, body, headers or {}, DEFAULTS)  # type: ignore[arg-type]


def bad_param(
    body: object, headers: dict[str, str] | None = None, endpoint: str = "completions"
) -> str | None:
    with pytest.raises(APIError) as err:
        parse_request(endpoint, body, headers or {}, DEFAULTS)  # type: ignore[arg-type]
    assert err.value.status == 400
    assert err.value.body()["error"]["type"] == "invalid_request_error"
    return err.value.param


def test_latency_slo_from_body_in_milliseconds() -> None:
    p = parse({"prompt": "hi", "slo": {"kind": "latency", "ttft_ms": 250, "tbt_ms": 40}})
    assert p.slo == LatencySLO(0.25, 0.04)
    assert p.slo_class == "default"


def test_latency_slo_from_gateway_headers_and_partial_defaults() -> None:
    p = parse({"prompt": "hi"}, {"x-slo-ttft-ms": "300", "x-slo-tpot-ms": "20"})
    assert p.slo == LatencySLO(0.3, 0.02)
    p = parse({"prompt": "hi"}, {"x-slo-ttft-ms": "300"})
    assert p.slo == LatencySLO(0.3, SLODefaults().latency.tbt_seconds)


def test_body_wins_over_headers() -> None:
    p = parse(
        {"prompt": "hi", "slo": {"ttft_ms": 100}}, {"x-slo-ttft-ms": "900", "x-slo-tpot-ms": "30"}
    )
    assert p.slo == LatencySLO(0.1, 0.03)


def test_deadline_best_effort_and_class_defaults() -> None:
    assert parse({"prompt": "hi", "slo": {"deadline_s": 7}}).slo == DeadlineSLO(7.0)
    assert parse({"prompt": "hi"}, {"x-slo-deadline-ms": "1500"}).slo == DeadlineSLO(1.5)
    be = parse({"prompt": "hi"})
    assert be.slo.kind is SLOKind.BEST_EFFORT
    assert be.slo == DeadlineSLO(SLODefaults().best_effort_deadline_seconds, best_effort=True)
    inter = parse({"prompt": "hi", "slo": {"class": "interactive"}})
    assert inter.slo == LatencySLO(0.5, 0.05) and inter.slo_class == "interactive"
    batch = parse({"prompt": "hi"}, {"x-slo-class": "batch"})
    assert batch.slo == DeadlineSLO(600.0) and batch.slo_class == "batch"
    assert parse({"prompt": "hi", "slo": {"kind": "deadline"}}).slo == DeadlineSLO(
        DEFAULTS.deadline_seconds
    )


def test_compound_needs_program_id_and_keeps_its_place() -> None:
    p = parse(
        {
            "prompt": "hi",
            "slo": {
                "kind": "compound",
                "program_id": "p1",
                "stage": 2,
                "stages": 3,
                "parent_ids": ["a", "b"],
            },
        }
    )
    assert p.slo == CompoundSLO(DEFAULTS.compound_seconds_per_stage * 3)
    assert p.program is not None and p.program.stage == 2 and p.program.parent_ids == ("a", "b")
    assert bad_param({"prompt": "hi", "slo": {"kind": "compound"}}) == "slo.program_id"


@pytest.mark.parametrize(
    ("body", "headers", "param"),
    [
        ({"prompt": "hi", "slo": {"ttft_ms": -5}}, {}, "slo.ttft_ms"),
        ({"prompt": "hi", "slo": {"tbt_ms": "fast"}}, {}, "slo.tbt_ms"),
        ({"prompt": "hi", "slo": {"deadline_s": 0}}, {}, "slo.deadline_s"),
        ({"prompt": "hi", "slo": {"kind": "urgent"}}, {}, "slo.kind"),
        ({"prompt": "hi", "slo": {"class": "gold"}}, {}, "slo.class"),
        ({"prompt": "hi", "slo": {"surprise": 1}}, {}, "slo.surprise"),
        ({"prompt": "hi"}, {"x-slo-ttft-ms": "soon"}, "x-slo-ttft-ms"),
        ({"prompt": "hi"}, {"x-slo-tpot-ms": "-1"}, "x-slo-tpot-ms"),
        ({"prompt": "hi"}, {"x-slo-class": "gold"}, "x-slo-class"),
        ({"prompt": "hi", "max_tokens": 0}, {}, "max_tokens"),
        ({"prompt": "hi", "max_tokens": "ten"}, {}, "max_tokens"),
        ({"prompt": "hi", "stream": "maybe"}, {}, "stream"),
        ({"prompt": "hi", "priority": 5}, {}, "priority"),
        ({"prompt": "hi"}, {"x-llm-d-slo-ttft-ms": "soon"}, "x-llm-d-slo-ttft-ms"),
        ({"prompt": "hi"}, {"x-gateway-inference-objective": "gold"},
         "x-gateway-inference-objective"),
        ({"prompt": ""}, {}, "prompt"),
        ({"prompt": ["a", "b"]}, {}, "prompt"),
        ({}, {}, "prompt"),
    ],
)
def test_invalid_fields_are_named(
    body: dict[str, object], headers: dict[str, str], param: str
) -> None:
    assert bad_param(body, headers) == param


def test_chat_body_validation() -> None:
    p = parse(
        {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 9},
        endpoint="chat",
    )
    assert p.messages == [{"role": "user", "content": "hi"}] and p.max_tokens == 9
    assert bad_param({"messages": []}, endpoint="chat") == "messages"
    assert bad_param({"messages": [{"content": "x"}]}, endpoint="chat") == "messages.0.role"
    assert bad_param([1, 2], endpoint="chat") == "body"


def test_sampling_parameters_pass_through() -> None:
    p = parse(
        {
            "prompt": [1, 2, 3],
            "temperature": 0,
            "seed": 3,
            "ignore_eos": True,
            "user": "u",
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    assert p.prompt_ids == [1, 2, 3]
    assert p.sampling == {"temperature": 0, "seed": 3, "ignore_eos": True}
    assert p.stream and p.include_usage


def test_resolve_slo_without_anything_is_best_effort() -> None:
    slo, label, program = resolve_slo(None, {}, SLODefaults())
    assert slo.kind is SLOKind.BEST_EFFORT and label == "default" and program is None


def test_config_watcher_applies_valid_changes_and_keeps_last_good(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(
        dump_policy_yaml(load_policy({"scheduler": {"cutoff": {"mode": "fixed", "value": 0.9}}}))
    )
    applied: list[SLOPolicySpec] = []
    results: list[str] = []
    watcher = ConfigWatcher(path, applied.append, results.append)
    assert watcher.spec.scheduler.cutoff.value == 0.9
    assert not watcher.poll()  # unchanged
    path.write_text(
        "scheduler:\n  cutoff:\n    mode: fixed\n    value: 0.5\nfairness:\n  weight: 0.3\n"
    )
    assert watcher.poll()
    assert applied[-1].scheduler.cutoff.value == 0.5 and applied[-1].fairness.weight == 0.3
    path.write_text("scheduler:\n  cutoff:\n    value: 7\n")  # p must be in (0, 1]
    assert not watcher.poll()
    assert results == ["ok", "error"]
    assert watcher.spec.scheduler.cutoff.value == 0.5
    assert watcher.last_error is not None and "scheduler.cutoff.value" in watcher.last_error
    path.write_text("scheduler: [unclosed\n")
    assert not watcher.poll() and "cannot read" in (watcher.last_error or "")
    assert len(applied) == 1


def test_config_watcher_rejects_empty_unknown_and_non_utf8_files(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("scheduler:\n  cutoff:\n    mode: fixed\n    value: 0.6\n")
    results: list[str] = []
    watcher = ConfigWatcher(path, lambda spec: None, results.append,
                            validate=lambda spec: make_policy(spec))
    path.write_text("")
    assert not watcher.poll() and watcher.last_error is None  # maybe mid-write: next poll
    assert not watcher.poll() and "empty" in (watcher.last_error or "")
    path.write_bytes(b"scheduler:\n  policy: gmax\n\xff\n")
    assert not watcher.poll() and "utf-8" in (watcher.last_error or "")
    path.write_text("scheduler:\n  policy: nope\n")
    assert not watcher.poll() and "nope" in (watcher.last_error or "")
    assert results == ["error", "error", "error"]
    assert watcher.spec.scheduler.cutoff.value == 0.6 and watcher.spec.scheduler.policy == "gmax"


def test_tenant_keys_fail_closed_and_never_raise(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.yaml"
    keys = TenantKeys(SidecarSettings(api_keys_file=keys_file))
    for content in ("", "team-a: [\n", "[1, 2]\n", "team-a: {nested: map}\n"):
        keys_file.write_text(content)
        keys.rebuild(SLOPolicySpec())
        assert keys.enabled and keys.unavailable is not None and keys.error, content
    keys_file.unlink()
    keys.rebuild(SLOPolicySpec())
    assert keys.enabled and "cannot read" in (keys.unavailable or "")
    keys_file.write_text("team-a: key-a\n")
    keys.rebuild(SLOPolicySpec())
    assert keys.unavailable is None and keys.tenant_of("key-a") == "team-a"


def test_tenant_keys_from_flags_file_and_mounted_secrets(tmp_path: Path) -> None:
    (tmp_path / "keys.yaml").write_text("team-b: [kb1, kb2]\n")
    (tmp_path / "secrets" / "team-c-key").mkdir(parents=True)
    (tmp_path / "secrets" / "team-c-key" / "api-key").write_text("kc\n")
    (tmp_path / "secrets" / "team-d-key").write_text("kd")  # the operator's one Secret
    spec = load_policy(
        {
            "fairness": {
                "tenants": [
                    {"name": "team-c", "apiKeySecret": "team-c-key"},
                    {"name": "team-d", "apiKeySecret": "team-d-key"},
                ]
            }
        }
    )
    keys = TenantKeys(
        SidecarSettings(
            api_keys={"ka": "team-a"},
            api_keys_file=tmp_path / "keys.yaml",
            keys_dir=tmp_path / "secrets",
        )
    )
    assert not keys.enabled
    keys.rebuild(spec)
    assert keys.enabled
    assert [keys.tenant_of(k) for k in ("ka", "kb2", "kc", "kd", "nope")] == [
        "team-a",
        "team-b",
        "team-c",
        "team-d",
        None,
    ]


def test_requests_without_slo_fields_get_the_tenants_default_class() -> None:
    spec = load_policy({
        "sloDefaults": {
            "classes": [{"name": "chat", "kind": "latency", "ttftSeconds": 1.5, "tbtSeconds": 0.2},
                        {"name": "batch", "kind": "deadline", "deadlineSeconds": 300}],
            "defaultClass": "batch",
        },
        "fairness": {"tenants": [{"name": "app", "defaultClass": "chat"}]},
    })
    defaults = spec.slo_defaults
    mine = parse_request("completions", {"prompt": "hi"}, {}, defaults,
                         spec.fairness.default_class_of("app"))
    assert mine.slo == LatencySLO(1.5, 0.2) and mine.slo_class == "chat"
    other = parse_request("completions", {"prompt": "hi"}, {}, defaults,
                          spec.fairness.default_class_of("someone-else"))
    assert other.slo == DeadlineSLO(300.0) and other.slo_class == "batch"
    # any SLO field given: the request's own SLO, not the default class
    own = parse_request("completions", {"prompt": "hi", "slo": {"deadline_s": 9}}, {}, defaults,
                        "chat")
    assert own.slo == DeadlineSLO(9.0) and own.slo_class == "default"
    problems = load_policy({"model": {"name": "m"}, "sloDefaults": {"defaultClass": "nope"}}
                           ).cross_field_problems()
    assert problems == ["sloDefaults.defaultClass: 'nope' is not in sloDefaults.classes"]


def test_a_simulator_only_setting_is_said_in_the_log_not_silently_ignored() -> None:
    assert simulator_only(SLOPolicySpec()) == []
    said = simulator_only(load_policy({"scheduler": {"batchConstructor": True}}))
    assert len(said) == 1 and "batchConstructor" in said[0]
