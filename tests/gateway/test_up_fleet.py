"""``jitserve up --replicas 2`` (the real CLI): two sidecars with admin ports, one analyzer
and the gateway in front, here with ``--backend`` the session's shared vLLM (two tiny
vLLMs at once are too heavy for the suite's machine; ``--replicas N`` without
``--backend`` starts N of them the same way ``jitserve up`` starts one). It prints the
gateway's endpoint and a curl line, serves through both replicas, and SIGTERM stops every
child."""

from __future__ import annotations

import signal
import socket
import sys
import time
from pathlib import Path

from jitserve.devstack import vllm as vl
from tests.support.gateway import until_every_replica_chosen
from tests.support.http import get_json, stream
from tests.support.processes import alive
from tests.support.waiting import body_timeout, wait_until

pytestmark = body_timeout(900)


def bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_base(*offsets: int) -> int:
    """A free port whose ``offsets`` are free too (``up`` derives the replicas' and admin
    ports from its base ports; another worker's server may hold one of them)."""
    while True:
        base = vl.free_port()
        if base + max(offsets) < 65536 and all(bindable(base + o) for o in offsets):
            return base


def test_up_with_two_replicas(vllm_url: str, tmp_path: Path) -> None:
    port, replica_port = free_base(0, 1000), free_base(0, 1, 1000, 1001)
    analyzer_port = vl.free_port()
    out_path = tmp_path / "up.out"
    out = out_path.open("wb")
    up = vl.start_process([
        sys.executable, "-m", "jitserve.cli", "up", "--replicas", "2", "--backend", vllm_url,
        "--port", str(port), "--replica-port", str(replica_port),
        "--analyzer-port", str(analyzer_port), "--log-dir", str(tmp_path / "logs"),
        "--placement", "round-robin", "--timeout", "600"], out)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600  # against a hang only
        while "jitserve is up" not in out_path.read_text():
            assert up.poll() is None, out_path.read_text()
            assert time.monotonic() < deadline, out_path.read_text()
            time.sleep(0.2)
        printed = out_path.read_text()
        assert f"jitserve is up: {url}, the gateway in front of 2 replicas" in printed
        assert "curl -N" in printed
        assert (f"replica 1: sidecar http://127.0.0.1:{replica_port + 1} (admin "
                f"http://127.0.0.1:{replica_port + 1001}) -> vLLM {vllm_url}") in printed
        children = [int(line.split("pid ")[1].split(",")[0])
                    for line in printed.splitlines() if ", log " in line]
        assert len(children) == 4  # analyzer, 2 sidecars, gateway

        def both_in_picks() -> list[str]:
            status, ready = get_json(f"http://127.0.0.1:{port + 1000}/ready")
            names: list[str] = ready["replicas"] if status == 200 else []
            return names if len(names) == 2 else []

        # up prints once both are in the gateway's picks, or after 30 s; and a report
        # late on a busy machine (the gateway's 1 s max age) hides a replica a while
        replicas = wait_until("both replicas in the gateway's picks", both_in_picks, 120)
        assert set(replicas) == {f"127.0.0.1:{replica_port + i}" for i in (0, 1)}

        def one_stream() -> str:
            result = stream(url, {"prompt": "hello world", "max_tokens": 6, "ignore_eos": True})
            assert result.status == 200 and len(result.token_ids) == 6, result
            return str(result.headers["x-jitserve-replica"])

        # round-robin: one each, unless a late report hides a replica a while
        assert until_every_replica_chosen(one_stream, replicas) == set(replicas)
    finally:
        up.send_signal(signal.SIGTERM)
        code = up.wait(60)
        out.close()
    assert code == 0, out_path.read_text()
    assert "stopping gateway" in out_path.read_text()
    wait_until("up's children to exit", lambda: not [p for p in children if alive(p)], 60)
