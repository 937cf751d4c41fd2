"""One tenant must not take the pod down: hostile requests and connections, each limit
with its clear error (a real ``jitserve sidecar serve`` process in front of the FAKE
vLLM, whose speed and vocabulary the tests control; the same limits against the real
vLLM are in test_sidecar_vllm_faults.py).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from jitserve.devstack.vllm import free_port
from tests.support.fake_vllm import FakeVLLM
from tests.support.http import get_json, get_text, metric, metric_total, post, stream
from tests.support.sidecar import SidecarProcess
from tests.support.waiting import body_timeout, wait_until

pytestmark = body_timeout(180)

Factory = Callable[..., SidecarProcess]


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeVLLM]:
    backend = FakeVLLM(free_port(), interval_s=0.001)
    yield backend
    backend.close()


@pytest.fixture
def sidecar(fake: FakeVLLM, tmp_path: Path) -> Iterator[Factory]:
    started: list[SidecarProcess] = []

    def make(policy: dict[str, Any] | None = None, *, ready: bool = True,
             **settings: Any) -> SidecarProcess:
        config = tmp_path / f"policy-{len(started)}.yaml"
        config.write_text(yaml.safe_dump(policy or {}))
        s = SidecarProcess(f"http://127.0.0.1:{fake.port}", config=config, **settings)
        started.append(s)
        if ready:
            s.wait_ready()
        else:
            s.wait_up()
        return s

    yield make
    for s in started:
        s.close()


def raw_exchange(port: int, data: bytes, until: bytes, timeout: float = 30.0) -> bytes:
    """Send raw bytes on a fresh connection; what the server answers until ``until``
    shows, it closes, or ``timeout``."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        answer = b""
        while until not in answer:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            answer += chunk
        return answer


def test_json_nesting_and_lone_surrogates_are_400s(sidecar: Factory) -> None:
    s = sidecar()
    url = s.url + "/v1/completions"
    for depth in (40, 990, 5000):  # 990: Python's json recursion limit, a 500 before
        status, _, doc = post(url, b'{"prompt": "hi", "stop": ' + b"[" * depth + b"]" * depth
                              + b"}")
        assert status == 400 and doc["error"]["code"] in ("too_deep", "invalid_json"), doc
        assert doc["error"]["param"].startswith(("stop", "body")), doc
    status, _, doc = post(url, b'{"prompt": "caf\\ud800"}')
    assert status == 400 and doc["error"]["param"] == "prompt", doc
    status, _, doc = post(s.url + "/v1/chat/completions",
                          b'{"messages": [{"role": "user", "content": "\\udfff"}]}')
    assert status == 400 and doc["error"]["param"] == "messages.0.content", doc
    status, _, doc = post(url, b'{"prompt": "\\ud83d\\ude42", "max_tokens": 2}')  # a valid pair
    assert status == 200, doc


def test_body_shorter_than_its_content_length_times_out(sidecar: Factory) -> None:
    s = sidecar(extra_args=["--body-timeout", "2"])
    started = time.monotonic()
    answer = raw_exchange(s.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                          b"Content-Type: application/json\r\nContent-Length: 500\r\n\r\n"
                          b'{"prompt": "hi"', until=b"}}")
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b'"code": "request_timeout"' in answer
    assert time.monotonic() - started < 60  # the server closed it (else: no answer at all)


def test_slowloris_connections_are_closed_and_others_served(sidecar: Factory) -> None:
    s = sidecar(extra_args=["--header-timeout", "2"])
    socks = []
    for _ in range(100):
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=30)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # and never the rest
        socks.append(sock)
    try:
        status, _, doc = post(s.url + "/v1/completions", {"prompt": [1, 2], "max_tokens": 2})
        assert status == 200, doc
        started = time.monotonic()
        for sock in socks:  # the server closes each one after the header timeout
            try:
                sock.sendall(b"X-Slow: 1\r\n")
                assert sock.recv(1024) == b""
            except ConnectionResetError:  # closed before (or while) the header came
                pass
        assert time.monotonic() - started < 120  # each closed by the server, none left open
    finally:
        for sock in socks:
            sock.close()
    assert get_json(s.url + "/ready")[0] == 200


