"""The live bench's bookkeeping: what the sidecar shed for load is retired, not an error."""

from __future__ import annotations

import pytest

from jitserve.bench.live import LiveStats
from jitserve.bench.stream import StreamResult


def refused(status: int, code: str, retry_after: bool = True) -> StreamResult:
    return StreamResult(status=status, error={"message": "m", "code": code},
                        headers={"Retry-After": "1"} if retry_after else {})


@pytest.mark.parametrize("code", ["queue_full", "waiting_time_exceeded", "would_start_late",
                                  "ttl_expired", "slo_unreachable"])
def test_a_429_is_shed_for_load_whatever_its_code(code: str) -> None:
    stats = LiveStats()
    stats.count(refused(429, code))
    assert (stats.retired, stats.errors, stats.error_messages) == (1, 0, {code: 1})


def test_a_stream_ended_as_unreachable_is_retired_and_other_faults_are_errors() -> None:
    stats = LiveStats()
    stats.count(StreamResult(status=200, token_ids=[1, 2], token_times=[0.0, 0.1],
                             error={"message": "m", "code": "slo_unreachable"}))
    stats.count(refused(500, "internal_error", retry_after=False))
    stats.count(refused(503, "backend_unavailable", retry_after=False))
    assert (stats.retired, stats.errors) == (1, 2)
    assert stats.refused_without_retry_after == 1
    assert stats.output_tokens == 2 and stats.completed == 0


def test_a_finished_stream_counts_its_tokens_and_pace() -> None:
    stats = LiveStats()
    stats.count(StreamResult(status=200, token_ids=[1, 2, 3], token_times=[1.0, 1.1, 1.3],
                             finish_reason="length"))
    assert (stats.requests, stats.completed, stats.output_tokens, stats.errors) == (1, 1, 3, 0)
    assert stats.tpot.total == 1
