"""The one sidecar of the tests: ``jitserve sidecar serve`` (the real CLI, through
jitserve.sidecar.cli.serve_command) in its own process on a free loopback port, with
its own GIL, so the test's client cannot slow its event loop down; and a factory that
starts each test's sidecars on an idle shared vLLM and stops them after."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from jitserve.devstack import vllm as vl
from jitserve.sidecar.cli import serve_command

from .http import get_json, get_text
from .processes import OnFreePorts


class SidecarProcess(OnFreePorts):
    def __init__(
        self,
        backend_url: str,
        *,
        config: Path,
        max_running: int = 4,
        engine_queue: int | None = 0,
        api_keys: dict[str, str] | None = None,
        max_body_bytes: int | None = None,
        log_path: Path | None = None,
        extra_args: list[str] | None = None,
        admin_port: bool = False,
    ) -> None:
        """``engine_queue`` 0 by default: most tests watch the sidecar's own queue order;
        None leaves the CLI's default. ``admin_port``: /metrics and /debug on a port of
        their own, as the operator runs it (``admin_url``)."""
        self.config = config
        self._admin = admin_port
        self._extra = ["--reload-interval", "0.2", "--log-level", "INFO"]
        if engine_queue is not None:
            self._extra += ["--engine-queue", str(engine_queue)]
        for key, tenant in (api_keys or {}).items():
            self._extra += ["--api-key", f"{tenant}={key}"]
        if max_body_bytes is not None:
            self._extra += ["--max-body-bytes", str(max_body_bytes)]
        self._extra += extra_args or []
        self._backend_url, self._max_running = backend_url, max_running
        self.log_path = log_path or config.with_suffix(".log")
        self._log = self.log_path.open("ab")
        self.start()

    def launch(self) -> None:
        self.port = vl.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.admin_port = vl.free_port() if self._admin else None
        self.admin_url = f"http://127.0.0.1:{self.admin_port}" if self.admin_port else self.url
        admin = ["--admin-port", str(self.admin_port)] if self.admin_port is not None else []
        cmd = serve_command(self._backend_url, self.port, self.config, self._max_running,
                            extra=[*self._extra, *admin])
        self.proc = vl.start_process(cmd, self._log)

    def wait_ready(self, timeout_s: float = 120.0) -> SidecarProcess:
        if not self.wait_serving(lambda: self.url + "/ready", timeout_s):
            raise AssertionError(f"sidecar not ready (exit code {self.proc.poll()}); log:\n"
                                 f"{vl.tail(self.log_path)}")
        return self

    def wait_up(self, timeout_s: float = 120.0) -> SidecarProcess:
        """Until the process serves (``/health``), ready or not."""
        if not self.wait_serving(lambda: self.url + "/health", timeout_s):
            raise AssertionError(f"sidecar not up; log:\n{vl.tail(self.log_path)}")
        return self

    def ready(self) -> tuple[int, dict[str, Any]]:
        """The status and document of /ready (503 while draining or misconfigured)."""
        status, doc = get_json(self.url + "/ready")
        return status, doc or {}

    def state(self) -> dict[str, Any]:
        """The sidecar's /debug/scheduler: policy figures, queue, running, frames."""
        status, doc = get_json(self.admin_url + "/debug/scheduler")
        assert status == 200, doc
        result: dict[str, Any] = doc
        return result

    def metrics(self) -> str:
        return get_text(self.admin_url + "/metrics")

    def write_config(self, spec: dict[str, Any] | str | bytes) -> None:
        """Replace the policy file atomically, as the kubelet swaps a ConfigMap volume (a
        bad file too): written in place, the sidecar's reload can read it half written,
        empty after the truncation, and count an error of its own."""
        data = spec if isinstance(spec, bytes) else (
            spec if isinstance(spec, str) else yaml.safe_dump(spec)).encode()
        tmp = self.config.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(self.config)

    def close(self) -> None:
        vl.stop_process(self.proc)
        self._log.close()


Factory = Callable[..., SidecarProcess]


def keeping_every_request(policy: dict[str, Any] | None = None) -> dict[str, Any]:
    """``policy`` with overload control and the door off: a latency request whose first
    token a busy machine makes (or forecasts) late is served, not retired with a 429. For
    a test whose subject is not speed (header parsing, class mapping, streaming) but that
    asks for a latency SLO."""
    doc = dict(policy or {})
    scheduler = dict(doc.get("scheduler", {}))
    scheduler["mechanisms"] = {**scheduler.get("mechanisms", {}), "overloadControl": False}
    doc["scheduler"] = scheduler
    doc["admission"] = {**doc.get("admission", {}), "onTimeQuantile": 0}
    return doc


def make_factory(backend_url: str, tmp_path: Path, started: list[SidecarProcess]) -> Factory:
    """``make(policy, ready=True, **SidecarProcess settings)``: a sidecar with its own
    policy file, started once the shared vLLM runs nothing left over."""

    def make(policy: dict[str, Any] | None = None, *, ready: bool = True,
             **settings: Any) -> SidecarProcess:
        wait_backend_idle(backend_url)
        config = tmp_path / f"policy-{len(started)}.yaml"
        config.write_text(yaml.safe_dump(policy or {}))
        s = SidecarProcess(backend_url, config=config, **settings)
        started.append(s)
        return s.wait_ready() if ready else s.wait_up()

    return make


def wait_backend_idle(backend_url: str, timeout_s: float = 120.0) -> None:
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
