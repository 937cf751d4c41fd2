"""``jitserve up`` with a port taken fails before it starts anything, naming the flag."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from jitserve.devstack.vllm import free_port


def _up(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jitserve.cli", "up", "--log-dir",
                           str(tmp_path / "logs"), *flags],
                          capture_output=True, text=True, timeout=120)


def test_a_taken_port_is_refused_before_vllm_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = _up(tmp_path, "--port", str(port), "--vllm-port", str(free_port()),
                  "--analyzer-port", str(free_port()))
        assert out.returncode == 2, out.stderr
        assert f"port {port}" in out.stderr and "pass --port PORT" in out.stderr
        assert "Traceback" not in out.stderr
        assert "waiting for vLLM" not in out.stdout  # nothing was started
        assert not list((tmp_path / "logs").glob("vllm*"))


def test_each_port_names_its_own_flag(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = _up(tmp_path, "--port", str(free_port()), "--vllm-port", str(free_port()),
                  "--analyzer-port", str(port))
        assert out.returncode == 2 and "pass --analyzer-port PORT" in out.stderr
        same = free_port()
        out = _up(tmp_path, "--port", str(same), "--vllm-port", str(same))
        assert out.returncode == 2 and "planned twice" in out.stderr
