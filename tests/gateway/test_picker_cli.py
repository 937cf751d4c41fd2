"""``jitserve picker`` as users run it: the real CLI process, polling two real sidecars in
front of the session's real vLLM, driven over gRPC with Envoy's generated protos; and its
flag errors."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from jitserve.cli import main
from jitserve.devstack import vllm as vl
from jitserve.gateway.picker_wire import DESTINATION
from tests.support.picker import (
    connect,
    metadata_destination,
    request_body,
    request_headers,
    run,
    set_headers,
)
from tests.support.sidecar import SidecarProcess, make_factory
from tests.support.waiting import body_timeout, wait_until

pytestmark = body_timeout(600)


@pytest.mark.parametrize(("argv", "message"), [
    (["picker"], "name the replicas"),
    (["picker", "--replica", "nope"], "--replica"),
    (["picker", "--discover", "svc:8080:9090", "--placement", "nope"], "unknown placement"),
    (["picker", "--discover", "svc:8080:9090", "--port", "70000"], "--port"),
    (["picker", "--discover", "svc:8080:9090", "--max-body-bytes", "10"], "--max-body-bytes"),
])
def test_flag_errors_name_the_flag(argv: list[str], message: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


@pytest.fixture
def sidecars(vllm_url: str, tmp_path: Path) -> Iterator[list[SidecarProcess]]:
    started: list[SidecarProcess] = []
    make = make_factory(vllm_url, tmp_path, started)
    try:
        yield [make(admin_port=True), make(admin_port=True)]
    finally:
        for s in started:
            s.close()


def _health(target: str, service: str) -> int:
    with grpc.insecure_channel(target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5)
        return int(reply.status)


def _pick(target: str, headers: dict[str, str] | None = None) -> Any:
    async def scenario() -> Any:
        async with connect(target) as rpc:
            return await rpc.exchange(request_headers(extra=headers),
                                      request_body({"prompt": "hello", "max_tokens": 8}))
    return run(scenario())[0]


def _both(answer: Any) -> Any:
    """``answer`` when it names two endpoints (both sidecars polled), else None."""
    if answer.WhichOneof("response") != "request_headers":
        return None
    return answer if len(set_headers(answer)[DESTINATION].split(",")) == 2 else None


def test_the_picker_process_places_on_the_live_sidecars(sidecars: list[SidecarProcess],
                                                        tmp_path: Path) -> None:
    policy = tmp_path / "picker-policy.yaml"
    policy.write_text(yaml.safe_dump({"sloDefaults": {"classes": [
        {"name": "gold", "kind": "latency", "ttftSeconds": 1, "tbtSeconds": 0.2}]}}))
    port = vl.free_port()
    target = f"127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "jitserve.cli", "picker", "--host", "127.0.0.1", "--port",
           str(port), "--placement", "least-loaded", "--config", str(policy),
           "--drain-seconds", "5", "--log-level", "DEBUG"]
    for s in sidecars:
        cmd += ["--replica", f"{s.url},{s.admin_url}"]
    names = {f"127.0.0.1:{s.port}" for s in sidecars}
    log_path = tmp_path / "picker.log"
    with log_path.open("ab") as log:
        proc = vl.start_process(cmd, log)
    try:
        serving = health_pb2.HealthCheckResponse.SERVING
        wait_until("the picker is ready", lambda: _health(target, "readiness") == serving,
                   tolerate=(grpc.RpcError,))
        picked = wait_until("a pick over both sidecars",
                            lambda: _both(_pick(target, {"x-llm-d-slo-class": "gold"})))
        value = set_headers(picked)[DESTINATION]
        assert set(value.split(",")) == names and metadata_destination(picked) == value
        # the picker read --config: the class resolves to the policy's SLO (its log says
        # what each pick was placed with)
        _pick(target, {"x-llm-d-slo-class": "gold", "x-request-id": "gold-1"})
        wait_until("the gold request's SLO in the picker's log",
                   lambda: "gold-1 (tenant default, LatencySLO(ttft_s=1.0, tbt_s=0.2,"
                   in log_path.read_text())

        sidecars[1].close()  # its reports stop: it leaves the picks
        gone = f"127.0.0.1:{sidecars[1].port}"
        wait_until("the stopped sidecar out of the picks",
                   lambda: gone not in set_headers(_pick(target))
                   .get(DESTINATION, gone))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        vl.stop_process(proc)
        print(vl.tail(log_path))
