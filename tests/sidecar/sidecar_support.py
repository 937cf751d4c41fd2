"""Helpers of the sidecar tests (owner: sidecar): a sidecar process, a streaming client,
and Prometheus text parsing. Nothing here fakes vLLM; the one fake backend of the suite
lives in fake_backend.py."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from jitserve.bench.live import StreamResult, stream_completion
from jitserve.devstack import vllm as vl
from jitserve.sidecar.cli import serve_command


def start_tiny_vllm(timeout_s: float = 600.0) -> tuple[subprocess.Popen[bytes], str]:
    """A real vLLM of our own (CPU build, the tiny model, 16 slots) in its own process
    group, for the tests that freeze or kill it; (process, URL) once it answers."""
    python = vl.vllm_python()
    if python is None:
        raise AssertionError("vLLM is not installed: run scripts/setup-vllm.sh")
    model = vl.ensure_tiny_model(python=python)
    port = vl.free_port()
    log_path = Path(tempfile.mkdtemp(prefix="jitserve-vllm-")) / "vllm.log"
    with log_path.open("ab") as log:
        proc = vl.start_engine(vl.vllm_command(python, model, port, max_num_seqs=16,
                                                max_model_len=4096), log)
    url = f"http://127.0.0.1:{port}"
    timeout_s = float(os.environ.get("JITSERVE_VLLM_START_TIMEOUT", timeout_s))
    if not vl.wait_http_ok(url + "/health", timeout_s, proc):
        vl.stop_process(proc)
        raise AssertionError(f"vLLM did not start; {log_path}:\n{vl.tail(log_path, 60)}")
    return proc, url


class SidecarProcess:
    """A real sidecar, ``jitserve sidecar serve``, in its own process on a free port
    (own process, own GIL: the test's client cannot slow its event loop down)."""

    def __init__(
        self,
        backend_url: str,
        *,
        config: Path,
        max_running: int = 4,
        engine_queue: int = 0,
        api_keys: dict[str, str] | None = None,
        max_body_bytes: int | None = None,
        log_path: Path | None = None,
        extra_args: list[str] | None = None,
    ) -> None:
        self.port = vl.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = config
        # engine queue 0 by default: these tests watch the sidecar's own queue order; the
        # engine-queue tests set it
        cmd = serve_command(backend_url, self.port, config, max_running, extra=[
            "--engine-queue", str(engine_queue), "--reload-interval", "0.2",
            "--log-level", "INFO"])
        for key, tenant in (api_keys or {}).items():
            cmd += ["--api-key", f"{tenant}={key}"]
        if max_body_bytes is not None:
            cmd += ["--max-body-bytes", str(max_body_bytes)]
        cmd += extra_args or []
        self.log_path = log_path or config.with_suffix(".log")
        self._log = self.log_path.open("ab")
        self.proc = vl.start_process(cmd, self._log)

    def wait_ready(self, timeout: float = 60.0) -> None:
        if not vl.wait_http_ok(self.url + "/ready", timeout, self.proc):
            raise AssertionError(
                f"sidecar not ready ({get_json(self.url + '/ready')}); log:\n"
                f"{vl.tail(self.log_path)}"
            )

    def wait_up(self, timeout: float = 60.0) -> None:
        """Until the process serves (``/health``), ready or not."""
        if not vl.wait_http_ok(self.url + "/health", timeout, self.proc):
            raise AssertionError(f"sidecar not up; log:\n{vl.tail(self.log_path)}")

    def state(self) -> dict[str, Any]:
        """The sidecar's /debug/scheduler: policy figures, queue, running, frames."""
        status, doc = get_json(self.url + "/debug/scheduler")
        assert status == 200, doc
        result: dict[str, Any] = doc
        return result

    def close(self) -> None:
        vl.stop_process(self.proc)
        self._log.close()


def get_json(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}),
                                    timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def get_text(url: str, headers: dict[str, str] | None = None) -> str:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}),
                                timeout=10) as resp:
        text: str = resp.read().decode()
        return text


def post(
    url: str,
    body: bytes | dict[str, Any],
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, headers={"content-type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), json.loads(err.read() or b"null")


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    found = False
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        metric_name, _, label_text = head.partition("{")
        if metric_name != name:
            continue
        if all(f'{k}="{v}"' in label_text for k, v in labels.items()):
            total += float(value)
            found = True
    if not found:
        raise KeyError(f"no sample {name}{labels}")
    return total


def stream(
    url: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
    path: str = "/v1/completions",
) -> StreamResult:
    async def go() -> StreamResult:
        async with aiohttp.ClientSession() as session:
            return await stream_completion(session, url, body, headers, path)

    return asyncio.run(go())


def alternates(ids: list[int]) -> bool:
    """The tiny dummy model's greedy output is a strict two-token cycle ABAB...: a token
    duplicated, dropped or reordered at a preemption boundary breaks it."""
    return len(ids) >= 2 and all(ids[i] == ids[i % 2] for i in range(len(ids))) and ids[0] != ids[1]


Factory = Callable[..., SidecarProcess]


def make_factory(backend_url: str, tmp_path: Path, started: list[SidecarProcess]) -> Factory:
    def make(policy: dict[str, Any] | None = None, *, ready: bool = True,
             **settings: Any) -> SidecarProcess:
        _wait_backend_idle(backend_url)
        config = tmp_path / f"policy-{len(started)}.yaml"
        config.write_text(yaml.safe_dump(policy or {}))
        s = SidecarProcess(backend_url, config=config, **settings)
        started.append(s)
        if ready:
            s.wait_ready()
        else:
            s.wait_up()
        return s

    return make


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def _wait_backend_idle(backend_url: str, timeout_s: float = 60.0) -> None:
    """A test starts on a shared vLLM that runs nothing left over from the previous test
    (an aborted request is dropped by vLLM a moment after its stream closes); bounded."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            text = get_text(backend_url + "/metrics")
        except Exception:  # not a vLLM (a fake backend) or not up yet: nothing to wait for
            return
        busy = [line for line in text.splitlines()
                if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting"))
                and not line.rstrip().endswith(" 0.0")]
        if not busy:
            return
        time.sleep(0.2)
