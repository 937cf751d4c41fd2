"""A loopback port that is dead and stays dead: :class:`DeadPort`.

A port "checked free, then released" can be bound by anyone in between (another pytest
worker's server, a kernel-chosen port of any process), and a test that needed nothing
to answer there would then reach it. A socket bound to the port but not listening holds
it: a connect there is refused every time (the kernel answers RST, at once), and no
other socket can bind it until :meth:`DeadPort.close`."""

from __future__ import annotations

import socket
from types import TracebackType


class DeadPort:
    """A port on 127.0.0.1 where nothing listens, held so until :meth:`close`."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))  # no SO_REUSEADDR: nobody else may bind it
        self.port: int = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> DeadPort:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
