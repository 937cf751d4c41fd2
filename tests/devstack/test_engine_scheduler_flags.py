"""How jitserve up starts vLLM with the in-engine scheduler (devstack.vllm), no vLLM run."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

import jitserve
from jitserve.devstack import up
from jitserve.devstack import vllm as vl
from jitserve.policy import BudgetRule, SLOPolicySpec, dump_policy_yaml, load_policy


def test_a_rule_adds_the_scheduler_class_and_its_environment(tmp_path: Path) -> None:
    cmd = vl.vllm_command(Path("/py"), "m", 8000, engine_rule=BudgetRule.SLIDING)
    i = cmd.index("--scheduler-cls")
    assert cmd[i + 1] == "jitserve.engine.vllm_scheduler.SlidingScheduler"
    env = vl.engine_scheduler_env(BudgetRule.SLIDING, tmp_path / "steps.jsonl")
    src = str(Path(jitserve.__file__).resolve().parents[1])
    assert env["JITSERVE_ENGINE_BUDGET_RULE"] == "sliding"
    assert env["PYTHONPATH"].split(":")[0] == src  # this clone first
    assert env["JITSERVE_ENGINE_STEP_LOG"] == str(tmp_path / "steps.jsonl")


def test_the_fixed_rule_leaves_vllm_alone() -> None:
    assert "--scheduler-cls" not in vl.vllm_command(Path("/py"), "m", 8000)
    fixed = BudgetRule.FIXED
    assert vl.engine_scheduler_env(fixed) == {} and vl.engine_scheduler_flags(fixed) == []
    async_cmd = vl.vllm_command(Path("/py"), "m", 8000, extra=["--async-scheduling"],
                                engine_rule=BudgetRule.GREEDY)
    assert "jitserve.engine.vllm_scheduler.AsyncSlidingScheduler" in async_cmd


def test_jitserve_up_takes_the_rule_from_the_flag_else_the_policy(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    up.register(parser.add_subparsers())
    assert parser.parse_args(["up", "--budget-rule", "sliding"]).budget_rule == "sliding"
    assert parser.parse_args(["up", "--engine-scheduler", "greedy"]).budget_rule == "greedy"
    with pytest.raises(SystemExit):
        parser.parse_args(["up", "--budget-rule", "bogus"])
    assert parser.parse_args(["up"]).budget_rule is None
    config = tmp_path / "policy.yaml"
    config.write_text(dump_policy_yaml(load_policy({"scheduler": {"budgetRule": "sliding"}})))
    assert up.up_budget_rule(config, None) is BudgetRule.SLIDING
    assert up.up_budget_rule(config, "fixed") is BudgetRule.FIXED
    config.write_text(dump_policy_yaml(SLOPolicySpec()))
    assert up.up_budget_rule(config, None) is SLOPolicySpec().scheduler.budget_rule
