"""Events for a policy's state changes: one per changed condition, warnings for bad news,
none for a status that did not change; an Event that cannot be posted fails nothing."""

from __future__ import annotations

from typing import Any

from jitserve.operator import events
from jitserve.operator.kube import KubeError


def _status(ready: tuple[str, str], degraded: tuple[str, str] = ("False", "AsExpected"),
            p: float | None = None) -> dict[str, Any]:
    conds = [{"type": "Ready", "status": ready[0], "reason": ready[1], "message": "m"},
             {"type": "Degraded", "status": degraded[0], "reason": degraded[1], "message": ""}]
    return {"conditions": conds, **({"effectiveCutoff": p} if p is not None else {})}


def test_each_changed_condition_is_one_event() -> None:
    found = events.changes(_status(("False", "WaitingForReplicas")), _status(("True", "Available")))
    assert [(e.type, e.reason) for e in found] == [("Normal", "Available")]
    assert "Ready=True" in found[0].message and "was False, WaitingForReplicas" in found[0].message


def test_bad_news_is_a_warning_and_no_change_is_silent() -> None:
    ready = _status(("True", "Available"))
    assert events.changes(ready, ready) == []
    degraded = events.changes(ready, _status(("True", "Available"), ("True", "ApplyFailed")))
    assert [(e.type, e.reason) for e in degraded] == [("Warning", "ApplyFailed")]
    lost = events.changes(ready, _status(("False", "WaitingForReplicas")))
    assert [(e.type, e.reason) for e in lost] == [("Warning", "WaitingForReplicas")]


def test_first_status_is_normal_news_unless_degraded() -> None:
    found = events.changes({}, _status(("False", "NoDeployment")))
    assert {(e.type, e.reason) for e in found} == {("Normal", "NoDeployment"),
                                                  ("Normal", "AsExpected")}


def test_a_move_of_p_is_an_event_only_past_the_step() -> None:
    base = _status(("True", "Available"), p=0.95)
    assert events.changes(base, _status(("True", "Available"), p=0.93)) == []
    moved = events.changes(base, _status(("True", "Available"), p=0.80))
    assert [e.reason for e in moved] == ["CutoffMoved"] and "0.950 -> 0.800" in moved[0].message


class Refusing:
    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        raise KubeError(403, "events is forbidden")


def test_an_event_that_cannot_be_posted_is_logged_not_raised() -> None:
    policy = {"metadata": {"name": "chat", "namespace": "team-a", "uid": "u"}}
    change = events.Change("Normal", "Available", "Ready=True")
    obj = events.event_object(policy, change, "2026-12-04T00:00:00Z")
    assert obj["involvedObject"]["name"] == "chat" and obj["metadata"]["generateName"] == "chat."
    events.post(Refusing(), policy, [change], "2026-12-04T00:00:00Z")  # type: ignore[arg-type]
