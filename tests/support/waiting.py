"""The one polling helper: wait for something the system reports, bounded only against
hangs (the bound is never what a test proves); and the one rule for a test's own hang
bound, :func:`body_timeout`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from .vllm import START_TIMEOUT_S as VLLM_START_TIMEOUT_S

T = TypeVar("T")

PROCESS_START_TIMEOUT_S = 600.0
"""How long a real part the tests start (the control plane, the operator) may take to be
ready while its process lives: a bound against a hang (each such wait also ends when the
process exits). A busy 2-core machine starts a Python process or kube-apiserver in
minutes, not seconds; vLLM has its own, larger bound (``tests/support/vllm.py``)."""


def body_timeout(work_s: float, vllm_starts: int = 0) -> pytest.MarkDecorator:
    """A test's timeout marker: it bounds the test's body only (pytest-timeout's
    ``func_only``): ``work_s``, plus ``VLLM_START_TIMEOUT_S`` for each vLLM the body itself
    starts. Fixtures are not counted: the first test of a group cold-starts the shared
    vLLM in its setup (minutes on a busy machine), and every fixture bounds its own start
    (``VLLM_START_TIMEOUT_S`` for a vLLM, ``wait_ready`` for a sidecar or a gateway)."""
    return pytest.mark.timeout(work_s + vllm_starts * VLLM_START_TIMEOUT_S, func_only=True)


def wait_until(
    what: str,
    check: Callable[[], T],
    timeout_s: float = 60.0,
    every_s: float = 0.05,
    tolerate: tuple[type[BaseException], ...] = (),
) -> T:
    """Poll ``check`` until it returns something truthy and return that; fail naming
    ``what`` and the last value seen. Exceptions of the ``tolerate`` types count as not
    yet (e.g. a Kubernetes object that does not exist yet)."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        try:
            last = check()
        except tolerate as err:
            last = err
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what} "
                                 f"(last: {last!r})")
        time.sleep(every_s)
