"""The replicas a gateway or picker places on, and what each last said of itself
(owner: gateway).

:class:`Fleet` polls every replica's report (``GET ADMIN_URL/v1/replica``, the sidecar's
admin port) every ``period_s`` and keeps the last good one. :meth:`Fleet.reports` is what
placement sees: the replicas whose last report arrived within ``max_age_s`` and says
ready. A poll that fails, times out (``poll_timeout_s``: a SIGSTOPped sidecar answers
nothing) or returns a bad report does not replace the last good one, so the replica
leaves the picks once that one is ``max_age_s`` old, and comes back with its next good
answer. Freshness is judged by the gateway's own clock (when the report arrived), never
by comparing the sidecar's clock with ours; a report that says it is already older than
``max_age_s`` (a sidecar that serves a stuck figure) counts as stale too, when the two
clocks agree to within that.

One exception, Envoy's "panic" rule: when *no* replica has a fresh report (the gateway's
own event loop was starved, or every sidecar's was: a busy machine, not an outage), the
replicas whose last report said ready within ``panic_s`` stay in the picks, so a hiccup
does not turn into 503s for everyone; a replica that really is gone then fails its
request's first byte and the next one is tried. Past ``panic_s`` with no fresh report,
none is in the picks.

Replicas are named two ways (:func:`add_fleet_flags`): ``--replica API_URL,ADMIN_URL``
(fixed) and ``--discover HOST:API_PORT:ADMIN_PORT`` (every A record of HOST, resolved
again every ``resolve_s``: a Kubernetes headless Service; a pod whose address leaves the
record leaves the fleet). A replica's name, :attr:`ReplicaReport.replica`, is the
``host:port`` of its API URL whatever the sidecar calls itself: the name the gateway
forwards to and the picker answers as ``x-gateway-destination-endpoint``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

from jitserve.errors import CLIError
from jitserve.placement.base import ReplicaReport
from jitserve.placement.wire import report_from_json

log = logging.getLogger("jitserve.gateway.fleet")

REPORT_PATH = "/v1/replica"
MAX_REPORT_BYTES = 4 << 20


def replica_name(api_url: str) -> str:
    """``host:port`` of an API URL (the port defaulted from the scheme)."""
    parts = urlsplit(api_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{api_url!r}: not an http(s) URL")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{port}"


@dataclass(slots=True)
class ReplicaState:
    """One replica as the fleet knows it."""

    name: str
    api_url: str
    admin_url: str
    report: ReplicaReport | None = None
    received_s: float = -1e18
    """When (``time.monotonic``) the last good report arrived."""
    error: str | None = "not polled yet"
    """Why the last poll failed (None: it succeeded)."""
    discovered: bool = False

    def fresh(self, now_s: float, max_age_s: float) -> bool:
        return self.report is not None and now_s - self.received_s <= max_age_s

    def pickable(self, now_s: float, max_age_s: float) -> bool:
        return self.fresh(now_s, max_age_s) and self.report is not None and self.report.ready


@dataclass(frozen=True, slots=True)
class Discovery:
    """``--discover HOST:API_PORT:ADMIN_PORT``."""

    host: str
    api_port: int
    admin_port: int


class Fleet:
    """Polls the replicas' reports; :meth:`reports` are the fresh, ready ones."""

    def __init__(
        self,
        replicas: Sequence[tuple[str, str]] = (),
        discover: Sequence[Discovery] = (),
        *,
        period_s: float = 0.1,
        max_age_s: float = 1.0,
        poll_timeout_s: float = 0.5,
        resolve_s: float = 1.0,
        panic_s: float = 5.0,
        on_report: Callable[[ReplicaReport], None] | None = None,
    ) -> None:
        self.period_s = period_s
        self.max_age_s = max_age_s
        self.poll_timeout_s = poll_timeout_s
        self.resolve_s = resolve_s
        self.panic_s = panic_s
        self.discover = tuple(discover)
        self.listeners: list[Callable[[ReplicaReport], None]] = []
        if on_report is not None:
            self.listeners.append(on_report)
        self.replicas: dict[str, ReplicaState] = {}
        for api_url, admin_url in replicas:
            name = replica_name(api_url)
            self.replicas[name] = ReplicaState(name, api_url.rstrip("/"), admin_url.rstrip("/"))
        self._stopping = False
        """Set by :meth:`stop`: the loops end on their next turn even where a cancel was
        swallowed (a poll's own timeout firing with the cancel turns it into a
        TimeoutError, which the poll counts as a failed poll)."""
        self._pollers: dict[str, asyncio.Task[None]] = {}
        self._resolver: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None

    # ---- what placement reads ---------------------------------------------------------
    def reports(self) -> list[ReplicaReport]:
        """The fresh and ready replicas' last reports, in a stable order (by name); with
        none fresh, those ready within ``panic_s`` (module docstring)."""
        now = time.monotonic()
        states = [self.replicas[name] for name in sorted(self.replicas)]
        out = [s.report for s in states if s.pickable(now, self.max_age_s)]
        if not out:
            out = [s.report for s in states if s.pickable(now, self.panic_s)]
        return [r for r in out if r is not None]

    def states(self) -> list[ReplicaState]:
        return [self.replicas[name] for name in sorted(self.replicas)]

    def in_picks(self, replica: str) -> bool:
        """Whether ``replica`` is among :meth:`reports` now."""
        return any(r.replica == replica for r in self.reports())

    def api_url(self, replica: str) -> str:
        """The API base URL of ``replica`` (a name :meth:`reports` gave)."""
        return self.replicas[replica].api_url

    def __contains__(self, replica: str) -> bool:
        return replica in self.replicas

    # ---- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        self._stopping = False
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=1),
            timeout=aiohttp.ClientTimeout(total=self.poll_timeout_s))
        if self.discover:
            await self._resolve_all()
            self._resolver = asyncio.create_task(self._resolve_loop(), name="fleet-resolve")
        for name in list(self.replicas):
            self._start_poller(name)

    async def stop(self) -> None:
        self._stopping = True
        tasks = [t for t in (*self._pollers.values(), self._resolver) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._pollers.clear()
        self._resolver = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def poll_once(self) -> None:
        """Poll every replica now (tests; the pollers do it every ``period_s``)."""
        await asyncio.gather(*(self._poll(self.replicas[n]) for n in list(self.replicas)))

    # ---- polling ----------------------------------------------------------------------
    def _start_poller(self, name: str) -> None:
        if name not in self._pollers:
            self._pollers[name] = asyncio.create_task(self._poll_loop(name),
                                                      name=f"fleet-poll-{name}")

    async def _poll_loop(self, name: str) -> None:
        while name in self.replicas and not self._stopping:
            started = time.monotonic()
            await self._poll(self.replicas[name])
            await asyncio.sleep(max(0.0, self.period_s - (time.monotonic() - started)))

    async def _poll(self, state: ReplicaState) -> None:
        assert self._session is not None, "Fleet.start() first"
        try:
            async with self._session.get(state.admin_url + REPORT_PATH) as resp:
                if resp.status != 200:
                    raise ValueError(f"HTTP {resp.status}")
                body = await resp.content.read(MAX_REPORT_BYTES + 1)
                if len(body) > MAX_REPORT_BYTES:
                    raise ValueError("report over 4 MiB")
            report = report_from_json(json.loads(body))
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as err:
            if state.error is None:
                log.warning("replica %s: report poll failed: %s", state.name,
                            str(err) or type(err).__name__)
            state.error = str(err) or type(err).__name__
            return
        if time.time() - report.at_s > self.max_age_s:
            state.error = f"the report is {time.time() - report.at_s:.1f} s old"
            return
        if state.error is not None:
            log.info("replica %s: reporting (ready=%s)", state.name, report.ready)
        report = dataclasses.replace(report, replica=state.name)
        state.report, state.received_s, state.error = report, time.monotonic(), None
        for listener in self.listeners:
            listener(report)

    # ---- discovery --------------------------------------------------------------------
    async def _resolve_loop(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.resolve_s)
            try:
                await self._resolve_all()
            except Exception:  # a resolver bug must not stop the fleet
                log.exception("replica discovery failed")

    async def _resolve_all(self) -> None:
        found: dict[str, ReplicaState] = {}
        loop = asyncio.get_running_loop()
        for d in self.discover:
            try:
                infos = await loop.getaddrinfo(d.host, d.api_port, type=socket.SOCK_STREAM)
            except OSError as err:
                log.warning("--discover %s: %s (keeping the replicas known)", d.host, err)
                return
            for family, _, _, _, sockaddr in infos:
                ip = str(sockaddr[0])
                host = f"[{ip}]" if family == socket.AF_INET6 else ip
                api, admin = f"http://{host}:{d.api_port}", f"http://{host}:{d.admin_port}"
                found[replica_name(api)] = ReplicaState(replica_name(api), api, admin,
                                                        discovered=True)
        for name, state in found.items():
            if name not in self.replicas:
                log.info("replica %s discovered", name)
                self.replicas[name] = state
                self._start_poller(name)
        for name in [n for n, s in self.replicas.items() if s.discovered and n not in found]:
            log.info("replica %s left the record", name)
            del self.replicas[name]
            task = self._pollers.pop(name, None)
            if task is not None:
                task.cancel()


# ---- the command line -------------------------------------------------------------------
def add_fleet_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("replicas")
    g.add_argument("--replica", action="append", default=[], metavar="API_URL,ADMIN_URL",
                   help="a sidecar: its API URL and its admin URL (repeatable), e.g. "
                   "http://127.0.0.1:8101,http://127.0.0.1:9101")
    g.add_argument("--discover", action="append", default=[], metavar="HOST:API_PORT:ADMIN_PORT",
                   help="every A record of HOST is a sidecar (re-resolved each second: a "
                   "Kubernetes headless Service)")
    g.add_argument("--report-period", type=float, default=0.1, metavar="SECONDS",
                   help="how often each replica's report is polled")
    g.add_argument("--report-max-age", type=float, default=1.0, metavar="SECONDS",
                   help="a replica whose last good report is older leaves the picks (unless "
                   "no replica has a fresh one: then those ready within --panic-seconds)")
    g.add_argument("--panic-seconds", type=float, default=5.0, metavar="SECONDS",
                   help="with no fresh report at all, replicas ready this recently stay in "
                   "the picks (a starved event loop is not an outage); 0: never")


def _parse_replica(value: str) -> tuple[str, str]:
    parts = [p.strip() for p in value.split(",")]
    if len(parts) != 2:
        raise CLIError(f"--replica {value!r}: expected API_URL,ADMIN_URL")
    for url in parts:
        try:
            replica_name(url)
        except ValueError as err:
            raise CLIError(f"--replica: {err}") from None
    return parts[0], parts[1]


def _parse_discovery(value: str) -> Discovery:
    host, _, ports = value.rpartition(":")
    host, _, api = host.rpartition(":")
    try:
        api_port, admin_port = int(api), int(ports)
    except ValueError:
        raise CLIError(f"--discover {value!r}: expected HOST:API_PORT:ADMIN_PORT") from None
    if not host or not (0 < api_port < 65536 and 0 < admin_port < 65536):
        raise CLIError(f"--discover {value!r}: expected HOST:API_PORT:ADMIN_PORT")
    return Discovery(host, api_port, admin_port)


def fleet_from_args(args: argparse.Namespace) -> Fleet:
    replicas = [_parse_replica(v) for v in args.replica]
    discover = [_parse_discovery(v) for v in args.discover]
    if not replicas and not discover:
        raise CLIError("name the replicas: --replica API_URL,ADMIN_URL or "
                       "--discover HOST:API_PORT:ADMIN_PORT")
    period, max_age = getattr(args, "report_period", 0.1), getattr(args, "report_max_age", 1.0)
    panic = getattr(args, "panic_seconds", 5.0)
    if not 0 < period <= max_age:
        raise CLIError("--report-period must be > 0 and at most --report-max-age")
    if panic < 0:
        raise CLIError("--panic-seconds must be >= 0")
    return Fleet(replicas, discover, period_s=period, max_age_s=max_age,
                 poll_timeout_s=max_age * 0.75, panic_s=panic)
