"""The batch shape (B = vLLM's --max-num-seqs = the sidecar's --max-running, the engine
queue) and tensor parallelism, derived from a policy's vLLM arguments."""

from __future__ import annotations

import pytest

from jitserve.policy import (
    GPU_MAX_NUM_SEQS,
    ArgsError,
    batch_shape,
    default_engine_queue,
    flag_value,
    load_policy,
    parallel_args,
)


def test_a_user_max_num_seqs_is_b_for_both_and_the_default_fills_in_otherwise() -> None:
    default = batch_shape(["--dtype", "bfloat16"], default_max_num_seqs=GPU_MAX_NUM_SEQS)
    assert (default.max_num_seqs, default.engine_queue) == (256, 128)
    assert default.vllm_args(["--dtype", "bfloat16"])[-2:] == ["--max-num-seqs", "256"]
    assert default.sidecar_args() == ["--max-running", "256", "--engine-queue", "128"]
    for args in (["--max-num-seqs", "64"], ["--max-num-seqs=64"], ["--max-num-seqs", "8",
                                                                   "--max-num-seqs", "64"]):
        shape = batch_shape(args, default_max_num_seqs=GPU_MAX_NUM_SEQS)
        assert shape.max_num_seqs == 64 and shape.engine_queue == 32
        assert shape.vllm_args(args) == args  # the user's flag stays as written
    assert batch_shape([], default_max_num_seqs=3, engine_queue=0).engine_queue == 0
    assert default_engine_queue(1) == 2


@pytest.mark.parametrize(
    "args", [["--max-num-seqs"], ["--max-num-seqs", "x"], ["--max-num-seqs=0"]]
)
def test_a_malformed_max_num_seqs_is_refused_naming_the_flag(args: list[str]) -> None:
    with pytest.raises(ArgsError, match="--max-num-seqs"):
        batch_shape(args, default_max_num_seqs=16)


def test_tensor_parallelism_follows_the_gpus_unless_the_user_sizes_cover_them() -> None:
    assert parallel_args([], 0) == [] and parallel_args([], 1) == []
    assert parallel_args([], 4) == ["--tensor-parallel-size", "4"]
    assert parallel_args(["--pipeline-parallel-size", "2"], 4) == ["--tensor-parallel-size", "2"]
    assert parallel_args(["--tensor-parallel-size", "2", "--pipeline-parallel-size=2"], 4) == []
    with pytest.raises(ArgsError, match=r"model\.gpus"):
        parallel_args(["--tensor-parallel-size", "4"], 2)
    with pytest.raises(ArgsError, match="does not divide"):
        parallel_args(["--pipeline-parallel-size", "3"], 4)
    assert flag_value(["--a", "1", "--a=2"], "--a") == "2"


def test_the_model_spec_carries_the_shape_and_names_the_field_when_args_are_bad() -> None:
    spec = load_policy({"model": {"name": "m", "gpus": 2, "args": ["--max-num-seqs", "32"]}})
    assert spec.model.vllm_args() == [
        "--tensor-parallel-size", "2", "--max-num-seqs", "32"
    ]
    assert spec.model.batch_shape().sidecar_args() == [
        "--max-running", "32", "--engine-queue", "16"
    ]
    bad = load_policy({"model": {"name": "m", "gpus": 2, "args": ["--tensor-parallel-size=3"]}})
    (problem,) = bad.cross_field_problems()
    assert problem.startswith("model.args: --tensor-parallel-size 3")
    assert bad.webhook_problems() == [problem] and bad.cel_problems() == []
