"""The replica report's codec: a round trip keeps every field; bad input names the field."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from jitserve.placement.base import ReplicaReport
from jitserve.placement.wire import report_from_json, report_to_json
from jitserve.slo import SLOKind

REPORT = ReplicaReport(
    replica="10.0.0.7:8080", ready=True, at_s=1_700_000_000.5, max_running=8, running=6,
    waiting=3, waiting_by_kind={SLOKind.LATENCY: 2, SLOKind.COMPOUND: 1},
    admit_priority=0.25, decode_s=0.041, prefill_s=2e-4, tokens_per_s=180.5, kv_usage=0.37,
    outstanding_tokens=4210, programs=frozenset({"t1/p1", "default/agent-9"}), shedding=True,
    token_s=2e-4, prefill_tokens=300)


def test_round_trip_keeps_every_field() -> None:
    doc = report_to_json(REPORT)
    assert set(doc) == {f.name for f in dataclasses.fields(ReplicaReport)}
    assert report_from_json(doc) == REPORT


def test_optional_fields_default_and_unknown_ones_are_ignored() -> None:
    doc = {"replica": "a:1", "ready": False, "at_s": 1.0, "max_running": 4, "running": 0,
           "waiting": 0, "from_a_newer_sidecar": [1, 2]}
    r = report_from_json(doc)
    assert r == ReplicaReport("a:1", False, 1.0, 4, 0, 0)


@pytest.mark.parametrize(("field", "value", "named"), [
    ("running", -1, "running"),
    ("running", 1.5, "running"),
    ("running", True, "running"),
    ("waiting", None, "waiting"),
    ("ready", "yes", "ready"),
    ("kv_usage", 1.5, "kv_usage"),
    ("decode_s", float("nan"), "decode_s"),
    ("tokens_per_s", "fast", "tokens_per_s"),
    ("replica", "", "replica"),
    ("waiting_by_kind", {"urgent": 1}, "waiting_by_kind.urgent"),
    ("waiting_by_kind", {"latency": -2}, "latency"),
    ("waiting_by_kind", [1], "waiting_by_kind"),
    ("programs", "t/p", "programs"),
    ("programs", [1], "programs"),
    ("shedding", 1, "shedding"),
    ("prefill_tokens", -3, "prefill_tokens"),
    ("token_s", "x", "token_s"),
])
def test_bad_field_is_named(field: str, value: Any, named: str) -> None:
    doc = report_to_json(REPORT)
    doc[field] = value
    with pytest.raises(ValueError, match=rf"replica report: {named}\b"):
        report_from_json(doc)


def test_not_an_object() -> None:
    with pytest.raises(ValueError, match="body"):
        report_from_json([1, 2])
    with pytest.raises(ValueError, match="missing"):
        report_from_json({"replica": "a:1"})
