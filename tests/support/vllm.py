"""The one tiny real vLLM of the tests (CPU build from scripts/setup-vllm.sh, the
dummy-weight Llama of jitserve.devstack.tinymodel) and its launcher.

Every test that needs a vLLM uses :func:`start_tiny_vllm`: the session's shared one
(the ``vllm_url`` fixture in tests/conftest.py) and the private ones of the fault tests
that freeze or kill theirs. It runs at the caller's priority (nice 0): under load from
other work on the machine a reniced vLLM got a few percent of a core and did not start
in ten minutes, and no test here depends on how fast vLLM runs. Its process group dies
with the test process (jitserve.devstack.vllm.kill_group_when_parent_dies), so a
killed pytest leaves no vLLM behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jitserve.devstack import vllm as vl
from jitserve.policy import BudgetRule

START_TIMEOUT_S = float(os.environ.get("JITSERVE_VLLM_START_TIMEOUT", "900"))
SLOTS = 16
CONTEXT = 4096
"""The shared vLLM's ``--max-num-seqs`` and ``--max-model-len``: a long stream is up to
4000 tokens."""


@dataclass
class TinyVLLM:
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def stop(self) -> None:
        vl.stop_process(self.proc)


def start_tiny_vllm(*, max_num_seqs: int = SLOTS, max_model_len: int = CONTEXT,
                    extra: list[str] | None = None,
                    engine_rule: BudgetRule = BudgetRule.FIXED,
                    step_log: Path | None = None, port: int | None = None) -> TinyVLLM:
    """A real vLLM on a free loopback port, with the tool-call flags ``jitserve up``
    passes, once it answers /health; with ``engine_rule``, jitserve's in-engine scheduler
    loaded with that budget rule (writing its per-step log to ``step_log``); ``port``: a
    given one (a restart where the killed one listened), else a free one."""
    python = vl.vllm_python()
    if python is None:
        raise AssertionError("vLLM is not installed: run scripts/setup-vllm.sh "
                             "(scripts/test.sh does), or set JITSERVE_VLLM_PYTHON")
    model = vl.ensure_tiny_model(python=python)
    port = vl.free_port() if port is None else port
    log_path = Path(tempfile.mkdtemp(prefix="jitserve-vllm-")) / "vllm.log"
    cmd = vl.vllm_command(python, model, port, max_num_seqs=max_num_seqs,
                          max_model_len=max_model_len, extra=[*vl.TOOL_FLAGS, *(extra or [])],
                          engine_rule=engine_rule)
    with log_path.open("ab") as log:
        proc = vl.start_engine(cmd, log, nice=0,
                               env=vl.engine_scheduler_env(engine_rule, step_log))
    engine = TinyVLLM(proc, f"http://127.0.0.1:{port}", log_path)
    if not vl.wait_http_ok(engine.url + "/health", START_TIMEOUT_S, proc):
        engine.stop()
        raise AssertionError(f"vLLM did not start in {START_TIMEOUT_S:.0f} s (exit code "
                             f"{proc.poll()}); {log_path}:\n{vl.tail(log_path, 60)}")
    return engine


class RestartableVLLM:
    """A private tiny vLLM a test freezes and kills (signals to its whole process group:
    API server, engine core, workers), and restarts on the same port."""

    def __init__(self) -> None:
        self.engine = start_tiny_vllm()
        self.port = int(self.engine.url.rsplit(":", 1)[1])

    @property
    def url(self) -> str:
        return self.engine.url

    def signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.engine.proc.pid, sig)

    def restart(self) -> None:
        self.engine.stop()
        self.engine = start_tiny_vllm(port=self.port)

    def stop(self) -> None:
        self.signal(signal.SIGCONT)
        self.engine.stop()


@contextmanager
def tiny_vllm(**settings: Any) -> Iterator[TinyVLLM]:
    engine = start_tiny_vllm(**settings)
    try:
        yield engine
    finally:
        engine.stop()


def shared_vllm_url() -> Iterator[str]:
    """The body of the session fixture: ``JITSERVE_TEST_VLLM_URL`` (a developer's
    already running tiny vLLM, started as :func:`start_tiny_vllm` does) or a new one."""
    existing = os.environ.get("JITSERVE_TEST_VLLM_URL")
    if existing:
        yield existing.rstrip("/")
        return
    with tiny_vllm() as engine:
        yield engine.url
