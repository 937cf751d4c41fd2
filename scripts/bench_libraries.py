"""Where jitserve keeps a hand-written part beside a well-kept library, this measures both.

    python scripts/bench_libraries.py

- Percentiles of per-token times (``goodput.LogHistogram``, 1% buckets) against ``ddsketch``
  (1% relative accuracy) and ``hdrhistogram`` (3 significant digits, microseconds): the
  scalar add (one per streamed token in the simulator and the live bench), the vectorized
  add, a percentile, and the relative error at p50/p99 on log-normal times.
- SSE reading (``jitserve.sse``) against ``httpx-sse``'s decoder on vLLM-shaped events.

The libraries are not jitserve's dependencies; install them to run this
(``pip install ddsketch hdrhistogram httpx-sse``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np


def per_call_us(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) / calls * 1e6


def percentiles() -> None:
    from ddsketch import DDSketch
    from hdrh.histogram import HdrHistogram

    from jitserve.goodput import LogHistogram

    rng = np.random.default_rng(7)
    values = rng.lognormal(mean=np.log(0.03), sigma=0.8, size=200_000)
    scalars = values.tolist()
    exact = {q: float(np.percentile(values, q)) for q in (50, 99)}
    print(f"{'sketch':<14}{'add us':>8}{'add_many us/value':>19}{'percentile us':>15}"
          f"{'err p50':>9}{'err p99':>9}")

    def row(name: str, add: Callable[[float], object], add_many: Callable[[], object] | None,
            pct: Callable[[float], float]) -> None:
        add_us = per_call_us(lambda: [add(v) for v in scalars], len(scalars))
        many_us = per_call_us(add_many, len(scalars)) if add_many else float("nan")
        pct_us = per_call_us(lambda: [pct(99) for _ in range(1000)], 1000)
        errs = [abs(pct(q) - exact[q]) / exact[q] for q in (50, 99)]
        print(f"{name:<14}{add_us:>8.2f}{many_us:>19.3f}{pct_us:>15.1f}"
              f"{errs[0]:>9.2%}{errs[1]:>9.2%}")

    log = LogHistogram()
    row("LogHistogram", log.add, lambda: LogHistogram().add_many(values), log.percentile)
    dd = DDSketch(relative_accuracy=0.01)
    row("ddsketch", dd.add, None, lambda q: float(dd.get_quantile_value(q / 100) or 0.0))
    hdr = HdrHistogram(1, 10_000_000_000, 3)  # microseconds, 1 us to ~3 h
    row("hdrhistogram", lambda v: hdr.record_value(int(v * 1e6)), None,
        lambda q: hdr.get_value_at_percentile(q) / 1e6)


def sse_reading() -> None:
    from httpx_sse._decoders import SSEDecoder

    from jitserve import sse

    event = sse.event('{"id": "cmpl-1", "object": "text_completion", "created": 1, '
                      '"model": "m", "choices": [{"index": 0, "text": " word", '
                      '"logprobs": null, "finish_reason": null}]}').encode()
    reads = [event * 4] * 20_000  # vLLM writes a step's events for a stream together
    n = 4 * len(reads)

    def ours() -> None:
        rest = b""
        for chunk in reads:
            events, rest = sse.split(rest + chunk)
            for e in events:
                sse.data(e)

    def httpx_sse() -> None:
        decoder = SSEDecoder()
        for chunk in reads:  # it decodes lines: the caller splits and decodes them first
            for line in chunk.decode().split("\n"):
                decoder.decode(line)

    print(f"\nSSE, per event: jitserve.sse {per_call_us(ours, n):.2f} us, "
          f"httpx-sse {per_call_us(httpx_sse, n):.2f} us")


if __name__ == "__main__":
    percentiles()
    sse_reading()
