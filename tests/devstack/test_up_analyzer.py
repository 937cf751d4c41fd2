"""`jitserve up` waits for its analyzer as long as for its other parts (``--timeout``), not
a fixed minute: on a busy machine the sidecar otherwise started without it."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from jitserve.devstack import vllm as vl
from jitserve.devstack.up import Stack, start_analyzer

# An analyzer stand-in: it listens only once the test's clock says a minute has passed.
LATE_LISTENER = """
import pathlib, socket, sys, time
flag, port = pathlib.Path(sys.argv[1]), int(sys.argv[2])
while not flag.exists():
    time.sleep(0.05)
sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", port))
sock.listen()
time.sleep(600)
"""


def test_the_analyzer_is_used_when_it_listens_after_more_than_a_minute(tmp_path: Path) -> None:
    port, flag = vl.free_port(), tmp_path / "a-minute-passed"
    started = time.monotonic()
    calls = 0

    def clock() -> float:
        # The first reading sets the deadline; every later one is past a minute (and
        # moves on with real time, so a listener that never comes still ends the wait).
        nonlocal calls
        calls += 1
        if calls == 1:
            return 0.0
        flag.touch()
        return 61.0 + time.monotonic() - started

    stack = Stack(tmp_path)
    try:
        address = start_analyzer(
            stack,
            argparse.Namespace(analyzer_port=port, timeout=600.0),
            clock,
            [sys.executable, "-c", LATE_LISTENER, str(flag), str(port)],
        )
        assert address == f"127.0.0.1:{port}"
        assert [name for name, _, _ in stack.children] == ["analyzer"]
    finally:
        stack.stop()
