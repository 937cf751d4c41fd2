"""Is a process (or a process group) still there? And a child on free ports that
survives losing one (:class:`OnFreePorts`)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import IO

from jitserve.devstack import vllm as vl

BIND_TRIES = 3
"""Starts of a child whose port was taken between the check and its bind."""


def alive(pid: int, *, group: bool = False) -> bool:
    try:
        (os.killpg if group else os.kill)(pid, 0)
    except ProcessLookupError:
        return False
    return True


class OnFreePorts:
    """A child process serving on ports found free. A port found free can be bound by
    another process (another pytest worker's server) before the child binds it; the
    child then exits with "address already in use", and :meth:`wait_serving` starts it
    again on new ports (:meth:`launch` picks them), up to :data:`BIND_TRIES` times."""

    log_path: Path
    proc: subprocess.Popen[bytes]
    _log: IO[bytes]
    _log_from: int = 0

    def launch(self) -> None:
        """Pick the ports and start the child (``self.proc``), logging to ``self._log``."""
        raise NotImplementedError

    def start(self) -> None:
        self._log.flush()
        self._log_from = self.log_path.stat().st_size
        self.launch()

    def _lost_its_port(self) -> bool:
        if self.proc.poll() is None:
            return False
        with self.log_path.open("rb") as log:
            log.seek(self._log_from)
            return b"address already in use" in log.read()

    def wait_serving(self, url: Callable[[], str], timeout_s: float) -> bool:
        """Until ``url()`` (read again after a restart) answers 2xx; False if the child
        exits for another reason or does not answer in time."""
        for _ in range(BIND_TRIES):
            if vl.wait_http_ok(url(), timeout_s, self.proc):
                return True
            if not self._lost_its_port():
                return False
            self.start()
        return False
