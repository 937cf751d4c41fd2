"""Fixtures of the gateway tests: ``stack``, a factory of N real sidecar processes (admin
ports on) in front of the given vLLMs and one real ``jitserve gateway`` process in front
of them, all stopped after the test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.gateway import GatewayProcess
from tests.support.sidecar import SidecarProcess, wait_backend_idle


@dataclass
class Stack:
    sidecars: list[SidecarProcess]
    gateway: GatewayProcess

    def name(self, i: int) -> str:
        return self.gateway.names[i]

    def sidecar_of(self, replica: str) -> SidecarProcess:
        return self.sidecars[self.gateway.names.index(replica)]


StackFactory = Callable[..., Stack]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[StackFactory]:
    """``stack(backends, policy=None, gateway_args=(), ready=True, **sidecar settings)``:
    one sidecar per backend URL, then the gateway once every sidecar is in its picks."""
    started: list[Any] = []

    def make(backends: list[str], policy: dict[str, Any] | None = None, *,
             gateway_args: tuple[str, ...] = (), ready: bool = True,
             **settings: Any) -> Stack:
        sidecars = []
        for url in backends:
            wait_backend_idle(url)
            config = tmp_path / f"policy-{len(started)}.yaml"
            config.write_text(yaml.safe_dump(policy or {}))
            settings.setdefault("admin_port", True)
            s = SidecarProcess(url, config=config, **settings)
            started.append(s)
            sidecars.append(s.wait_ready() if ready else s.wait_up())
        gateway = GatewayProcess(sidecars, tmp_path / f"gateway-{len(started)}.log",
                                 extra_args=list(gateway_args))
        started.append(gateway)
        gateway.wait_ready(replicas=len(sidecars) if ready else 0)
        return Stack(sidecars, gateway)

    yield make
    for p in reversed(started):
        p.close()
