"""Which cores each local vLLM of ``jitserve up --replicas N`` gets (owner: devstack)."""

from __future__ import annotations

import os

import pytest

from jitserve.devstack.fleet import engine_cores, parse_cores
from jitserve.errors import CLIError


def test_each_engine_gets_its_share_of_the_pool() -> None:
    assert [engine_cores(i, 2, [0, 1, 2, 3]) for i in range(2)] == [{0, 1}, {2, 3}]
    assert [engine_cores(i, 3, [0, 1, 2, 3]) for i in range(3)] == [{0}, {1}, {2}]


def test_fewer_cores_than_engines_share_the_pool_or_are_left_alone() -> None:
    assert engine_cores(0, 2, [1]) == engine_cores(1, 2, [1]) == {1}
    if len(os.sched_getaffinity(0)) < 64:
        assert engine_cores(0, 64) == set()


def test_core_lists_parse_and_bad_ones_name_the_flag() -> None:
    assert parse_cores("0") == [0]
    assert parse_cores("0-0,0") == [0]
    for bad in ("x", "1-", "", f"{(os.cpu_count() or 1) + 5}"):
        with pytest.raises(CLIError, match="--engine-cores"):
            parse_cores(bad)
