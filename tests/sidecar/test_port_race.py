"""The tests' sidecar launcher survives the race every "free port" has: another process
binds the port between the check and the sidecar's bind (ci-fresh: a gateway test's
sidecar exited 2, address already in use)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import sidecar as launcher
from tests.support.ports import DeadPort


def test_a_sidecar_whose_port_was_taken_starts_again_on_another(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    real = launcher.vl.free_port
    ports: Iterator[int] = iter([taken.getsockname()[1]])
    monkeypatch.setattr(launcher.vl, "free_port", lambda: next(ports, None) or real())
    config = tmp_path / "policy.yaml"
    config.write_text("{}\n")
    with DeadPort() as backend:
        s = launcher.SidecarProcess(backend.url, config=config)
        try:
            s.wait_up()
            assert s.port != taken.getsockname()[1]
            assert b"address already in use" in s.log_path.read_bytes()
        finally:
            s.close()
            taken.close()
