"""``jitserve gateway`` (the real CLI, through jitserve.gateway.cli.gateway_command) in its
own process on free loopback ports, in front of the sidecars a test started."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from jitserve.bench.stream import StreamResult, stream_completion
from jitserve.devstack import vllm as vl
from jitserve.gateway.cli import gateway_command
from jitserve.gateway.proxy import REPLICA_HEADER

from .http import get_json, get_text
from .processes import OnFreePorts
from .waiting import wait_until

PATIENT = ("--report-max-age", "60")
"""Gateway flags for a test whose subject is not a replica's silence: a report late on a
busy machine does not hide its replica from the picks (by default, after 1 s it does)."""


class Replica(Protocol):
    """What the gateway is told of a sidecar (a :class:`~.sidecar.SidecarProcess`)."""

    url: str
    admin_url: str
    port: int


class GatewayProcess(OnFreePorts):
    def __init__(self, sidecars: Sequence[Replica], log_path: Path, *,
                 extra_args: list[str] | None = None) -> None:
        self.names = [f"127.0.0.1:{s.port}" for s in sidecars]
        """Each sidecar's replica name, in the order given."""
        self._replicas = [(s.url, s.admin_url) for s in sidecars]
        self._extra = ["--log-level", "INFO", *(extra_args or [])]
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.start()

    def launch(self) -> None:
        self.port, self.admin_port = vl.free_port(), vl.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.admin_url = f"http://127.0.0.1:{self.admin_port}"
        cmd = gateway_command(self._replicas, self.port, self.admin_port, extra=self._extra)
        self.proc = vl.start_process(cmd, self._log)

    def wait_ready(self, replicas: int | None = None, timeout_s: float = 120.0) -> GatewayProcess:
        """Until the gateway serves and ``replicas`` (default: all) are in its picks."""
        want = len(self.names) if replicas is None else replicas
        if not self.wait_serving(lambda: self.admin_url + "/health", timeout_s):
            raise AssertionError(f"gateway not up; log:\n{vl.tail(self.log_path)}")
        wait_until(f"{want} replicas in the picks", lambda: len(self.ready()) >= want, timeout_s)
        return self

    def ready(self) -> list[str]:
        """The replicas in the gateway's picks now (its /ready)."""
        _, doc = get_json(self.admin_url + "/ready")
        replicas: list[str] = (doc or {}).get("replicas", [])
        return replicas

    def metrics(self) -> str:
        return get_text(self.admin_url + "/metrics")

    def info(self) -> dict[str, Any]:
        _, doc = get_json(self.admin_url + "/ready")
        result: dict[str, Any] = doc or {}
        return result

    def close(self) -> None:
        vl.stop_process(self.proc)
        self._log.close()


def nothing_lost(results: list[StreamResult], max_tokens: int) -> dict[str, int]:
    """Every request got all its ``max_tokens``, or an error event after some, or a
    429/503 before any (never silently short); how many of each."""
    seen = {"whole": 0, "error_event": 0, "refused": 0}
    for r in results:
        if r.status in (429, 503):
            assert not r.token_ids, r
            seen["refused"] += 1
        elif r.status == 200 and len(r.token_ids) == max_tokens and r.error is None:
            seen["whole"] += 1
        else:
            assert r.status == 200 and r.error is not None, r
            seen["error_event"] += 1
    return seen


async def streams_until(session: aiohttp.ClientSession, url: str, doc: dict[str, Any],
                        landed: Callable[[], bool], *, tries: int = 8,
                        wait_s: float = 30.0) -> list[asyncio.Task[StreamResult]]:
    """Start streams of ``doc`` two at a time until ``landed()`` (e.g. tokens flowing on the
    replica a fault is about to hit): round-robin gives each of two replicas one of a pair,
    unless a late report (a busy machine) hides one from the picks a while. Fails naming
    where the streams went."""
    tasks: list[asyncio.Task[StreamResult]] = []
    for _ in range(tries):
        tasks += [asyncio.create_task(stream_completion(session, url, doc)) for _ in range(2)]
        with contextlib.suppress(AssertionError):
            await asyncio.to_thread(wait_until, "a stream to land", landed, wait_s)
            return tasks
    went = [r.headers.get(REPLICA_HEADER) for r in await asyncio.gather(*tasks)]
    raise AssertionError(f"none of {len(tasks)} streams landed where wanted; they went to {went}")


def until_every_replica_chosen(place: Callable[[], str], names: Sequence[str],
                               tries: int = 40) -> set[str]:
    """Call ``place`` (one request; the replica that served it) until every one of
    ``names`` has served one, or ``tries`` ran out: round-robin reaches them all, unless a
    late report hides one a while. The replicas chosen."""
    chosen: set[str] = set()
    for _ in range(tries):
        chosen.add(place())
        if chosen >= set(names):
            break
    return chosen
