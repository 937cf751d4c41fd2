"""The one polling helper: wait for something the system reports, bounded only against
hangs (the bound is never what a test proves)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


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
