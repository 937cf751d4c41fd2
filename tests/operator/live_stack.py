"""A live serving stack for the operator's monitoring and kubectl tests: one real tiny vLLM
(CPU build from scripts/setup-vllm.sh, dummy weights) per session and real ``jitserve
sidecar serve`` processes in front of it, plus a small HTTP client.

Nothing is faked: the sidecar's /metrics and vLLM's /metrics are what Prometheus and the
operator read. ``JITSERVE_TEST_VLLM_URL`` points the tests at an already running tiny vLLM
(started as ``jitserve.devstack.vllm.vllm_command`` does) instead of starting one.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from jitserve.devstack import tinymodel
from jitserve.devstack import vllm as vl

VLLM_START_TIMEOUT_S = float(os.environ.get("JITSERVE_VLLM_START_TIMEOUT", "600"))
MODEL = tinymodel.MODEL_NAME


@pytest.fixture(scope="session")
def live_vllm() -> Iterator[str]:
    """The base URL of a real tiny vLLM OpenAI server."""
    existing = os.environ.get("JITSERVE_TEST_VLLM_URL")
    if existing:
        yield existing.rstrip("/")
        return
    python = vl.vllm_python()
    if python is None:
        pytest.fail("vLLM is not installed: run scripts/setup-vllm.sh (scripts/test.sh does)")
    model = vl.ensure_tiny_model(python=python)
    port = vl.free_port()
    log_path = Path(tempfile.mkdtemp(prefix="jitserve-op-vllm-")) / "vllm.log"
    with log_path.open("ab") as log:
        proc = vl.start_engine(vl.vllm_command(python, model, port, max_num_seqs=8), log)
    url = f"http://127.0.0.1:{port}"
    try:
        if not vl.wait_http_ok(url + "/health", VLLM_START_TIMEOUT_S, proc):
            pytest.fail(f"vLLM did not start; {log_path}:\n{vl.tail(log_path, 60)}")
        yield url
    finally:
        vl.stop_process(proc)


class Sidecar:
    """``jitserve sidecar serve`` in its own process, on a free loopback port, with its
    admin port (metrics, /debug/scheduler) on another, as the operator runs it."""

    def __init__(self, backend: str, config: Path, *, max_running: int = 4) -> None:
        self.port = vl.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.admin_port = vl.free_port()
        self.admin_url = f"http://127.0.0.1:{self.admin_port}"
        self.config = config
        self.log_path = config.with_suffix(".log")
        self._log = self.log_path.open("ab")
        cmd = [
            *(sys.executable, "-m", "jitserve.cli", "sidecar", "serve"),
            *("--backend", backend, "--host", "127.0.0.1", "--port", str(self.port)),
            *("--config", str(config), "--max-running", str(max_running)),
            *("--reload-interval", "0.2", "--admin-port", str(self.admin_port)),
        ]
        self.proc = vl.start_process(cmd, self._log)
        if not vl.wait_http_ok(self.url + "/ready", 60, self.proc):
            self.close()
            raise AssertionError(f"sidecar not ready:\n{vl.tail(self.log_path)}")

    def write_config(self, spec: dict[str, Any] | str) -> None:
        """Replace the policy file atomically, as the kubelet swaps a ConfigMap volume."""
        text = spec if isinstance(spec, str) else yaml.safe_dump(spec)
        tmp = self.config.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(self.config)

    def metrics(self) -> str:
        with urllib.request.urlopen(self.admin_url + "/metrics", timeout=10) as resp:
            text: str = resp.read().decode()
            return text

    def close(self) -> None:
        vl.stop_process(self.proc)
        self._log.close()


def complete(
    url: str, slo: dict[str, Any], *, tenant: str = "default", max_tokens: int = 16, **extra: Any
) -> int:
    """One non-streamed completion through the sidecar; returns the HTTP status."""
    body = {"model": MODEL, "prompt": [1, 2, 3, 4, 5], "max_tokens": max_tokens, "slo": slo}
    body.update(extra)
    request = urllib.request.Request(
        url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "x-tenant": tenant},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as err:
        err.read()
        return int(err.code)


def burst(url: str, requests: list[dict[str, Any]]) -> list[int]:
    """Send ``requests`` (keyword arguments of :func:`complete`) at once."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(requests)) as pool:
        futures = [pool.submit(complete, url, **r) for r in requests]
        return [f.result() for f in futures]


def metric_total(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (0 when none)."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += float(sample.value)
    return total


def wait_until(what: str, check: Any, timeout_s: float, every_s: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last: {last!r})")