def test_slo_limits_apply_to_body_and_headers(sidecar: Factory) -> None:
    s = sidecar({"limits": {"maxSloSeconds": 600, "maxStages": 8, "maxProgramSeconds": 900}})
    url = s.url + "/v1/completions"
    cases: list[tuple[dict[str, Any], dict[str, str], str]] = [
        ({"slo": {"deadline_s": 601}}, {}, "slo.deadline_s"),
        ({"slo": {"ttft_ms": 700_000}}, {}, "slo.ttft_ms"),
        ({}, {"x-slo-deadline-ms": "1e308"}, "x-slo-deadline-ms"),
        ({}, {"x-slo-ttft-ms": "601000"}, "x-slo-ttft-ms"),
        ({}, {"x-slo-tpot-ms": "inf"}, "x-slo-tpot-ms"),
        ({"slo": {"program_id": "p", "stages": 10_000}}, {}, "slo.stages"),
        ({"slo": {"program_id": "p", "stage": 8}}, {}, "slo.stage"),
        ({"slo": {"program_id": "p", "stages": 8, "deadline_s": 86_400}}, {}, "slo.deadline_s"),
        ({"slo": {"program_id": "p", "stages": 8}}, {}, ""),  # 8 x 20 s: fine
    ]
    for extra, headers, param in cases:
        status, _, doc = post(url, {"prompt": [1, 2], "max_tokens": 2, **extra}, headers)
        if not param:
            assert status == 200, doc
            continue
        assert status == 400 and doc["error"]["param"] == param, (extra, headers, doc)
        assert doc["error"]["code"] == "invalid_value"
        assert "limits." in doc["error"]["message"] or "positive" in doc["error"]["message"]


def test_live_programs_are_capped(sidecar: Factory) -> None:
    s = sidecar({"limits": {"maxPrograms": 3}})
    url = s.url + "/v1/completions"
    for i in range(3):
        status, _, doc = post(url, {"prompt": [1], "max_tokens": 1,
                                    "slo": {"program_id": f"p{i}", "stages": 2}})
        assert status == 200, doc
    status, headers, doc = post(url, {"prompt": [1], "max_tokens": 1,
                                      "slo": {"program_id": "p-new", "stages": 2}})
    assert status == 429 and doc["error"]["code"] == "too_many_programs", doc
    assert int(headers["Retry-After"]) >= 1
    status, _, doc = post(url, {"prompt": [1], "max_tokens": 1,  # a known program goes on
                                "slo": {"program_id": "p1", "stage": 1, "stages": 2}})
    assert status == 200, doc


def test_made_up_tenants_share_one_label(sidecar: Factory) -> None:
    s = sidecar({"fairness": {"tenants": [{"name": "team-a"}]}})
    for i in range(40):
        status, _, doc = post(s.url + "/v1/completions", {"prompt": [1], "max_tokens": 1},
                              {"x-tenant": f"made-up-{i}"})
        assert status == 200 and doc["jitserve"]["tenant"] == f"made-up-{i}"
    post(s.url + "/v1/completions", {"prompt": [1], "max_tokens": 1}, {"x-tenant": "team-a"})
    text = get_text(s.url + "/metrics")
    tenants = {line.split('tenant="')[1].split('"')[0] for line in text.splitlines()
               if line.startswith("jitserve_requests_total{")}
    assert tenants == {"other", "team-a"}
    assert metric(text, "jitserve_requests_total", tenant="other") == 40
    queued = {line.split('tenant="')[1].split('"')[0] for line in text.splitlines()
              if line.startswith("jitserve_queue_time_seconds_count{")}
    assert queued == {"other", "team-a"}


def test_per_request_backend_errors_do_not_take_the_backend_down(sidecar: Factory,
                                                                 fake: FakeVLLM) -> None:
    s = sidecar()
    url = s.url + "/v1/completions"
    for _ in range(5):
        status, _, doc = post(url, {"prompt": [1_000_000], "max_tokens": 2})
        assert status == 400 and doc["error"]["param"] == "prompt", doc
        assert doc["error"]["code"] == "invalid_value" and "vocabulary" in doc["error"]["message"]
        status, _, doc = post(url, {"prompt": [1], "max_tokens": 2, "stop_token_ids": [10**9]})
        assert status == 400 and doc["error"]["param"] == "stop_token_ids", doc
        assert get_json(s.url + "/ready")[0] == 200
    text = get_text(s.url + "/metrics")
    assert metric(text, "jitserve_backend_up") == 1
    with pytest.raises(KeyError):
        metric(text, "jitserve_rejections_total", reason="backend_down")


def test_slow_reader_is_cut_off_not_buffered(tmp_path: Path) -> None:
    """A client that stops reading: its stream holds at most --max-buffered-tokens, then
    its vLLM request is aborted and its connection closed after --body-timeout. (1 KB of
    text per token: 4 MB in all, more than socket buffers can hide.)"""
    fake = FakeVLLM(free_port(), interval_s=0.001, token_text_bytes=1024)
    config = tmp_path / "policy.yaml"
    config.write_text("{}")
    s = SidecarProcess(f"http://127.0.0.1:{fake.port}", config=config,
                       extra_args=["--max-buffered-tokens", "64", "--body-timeout", "3"])
    try:
        s.wait_ready()
        slow_reader(s)
    finally:
        s.close()
        fake.close()


def slow_reader(s: SidecarProcess) -> None:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", s.port))
        body = b'{"prompt": [1, 2, 3], "max_tokens": 4000, "stream": true}'
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        # aborted while the client is still connected (the outcome, not the short-lived
        # running state, which a poll held off by a busy machine can miss)
        wait_until("the slow reader's request cancelled",
                   lambda: metric_total(get_text(s.url + "/metrics"),
                                        "jitserve_requests_total", outcome="cancelled") == 1,
                   60)
        # the client gets what was buffered, then the error event, then the close
        sock.settimeout(30)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.count(b"data: {") < 4000
    assert b"client_too_slow" in data or not data.endswith(b"data: [DONE]\n\n")


