"""Is a process (or a process group) still there? And a child on free ports that
survives losing one (:class:`OnFreePorts`)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

from jitserve.devstack import vllm as vl

BIND_TRIES = 3
"""Starts of a child whose port was taken between the check and its bind."""


def alive(pid: int, *, group: bool = False) -> bool:
    try:
        (os.killpg if group else os.kill)(pid, 0)
    except ProcessLookupError:
        return False
    return True


def listening_inodes(port: int) -> set[str]:
    """Socket inodes listening on TCP ``port`` (any address), from /proc/net/tcp{,6}."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            next(rows)
            for row in rows:
                fields = row.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(fields[9])
    return inodes


def holds_port(pid: int, port: int) -> bool:
    """Whether process ``pid`` has a socket listening on ``port`` open."""
    inodes = {f"socket:[{inode}]" for inode in listening_inodes(port)}
    fds = Path(f"/proc/{pid}/fd")
    try:
        return any(os.readlink(fd) in inodes for fd in fds.iterdir())
    except (FileNotFoundError, ProcessLookupError):
        return False


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
        """Until ``url()`` (read again after a restart) answers 2xx from the child itself
        (another worker's server that took the port answers too: ci-fresh, a gateway test
        read a fake engine's 404 at its admin port); False if the child exits for another
        reason or does not answer in time."""
        for _ in range(BIND_TRIES):
            if vl.wait_http_ok(url(), timeout_s, self.proc) and self._holds(url(), timeout_s):
                return True
            if not self._lost_its_port():
                return False
            self.start()
        return False

    def _holds(self, url: str, timeout_s: float) -> bool:
        """Until the child listens on ``url``'s port (True) or exits (False)."""
        port = urlsplit(url).port
        assert port is not None, url
        deadline = time.monotonic() + timeout_s
        while self.proc.poll() is None and time.monotonic() < deadline:
            if holds_port(self.proc.pid, port):
                return True
            time.sleep(0.1)
        return False
