"""Client against a real loopback server, an unreachable address and a slow server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest
from prometheus_client import REGISTRY

from jitserve.analyzer.client import (
    AnalyzerClient,
    AsyncAnalyzerClient,
    RemoteLengthEstimator,
    RemoteStageShare,
)
from jitserve.analyzer.corpus import program_corpus
from jitserve.analyzer.qrf_model import LengthModel, LengthQuery
from jitserve.analyzer.service_core import AnalyzerCore
from jitserve.requests import Request
from jitserve.scheduling.estimators import QuantileEstimator, UniformStageShare
from jitserve.slo import DeadlineSLO
from tests.support.analyzer import RunningAnalyzer
from tests.support.ports import DeadPort
from tests.support.waiting import wait_until


def _req(i: int, prompt: int = 300, app: str = "chat") -> Request:
    return Request(f"c{i}", "t", DeadlineSLO(20.0), prompt, 0.0, app=app)


def _fallbacks(call: str, reason: str) -> float:
    return REGISTRY.get_sample_value("jitserve_analyzer_client_fallbacks_total",
                                     {"call": call, "reason": reason}) or 0.0


REFUSED_DEADLINE_S = 60.0
"""The deadline of a call to a dead port: a bound against a hang only. The refusal comes
at once (the port is held, nothing listens: tests/support/ports.py), so a fallback counted
``unavailable``, not ``deadline_exceeded``, shows the caller never waited for it (a short
deadline raced the channel's first connect on a busy machine)."""


def test_client_talks_to_the_service(analyzer: RunningAnalyzer, small_model: LengthModel) -> None:
    with AnalyzerClient(analyzer.target, timeout_s=5.0) as client:
        reqs = [_req(1, 4000, "summarize"), _req(2, 30, "chat")]
        assert client.bounds(reqs) == small_model.bounds(
            [LengthQuery(4000, "summarize", "default", "deadline"),
             LengthQuery(30, "chat", "default", "deadline")], 0.95)
        assert client.bounds(reqs, [0, 5000])[1] > 5000
        buffered = analyzer.core.stats().buffered
        client.observe(reqs[0], 321)
        program, seconds = program_corpus(1, 12)[0]
        client.record_program(program, seconds)
        deadline = time.monotonic() + 5
        while analyzer.core.stats().buffered == buffered or len(analyzer.core.history) == 0:
            assert time.monotonic() < deadline, "fire-and-forget sends never arrived"
            time.sleep(0.01)
        assert 0 < client.stage_share(program, 0) <= 1
        stats = client.stats()
        assert stats is not None and stats.ready
        # the local fallback is kept warm with every observation
        assert isinstance(client.fallback, QuantileEstimator)
        assert 321 in client.fallback.observed()


def test_adapters_implement_the_estimator_interfaces(analyzer: RunningAnalyzer) -> None:
    with AnalyzerClient(analyzer.target, timeout_s=5.0) as client:
        lengths, shares = RemoteLengthEstimator(client), RemoteStageShare(client)
        assert lengths.bound(_req(3, 200, "code"), 50) > 50
        program, seconds = program_corpus(1, 13)[0]
        shares.observe_program(program, seconds)
        assert 0 < shares.stage_share(program, len(program.stages) - 1) <= 1


def test_unreachable_service_falls_back_fast_and_counts_it() -> None:
    fallback = QuantileEstimator(0.95)
    # the back-off's clock stands still: a busy machine's pause cannot end the back-off
    with DeadPort() as dead, AnalyzerClient(
            f"127.0.0.1:{dead.port}", timeout_s=REFUSED_DEADLINE_S, fallback=fallback,
            clock=lambda: 0.0) as client:
        before = _fallbacks("predict", "unavailable")
        bounds = client.bounds([_req(1), _req(2)])  # refused: no wait for the deadline
        assert bounds == [fallback.bound(_req(1), 0), fallback.bound(_req(2), 0)]
        assert _fallbacks("predict", "unavailable") == before + 2
        # backing off: no network attempt, still answered and counted
        backoff = _fallbacks("refine", "backoff")
        assert client.bounds([_req(3)], [10])[0] > 10
        assert _fallbacks("refine", "backoff") == backoff + 1
        program, seconds = program_corpus(1, 14)[0]
        client.record_program(program, seconds)  # fire-and-forget: never raises
        client.observe(_req(4), 77)
        assert 77 in fallback.observed()
        # the local stage fallback learned the recorded program's stage count
        assert client.stage_share(program, 0) == pytest.approx(1 / max(4, len(program.stages)))
        assert isinstance(client.stage_fallback, UniformStageShare)
        assert client.stats() is None


class SlowCore(AnalyzerCore):
    def predict(self, queries: Sequence[LengthQuery], generated: Sequence[int],
                request_ids: Sequence[str], quantile: float) -> list[int]:
        time.sleep(1.0)
        return super().predict(queries, generated, request_ids, quantile)


def test_slow_service_hits_the_deadline_and_recovers(small_model: LengthModel) -> None:
    from jitserve.analyzer.service import build_server

    core = SlowCore()
    server, port, _ = build_server(core, "127.0.0.1:0")
    server.start()
    core.use_model(small_model)
    clock = [0.0]
    try:
        with AnalyzerClient(f"127.0.0.1:{port}", timeout_s=0.1, clock=lambda: clock[0]) as client:
            before = _fallbacks("predict", "deadline_exceeded")
            started = time.monotonic()
            assert client.bounds([_req(1)])[0] > 0
            assert time.monotonic() - started < 10  # the 0.1 s deadline cut the 1 s call
            assert _fallbacks("predict", "deadline_exceeded") == before + 1
            assert not client.breaker.allow()
            clock[0] += 1.5  # the back-off has passed: the service is tried again
            assert client.breaker.allow()
            # the service answers again (within the 0.1 s deadline: on a busy machine not
            # every loopback call does, so the first one that does counts)
            wait_until("a Stats answer within the deadline", client.stats, 60)
    finally:
        server.stop(0).wait()


def test_async_client(analyzer: RunningAnalyzer, small_model: LengthModel) -> None:
    async def run(dead: DeadPort) -> tuple[list[int], list[int], float]:
        good = AsyncAnalyzerClient(analyzer.target, timeout_s=5.0)
        bad = AsyncAnalyzerClient(f"127.0.0.1:{dead.port}", timeout_s=REFUSED_DEADLINE_S)
        program, seconds = program_corpus(1, 15)[0]
        try:
            remote = await good.bounds([_req(1, 700, "research")])
            await good.observe(_req(1, 700, "research"), 500)
            await good.record_program(program, seconds)
            share = await good.stage_share(program, 0)
            local = await bad.bounds([_req(2)])
            return remote, local, share
        finally:
            await good.close()
            await bad.close()

    before = _fallbacks("predict", "unavailable")
    with DeadPort() as dead:
        remote, local, share = asyncio.run(run(dead))
    assert remote == small_model.bounds([LengthQuery(700, "research", "default", "deadline")],
                                        0.95)
    assert local[0] > 0 and _fallbacks("predict", "unavailable") == before + 1
    assert 0 < share <= 1


def test_client_validates_its_settings() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        AnalyzerClient("127.0.0.1:1", timeout_s=0)
