"""The tests' launchers survive the race every "free port" has: another process binds
the port between the check and the child's bind (ci-fresh: a gateway test's sidecar
exited 2, address already in use). Each launcher's first port is taken here on purpose."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import sidecar as launcher
from tests.support.gateway import GatewayProcess
from tests.support.ports import DeadPort


@pytest.fixture
def first_port_taken(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """The next free port handed out is one another socket listens on."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    real = launcher.vl.free_port
    ports = iter([port])
    monkeypatch.setattr(launcher.vl, "free_port", lambda: next(ports, None) or real())
    yield port
    taken.close()


def test_a_sidecar_whose_port_was_taken_starts_again_on_another(
        tmp_path: Path, first_port_taken: int) -> None:
    config = tmp_path / "policy.yaml"
    config.write_text("{}\n")
    with DeadPort() as backend:
        s = launcher.SidecarProcess(backend.url, config=config)
        try:
            s.wait_up()
            assert s.port != first_port_taken
            assert b"address already in use" in s.log_path.read_bytes()
        finally:
            s.close()


def test_the_gateway_launcher_does_the_same(tmp_path: Path, first_port_taken: int) -> None:
    with DeadPort() as replica:

        class Dead:  # a sidecar that is not there: the gateway serves, with no picks
            url, admin_url, port = replica.url, replica.url, replica.port

        gw = GatewayProcess([Dead()], tmp_path / "gateway.log")
        try:
            gw.wait_ready(replicas=0)
            assert first_port_taken not in (gw.port, gw.admin_port)
            assert b"address already in use" in gw.log_path.read_bytes()
        finally:
            gw.close()
