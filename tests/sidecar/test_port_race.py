"""The tests' launchers survive the race every "free port" has: another process binds
the port between the check and the child's bind (ci-fresh: a gateway test's sidecar
exited 2, address already in use). Each launcher's first port is taken here on purpose."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


class _OnlyHealth(BaseHTTPRequestHandler):
    """Another worker's server: a fake engine answers /health and nothing else."""

    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(b"{}" if self.path == "/health" else b"404: Not Found")

    def log_message(self, *args: object) -> None:
        pass


def test_a_foreign_server_on_the_admin_port_is_not_taken_for_the_gateway(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ci-fresh: the gateway lost its first port, another worker's fake engine held its
    admin port and answered /health, and the launcher took that for the gateway."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    foreign = ThreadingHTTPServer(("127.0.0.1", 0), _OnlyHealth)
    threading.Thread(target=foreign.serve_forever, daemon=True).start()
    handed = iter([taken.getsockname()[1], foreign.server_address[1]])
    real = launcher.vl.free_port
    monkeypatch.setattr(launcher.vl, "free_port", lambda: next(handed, None) or real())
    try:
        with DeadPort() as replica:

            class Dead:
                url, admin_url, port = replica.url, replica.url, replica.port

            gw = GatewayProcess([Dead()], tmp_path / "gateway.log")
            try:
                gw.wait_ready(replicas=0)
                assert foreign.server_address[1] not in (gw.port, gw.admin_port)
                assert gw.info().get("replicas") == []
            finally:
                gw.close()
    finally:
        foreign.shutdown()
        taken.close()
