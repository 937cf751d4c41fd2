"""Fixtures of the sidecar tests (owner: sidecar).

``vllm_url``: one real vLLM OpenAI server (CPU build, from scripts/setup-vllm.sh) per
test session, serving the tiny dummy-weight Llama on loopback with
``--scheduling-policy priority`` and prefix caching. Without vLLM installed the
integration tests fail with the command to run: there is no fallback.
``JITSERVE_TEST_VLLM_URL`` points the tests at an already running one instead (for
iterating locally; it must be the tiny model started as :func:`vllm_command` does).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from jitserve.devstack import vllm as vl

VLLM_START_TIMEOUT_S = float(os.environ.get("JITSERVE_VLLM_START_TIMEOUT", "600"))


@pytest.fixture(scope="session")
def vllm_url() -> Iterator[str]:
    existing = os.environ.get("JITSERVE_TEST_VLLM_URL")
    if existing:  # a developer's already running tiny vLLM (same flags as below)
        yield existing.rstrip("/")
        return
    python = vl.vllm_python()
    if python is None:
        pytest.fail(
            "vLLM is not installed: run scripts/setup-vllm.sh (scripts/test.sh does), "
            "or set JITSERVE_VLLM_PYTHON"
        )
    model = vl.ensure_tiny_model(python=python)
    port = vl.free_port()
    log_dir = Path(tempfile.mkdtemp(prefix="jitserve-vllm-"))
    log_path = log_dir / "vllm.log"
    with log_path.open("ab") as log:
        proc = vl.start_engine(
            vl.vllm_command(python, model, port, max_num_seqs=16, max_model_len=4096), log)
    url = f"http://127.0.0.1:{port}"
    try:
        if not vl.wait_http_ok(url + "/health", VLLM_START_TIMEOUT_S, proc):
            pytest.fail(
                f"vLLM did not start (exit code {proc.poll()}); {log_path}:\n"
                f"{vl.tail(log_path, 60)}"
            )
        yield url
    finally:
        vl.stop_process(proc)