def test_stall_timeout_counts_only_once_tokens_flow(tmp_path: Path) -> None:
    """A request waiting for its first token (queued inside vLLM, or in prefill) is not
    stalled however long it waits; a stream whose tokens stop is failed within the stall
    timeout (the real vLLM frozen: test_sidecar_vllm_faults.py)."""
    config = tmp_path / "policy.yaml"
    config.write_text("{}")
    # each stream's tokens in one write: no gap between two tokens is bounded here (those
    # are test_stall_watch.py's, on a virtual clock), only the wait for the first token
    # (3 s, unbounded) and the silence after the tenth (bounded: the stall)
    slow_start = FakeVLLM(free_port(), first_token_delay_s=3.0, burst=True)
    frozen = FakeVLLM(free_port(), pause_at=10, burst=True)
    sidecars = [SidecarProcess(f"http://127.0.0.1:{fake.port}", config=config,
                               extra_args=["--stall-timeout", "1"])
                for fake in (slow_start, frozen)]
    try:
        for s in sidecars:
            s.wait_ready()
        status, _, doc = post(sidecars[0].url + "/v1/completions",
                              {"prompt": [1, 2], "max_tokens": 20})
        assert status == 200 and doc["usage"]["completion_tokens"] == 20, doc
        s = sidecars[1]
        result = stream(s.url, {"prompt": [1, 2], "max_tokens": 20})
        assert result.status == 200 and len(result.token_ids) == 10
        assert result.error is not None and result.error["code"] == "backend_failed"
        assert "stall" in result.error["message"]
        assert result.end_s - result.token_times[-1] < 60  # the 1 s watch fired: no hang
    finally:
        frozen.loop.call_soon_threadsafe(frozen.resume.set)
        for s in sidecars:
            s.close()
        slow_start.close()
        frozen.close()


def test_admin_port_serves_metrics_and_debug_off_the_api_port(sidecar: Factory) -> None:
    admin_port = free_port()
    s = sidecar(api_keys={"key-a": "team-a"}, extra_args=["--admin-port", str(admin_port)])
    admin = f"http://127.0.0.1:{admin_port}"
    for path in ("/metrics", "/debug/scheduler"):
        status, doc = get_json(s.url + path, {"Authorization": "Bearer key-a"})
        assert status == 404 and doc["error"]["code"] == "not_found", (path, doc)
    assert "jitserve_backend_up" in get_text(admin + "/metrics")
    status, doc = get_json(admin + "/debug/scheduler")
    assert status == 200 and doc["ready"] is True
    assert get_json(admin + "/ready")[0] == 200


def test_a_request_past_its_queue_ttl_gets_429_with_llm_ds_reason(tmp_path: Path) -> None:
    """``x-llm-d-inference-ttl`` over HTTP: with the one batch slot held, a request that
    names a TTL waits that long, then 429 ``ttl_expired`` with
    ``x-llm-d-request-dropped-reason: rejected-ttl-expired``; the held one is unharmed."""
    held = FakeVLLM(free_port(), interval_s=0.005, pause_at=1)
    config = tmp_path / "policy.yaml"
    config.write_text("{}")
    s = SidecarProcess(f"http://127.0.0.1:{held.port}", config=config, max_running=1,
                       extra_args=["--stall-timeout", "600"])
    results: list[Any] = []
    blocker = threading.Thread(target=lambda: results.append(
        stream(s.url, {"prompt": [1, 2], "max_tokens": 4})))
    try:
        s.wait_ready()
        blocker.start()
        wait_until("the slot held", lambda: s.state()["running"] == 1)
        status, headers, doc = post(s.url + "/v1/completions",
                                    {"prompt": [1, 2], "max_tokens": 4},
                                    {"x-llm-d-inference-ttl": "200ms"})
        assert status == 429 and doc["error"]["code"] == "ttl_expired", doc
        assert headers["x-llm-d-request-dropped-reason"] == "rejected-ttl-expired"
        assert int(headers["Retry-After"]) >= 1
        status, _, doc = post(s.url + "/v1/completions", {"prompt": [1], "max_tokens": 1},
                              {"x-llm-d-inference-ttl": "soon"})
        assert status == 400 and doc["error"]["param"] == "x-llm-d-inference-ttl"
        held.loop.call_soon_threadsafe(held.resume.set)
        blocker.join(60)
        assert len(results[0].token_ids) == 4
        assert metric(get_text(s.url + "/metrics"), "jitserve_requests_total",
                      outcome="ttl_expired") == 1
    finally:
        held.loop.call_soon_threadsafe(held.resume.set)
        s.close()
        held.close()
