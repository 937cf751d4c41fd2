"""Session fixtures every folder may use.

``vllm_url``: the one shared real vLLM of the session (tests/support/vllm.py). The tests
that use it are grouped (``xdist_group("vllm")``, added below) so that under
pytest-xdist one worker owns it and runs them one after another: they watch one
engine's queue, and two engines would only fight over the same two cores.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.vllm import shared_vllm_url

SHARED_FIXTURE_GROUPS = {"vllm_url": "vllm", "cluster": "k8s", "own_vllm": "own-vllm",
                         "greedy_vllm": "greedy-vllm", "fleet_vllm": "fleet-vllm", "fuzzed": "fuzz"}
"""A test that uses one of these fixtures (the session's vLLM, its API server, the fault
tests' private vLLM, the fuzz module's sidecar: its last test counts the cases the others
ran) runs in the worker that owns it; a test that uses more than one goes with the
first."""


@pytest.fixture(scope="session")
def vllm_url() -> Iterator[str]:
    yield from shared_vllm_url()


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        for fixture, group in SHARED_FIXTURE_GROUPS.items():
            if fixture in fixtures:
                item.add_marker(pytest.mark.xdist_group(group))
                break
