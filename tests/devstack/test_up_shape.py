"""`jitserve up` derives B and the engine queue with the operator's own function: the same
policy gives the same vLLM --max-num-seqs and sidecar --max-running / --engine-queue."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from jitserve.devstack.up import UP_MAX_NUM_SEQS, up_batch_shape
from jitserve.errors import CLIError
from jitserve.operator import builders as b
from jitserve.policy import load_policy


def _policy(tmp_path: Path, spec: dict[str, object]) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_up_and_the_operator_give_the_same_shape_for_the_same_policy(tmp_path: Path) -> None:
    spec = {"model": {"name": "m", "args": ["--max-num-seqs", "48"]},
            "sidecar": {"engineQueue": 5}}
    shape = up_batch_shape(_policy(tmp_path, spec), None, None)
    assert (shape.max_num_seqs, shape.engine_queue) == (48, 5)
    pod = b.build_pod_template(b.PolicyRef("p", "ns", "u"), load_policy(spec),
                               b.OperatorSettings())["spec"]["containers"]
    vllm_args, sidecar_args = pod[0]["args"], pod[1]["args"]
    assert vllm_args[vllm_args.index("--max-num-seqs") + 1] == "48"
    start = sidecar_args.index("--max-running")
    assert sidecar_args[start:start + 4] == shape.sidecar_args()


def test_up_flags_win_and_the_cpu_default_fills_in(tmp_path: Path) -> None:
    plain = _policy(tmp_path, {})
    shape = up_batch_shape(plain, None, None)
    assert (shape.max_num_seqs, shape.engine_queue) == (UP_MAX_NUM_SEQS, UP_MAX_NUM_SEQS // 2)
    given = up_batch_shape(_policy(tmp_path, {"model": {"args": ["--max-num-seqs=64"]}}), 8, 0)
    assert (given.max_num_seqs, given.engine_queue) == (8, 0)
    with pytest.raises(CLIError, match="--max-num-seqs"):
        up_batch_shape(_policy(tmp_path, {"model": {"args": ["--max-num-seqs", "x"]}}), None, None)


@pytest.mark.parametrize("flag", [False, True])
def test_up_passes_the_engine_queue_rule_to_its_sidecar(tmp_path: Path, flag: bool) -> None:
    from jitserve.cli import build_parser
    from jitserve.devstack.up import sidecar_command

    argv = ["up", "--backend", "http://127.0.0.1:1", *(["--engine-queue-unstarted"] * flag)]
    args = build_parser().parse_args(argv)
    config = _policy(tmp_path, {})
    cmd = sidecar_command(args, "http://127.0.0.1:1", config, up_batch_shape(config, None, 3), None)
    assert cmd[cmd.index("--engine-queue") + 1] == "3"
    assert ("--engine-queue-unstarted" in cmd) is flag
