import numpy as np
import pytest

from jitserve.goodput import (
    GoodputLedger,
    LogHistogram,
    Outcome,
    deadline_goodput,
    latency_tokens_on_time,
)
from jitserve.slo import LatencySLO, SLOKind


def test_latency_tokens_counted_against_their_timeline() -> None:
    # arrival 0, ttft 1 s, tbt 0.5 s: token i due at 1 + 0.5 i
    times = np.array([0.9, 1.6, 2.0, 3.5, 3.6])  # due: 1.0, 1.5, 2.0, 2.5, 3.0
    slo = LatencySLO(1.0, 0.5)
    assert latency_tokens_on_time(times, 0, 0.0, slo) == 2  # token 0 and token 2 (exactly due)
    # a later segment of the same request starting at token 3: due 2.5, 3.0
    assert latency_tokens_on_time(np.array([2.4, 3.1]), 3, 0.0, slo) == 1


def test_late_first_token_can_catch_up() -> None:
    # first token 0.3 s late, then tokens every 0.2 s against a 0.5 s tbt
    times = 1.3 + 0.2 * np.arange(5)
    assert latency_tokens_on_time(times, 0, 0.0, LatencySLO(1.0, 0.5)) == 4


def test_deadline_goodput_is_all_or_nothing() -> None:
    assert deadline_goodput(100, 20, finish_s=9.99, deadline_abs_s=10.0) == 120
    assert deadline_goodput(100, 20, finish_s=10.01, deadline_abs_s=10.0) == 0


def test_ledger_attainment_per_kind_tenant_and_class() -> None:
    ledger = GoodputLedger()
    ledger.record(Outcome("a", SLOKind.LATENCY, "chat", 10, 5, 5, True, ttft_s=0.5, e2el_s=1.0))
    ledger.record(Outcome("a", SLOKind.DEADLINE, "batch", 10, 5, 0, False, e2el_s=30.0))
    ledger.record(Outcome("b", SLOKind.DEADLINE, "batch", 10, 5, 15, True, e2el_s=3.0))
    assert ledger.attainment() == {"latency": 1.0, "deadline": 0.5, "overall": pytest.approx(2 / 3)}
    assert ledger.by_tenant["a"].attainment == 0.5
    assert ledger.by_class["batch"].goodput_tokens == 15
    assert ledger.overall.goodput_tokens == 20


def test_histogram_percentiles_within_one_percent() -> None:
    hist = LogHistogram()
    values = np.random.default_rng(0).lognormal(0, 1, 20000)
    hist.add_many(values)
    for q in (50, 99):
        assert hist.percentile(q) == pytest.approx(np.percentile(values, q), rel=0.02)


def test_scalar_adds_bin_as_the_vectorized_add_does() -> None:
    values = np.random.default_rng(1).lognormal(-3, 1, LogHistogram.BATCH + 123)
    one_by_one, at_once, merged = LogHistogram(), LogHistogram(), LogHistogram()
    for v in values.tolist():
        one_by_one.add(v)
    at_once.add_many(values)
    half = LogHistogram()
    for v in values[:500].tolist():
        half.add(v)  # still pending when merged
    merged.add_many(values[500:])
    merged.merge(half)
    for q in (1, 50, 99, 100):
        assert one_by_one.percentile(q) == at_once.percentile(q) == merged.percentile(q)
    assert one_by_one.total == merged.total == values.size
