"""The policy house as docs/design.md draws it is the code's: each scheduler's stages, in
order, under the default settings; and a new scheduler is a key plus a profile entry
(docs/scheduling.md's example, run as written)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from jitserve.policy import SLOPolicySpec, load_policy
from jitserve.scheduling.registry import BASELINES, make_policy, profiles, scheduler_names
from tests.sidecar.test_dispatcher import drive_like_the_simulator, drive_the_dispatcher, workload
from tests.support.requests import live

DOCS = Path(__file__).resolve().parents[1] / "docs"


def drawing(by_name: dict[str, list[str]]) -> str:
    """One line per scheduler: its name, then its stages joined by arrows (``-`` for
    none: keyed once, at arrival)."""
    width = max(len(name) for name in by_name)
    return "".join(
        f"{name:<{width}}  {' -> '.join(stages) or '-'}\n" for name, stages in by_name.items()
    )


def first_block(page: str, heading: str, lang: str = "") -> str:
    """The first fenced block (of ``lang``) after ``heading`` in docs/``page``."""
    text = (DOCS / page).read_text()
    found = re.search(rf"```{lang}\n(.*?)```", text[text.index(heading) :], re.S)
    assert found is not None, f"docs/{page}: no block under {heading!r}"
    return found.group(1)


def test_the_drawing_of_the_house_is_the_code() -> None:
    assert first_block("design.md", "## The policy house") == drawing(profiles(SLOPolicySpec()))


def test_mechanisms_switch_gmax_stages() -> None:
    off = load_policy({"scheduler": {"mechanisms": {"preemption": False,
                                                    "prefillPacing": False}}})
    assert profiles(off)["gmax"] == ["unreachable", "score", "group", "sequence", "overdue"]


@pytest.mark.parametrize("name", ["srpt", "srpt-ac"])
def test_the_example_scheduler_runs_in_the_simulator_and_the_sidecar_alike(name: str) -> None:
    code = first_block("scheduling.md", "## A new scheduler", "python")
    assert len(code.splitlines()) <= 25
    try:
        exec(compile(code, "docs/scheduling.md", "exec"), {})
        assert name in scheduler_names()
        spec = load_policy({"scheduler": {"policy": name, "frameSteps": 4}})
        policy = make_policy(spec)
        assert policy.name == name and type(policy).__name__ == "ShortestRemainingTime"
        long, short = live("long", prompt=3000, output=500), live("short", prompt=20, output=10)
        for r in (long, short):
            policy.enqueue(r, 0.0)
        assert policy.pop_next(0.0, 0) is short  # least engine time left first
        reference = drive_like_the_simulator(spec, batch=2, ticks=120)
        sidecar = asyncio.run(drive_the_dispatcher(spec, batch=2, ticks=120))
    finally:
        BASELINES.pop("srpt", None)
    assert sidecar.dispatched == reference.dispatched
    assert sidecar.preempted == reference.preempted
    assert sidecar.retired == reference.retired
    assert sidecar.outcomes == reference.outcomes
    assert len(reference.outcomes) == len(workload())
