"""``jitserve up`` with a port taken or a disk too full fails before it starts anything,
naming the flag or the path; so does ``scripts/setup-vllm.sh`` on a disk too small."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from jitserve.devstack.preflight import check_disk
from jitserve.devstack.vllm import free_port
from jitserve.errors import CLIError


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


def test_a_disk_too_full_is_refused_with_the_path_and_the_variable(tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    check_disk(tmp_path / "not" / "made" / "yet", free // 2, "jitserve up")
    with pytest.raises(CLIError, match="JITSERVE_CACHE") as err:
        check_disk(tmp_path / "cache", free + (1 << 40), "jitserve up")
    assert str(tmp_path / "cache") in str(err.value)


def test_setup_vllm_refuses_a_disk_too_small_before_it_installs(tmp_path: Path) -> None:
    script = Path(__file__).resolve().parents[2] / "scripts" / "setup-vllm.sh"
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                              "JITSERVE_CACHE": str(tmp_path / "cache"),
                              "JITSERVE_VLLM_DISK_GB": "1000000"})
    assert out.returncode == 1 and "1000000 GB needed" in out.stderr, out.stderr
    assert not (tmp_path / "cache" / "vllm-venv").exists()
