"""How jitserve up starts vLLM with the in-engine scheduler (devstack.vllm), no vLLM run."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

import jitserve
from jitserve.devstack import up
from jitserve.devstack import vllm as vl


def test_a_rule_adds_the_scheduler_class_and_its_environment(tmp_path: Path) -> None:
    cmd = vl.vllm_command(Path("/py"), "m", 8000, engine_rule="sliding")
    i = cmd.index("--scheduler-cls")
    assert cmd[i + 1] == "jitserve.engine.vllm_scheduler.SlidingScheduler"
    env = vl.engine_scheduler_env("sliding", tmp_path / "steps.jsonl")
    src = str(Path(jitserve.__file__).resolve().parents[1])
    assert env["JITSERVE_ENGINE_BUDGET_RULE"] == "sliding"
    assert env["PYTHONPATH"].split(":")[0] == src  # this clone first
    assert env["JITSERVE_ENGINE_STEP_LOG"] == str(tmp_path / "steps.jsonl")


def test_no_rule_leaves_vllm_alone_and_a_wrong_one_is_refused() -> None:
    assert "--scheduler-cls" not in vl.vllm_command(Path("/py"), "m", 8000)
    assert vl.engine_scheduler_env("none") == {} and vl.engine_scheduler_flags(None) == []
    with pytest.raises(ValueError, match="unknown engine budget rule"):
        vl.engine_scheduler_flags("bogus")
    async_cmd = vl.vllm_command(Path("/py"), "m", 8000, extra=["--async-scheduling"],
                                engine_rule="greedy")
    assert "jitserve.engine.vllm_scheduler.AsyncSlidingScheduler" in async_cmd


def test_jitserve_up_takes_the_rule() -> None:
    parser = argparse.ArgumentParser()
    up.register(parser.add_subparsers())
    assert parser.parse_args(["up", "--engine-scheduler", "sliding"]).engine_scheduler == "sliding"
    assert parser.parse_args(["up"]).engine_scheduler == "none"
