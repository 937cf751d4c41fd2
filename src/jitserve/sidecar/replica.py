"""What this sidecar tells a gateway about itself: the replica report (owner: sidecar,
served as ``GET /v1/replica`` on the admin port; the fields are
:class:`~jitserve.placement.base.ReplicaReport`'s, the JSON :mod:`jitserve.placement.wire`).

Cheap and fresh: a report is built at most every :data:`MIN_PERIOD_S` and served from
cache otherwise (a gateway fleet polls each sidecar ~10 times a second per gateway
replica), and never served older than :data:`MAX_AGE_S`. Every figure has one owner
elsewhere and is only read here: slots and queue from the lifecycle, the marginal priority
from the policy (:meth:`~jitserve.scheduling.base.Policy.admit_priority`), speeds from the
:class:`~jitserve.serving.speed.SpeedMeter`, programs from the program book, shedding (the
queue is full) from the admission checks. Two figures are measured here: output tokens per
second over the last :data:`RATE_WINDOW_S` (:class:`TokenRate`, fed by the dispatcher),
and vLLM's KV-cache use (:class:`EngineMetrics`, vLLM's ``/metrics`` scraped every
:data:`SCRAPE_S` in the background while reports are asked for, and not at all once no
gateway has asked for :data:`IDLE_S`: a sidecar alone costs its vLLM nothing; only the
KV-cache gauge is asked for, :data:`KV_QUERY`). The scrape and the tokens also say the engine is
alive: a report whose last answered scrape and last token from vLLM are both older than
:data:`ENGINE_STALE_S` says not ready, so a stopped vLLM leaves the gateway's picks in
under two seconds, long before the dispatcher's own health check (three failures in a row)
marks it down, while a busy one that is slow to answer ``/metrics`` but still streams
tokens stays in.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import re
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from jitserve.placement.base import ReplicaReport, program_key
from jitserve.placement.wire import report_to_json
from jitserve.slo import SLOKind

log = logging.getLogger("jitserve.sidecar")

MIN_PERIOD_S = 0.1
MAX_AGE_S = 0.25
RATE_WINDOW_S = 5.0
SCRAPE_S = 0.25
ENGINE_STALE_S = 1.5
IDLE_S = 5.0
"""No report asked for this long: the scrape stops until the next one is."""
KV_GAUGES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
KV_QUERY = "/metrics/?" + "&".join(f"name[]={n}" for n in KV_GAUGES)
"""vLLM's metrics mount (prometheus_client's ASGI app, behind the ``/metrics/`` path)
exposes only the named families: the gauge alone, not every histogram of every route.
A vLLM whose ``/metrics/`` does not filter (or answers no gauge there) is scraped at
``/metrics``, in full, from then on."""
_KV = re.compile(rb"^vllm:(?:kv_cache_usage_perc|gpu_cache_usage_perc)(?:\{[^}]*\})?\s+(\S+)",
                 re.MULTILINE)


class TokenRate:
    """Output tokens per second over the last ``window_s`` (per 0.1 s buckets)."""

    def __init__(self, window_s: float = RATE_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self._buckets: collections.deque[list[float]] = collections.deque()
        self._started = clock()
        self.last_s = -1e18
        """When (``clock``) the last tokens came."""

    def add(self, n: int) -> None:
        now = self.last_s = self.clock()
        slot = round(now, 1)
        if self._buckets and self._buckets[-1][0] == slot:
            self._buckets[-1][1] += n
        else:  # a new bucket (every 0.1 s at most): the time to drop the old ones
            self._buckets.append([slot, float(n)])
            self._trim(now)

    def _trim(self, now: float) -> None:
        while self._buckets and self._buckets[0][0] < now - self.window_s:
            self._buckets.popleft()

    def per_s(self) -> float:
        now = self.clock()
        self._trim(now)
        span = min(self.window_s, max(now - self._started, 0.1))
        return sum(n for _, n in self._buckets) / span


class EngineMetrics:
    """vLLM's KV-cache use from its ``/metrics``, scraped in the background while reports
    are wanted (:meth:`wanted`)."""

    def __init__(self, base_url: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + KV_QUERY
        self.clock = clock
        self.kv_usage = 0.0
        self.scraped_s = -1e18
        """When (monotonic) vLLM last answered its ``/metrics``."""
        self.refused_s = -1e18
        """When vLLM last refused the connection: gone, not slow."""
        self.wanted_s = -1e18
        """When a report was last asked for."""
        self.dormant = False
        """Waiting for a report to be wanted: no scrape runs."""
        self._wake = asyncio.Event()
        self._tried = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def wanted(self) -> None:
        """A report is being built: keep scraping (start again, at once, if idle)."""
        self.wanted_s = self.clock()
        self._wake.set()

    async def awake(self) -> None:
        """Wanted again after a dormant spell: wait for one scrape, at most
        :data:`SCRAPE_S` (under a gateway's poll timeout), so the first report says what
        vLLM answers now rather than "not ready" for the silence."""
        if not self.dormant:
            return
        self._tried.clear()
        self.wanted()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._tried.wait(), SCRAPE_S)

    def idle(self) -> bool:
        return self.clock() - self.wanted_s > IDLE_S

    def answering(self, heard_s: float) -> bool:
        """vLLM answered a scrape, or sent a token (at ``heard_s``), recently, and has
        not refused a connection since."""
        last = max(self.scraped_s, heard_s)
        return last > self.refused_s and self.clock() - last <= ENGINE_STALE_S

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="jitserve-engine-metrics")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        timeout = aiohttp.ClientTimeout(total=ENGINE_STALE_S * 2 / 3)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                if self.idle():
                    self._wake.clear()
                    self.dormant = True
                    await self._wake.wait()
                    self.dormant = False
                await self.scrape(session)
                self._tried.set()
                await asyncio.sleep(SCRAPE_S)

    async def scrape(self, session: aiohttp.ClientSession) -> None:
        try:
            async with session.get(self.url) as resp:
                body = await resp.read()
        except aiohttp.ClientConnectorError:
            self.refused_s = self.clock()
            return
        except (TimeoutError, aiohttp.ClientError, OSError):
            return
        self.scraped_s = self.clock()  # it answers (a vLLM without metrics: 404)
        found = _KV.search(body) if resp.status == 200 else None
        if found is None and self.url != self.base_url + "/metrics":
            self.url = self.base_url + "/metrics"  # no filtering mount: the full page
            log.info("vLLM's /metrics/ does not filter by name: scraping /metrics in full")
            return
        if found is not None:
            with contextlib.suppress(ValueError):
                self.kv_usage = min(max(float(found.group(1)), 0.0), 1.0)


class ReplicaReporter:
    """Builds and caches this sidecar's report. ``dispatcher`` is the sidecar's
    :class:`~jitserve.sidecar.dispatcher.Dispatcher`; ``ready`` is its ``/ready``."""

    def __init__(self, dispatcher: Any, ready: Callable[[], bool], name: Callable[[], str],
                 engine: EngineMetrics) -> None:
        self.dispatcher = dispatcher
        self.ready = ready
        self.name = name
        self.engine = engine
        self._cached: dict[str, Any] | None = None
        self._built_s = -1e18

    def json(self) -> dict[str, Any]:
        now = time.monotonic()
        if self._cached is None or now - self._built_s >= MIN_PERIOD_S:
            self._cached = report_to_json(self.build())
            self._built_s = now
        return self._cached

    def build(self) -> ReplicaReport:
        self.engine.wanted()
        d = self.dispatcher
        life, policy = d.lifecycle, d.policy
        b = d.max_running
        in_engine = len(life.running)
        running = min(in_engine, b)
        by_kind: dict[SLOKind, int] = collections.Counter()
        prefill = output = 0
        waiting_requests = life.waiting
        for r in waiting_requests:
            by_kind[r.req.kind] += 1
        for r in (*life.running, *waiting_requests):  # as the simulator's reports count them
            prefill += max(r.prefill_target - r.prefilled, 0)
            output += max(int(r.expected or r.bound) - r.generated, 0)
        waiting = policy.waiting() + (in_engine - running)
        return ReplicaReport(
            replica=self.name(),
            ready=self.ready() and self.engine.answering(d.report.token_rate.last_s),
            at_s=time.time(),
            max_running=b,
            running=running,
            waiting=waiting,
            waiting_by_kind=dict(by_kind),
            admit_priority=0.0 if running < b and waiting == 0 else policy.admit_priority(),
            decode_s=d.speed.decode_step_s,
            prefill_s=d.speed.prefill_s_per_token,
            tokens_per_s=d.report.token_rate.per_s(),
            kv_usage=self.engine.kv_usage,
            outstanding_tokens=prefill + output,
            programs=frozenset(program_key(tenant, pid) for tenant, pid in d.programs.programs),
            shedding=d.admission.queue_full(),
            token_s=d.speed.token_s,
            prefill_tokens=prefill,
        )
