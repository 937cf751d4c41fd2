"""Fixtures of the sidecar tests: ``sidecar``, a factory of real sidecar processes in
front of the session's shared vLLM (tests/conftest.py ``vllm_url``), each with its own
policy file, each started on an idle vLLM and stopped after the test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.sidecar import Factory, SidecarProcess, make_factory
from tests.support.stall import StallRelay


@pytest.fixture
def sidecar(vllm_url: str, tmp_path: Path) -> Iterator[Factory]:
    started: list[SidecarProcess] = []
    yield make_factory(vllm_url, tmp_path, started)
    for s in started:
        s.close()


@pytest.fixture
def held(vllm_url: str, tmp_path: Path) -> Iterator[tuple[StallRelay, Factory]]:
    """Sidecars in front of the shared vLLM through a :class:`StallRelay`: the test holds
    vLLM's work (``relay.hold()``, or ``relay.hold_after(1)`` past each stream's first
    event) to keep a stream open for as long as it needs."""
    started: list[SidecarProcess] = []
    with StallRelay(vllm_url) as relay:
        yield relay, make_factory(relay.url, tmp_path, started)
        for s in started:
            s.close()
