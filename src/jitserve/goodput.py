"""Goodput and SLO-attainment accounting (DESIGN.md request model table).

| kind        | counts toward goodput when                                                |
|-------------|---------------------------------------------------------------------------|
| latency     | output token i (0-based) is delivered by ``arrival + ttft + i * tbt``      |
| deadline    | all input + output tokens, if the last token is delivered by the deadline |
| compound    | all tokens of all sub-requests, if the program's last one finishes in time |
| best effort | as deadline, with the policy's default deadline                           |

A request *meets* its SLO when all its countable tokens count (a latency request: every
output token on its timeline). Engines report what happened (:class:`Outcome`); the
:class:`GoodputLedger` aggregates per kind, tenant and SLO class with bounded memory.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from jitserve.slo import SLO, LatencySLO, SLOKind


def latency_tokens_on_time(
    token_times: npt.NDArray[np.float64],
    first_index: int,
    arrival_s: float,
    slo: LatencySLO,
) -> int:
    """How many of the tokens ``first_index, first_index+1, ...`` delivered at
    ``token_times`` meet the latency timeline ``arrival + ttft + i * tbt``."""
    if token_times.size == 0:
        return 0
    due = slo.due_s(arrival_s, first_index + np.arange(token_times.size))
    return int(np.count_nonzero(token_times <= due + 1e-9))


def goodput_if_met(slo: SLO, input_tokens: float, output_tokens: float) -> float:
    """The goodput tokens a request earns by meeting its SLO: a latency request's output
    tokens (its prompt never counts), every other kind's input and output tokens. A
    tenant's demand is the sum over what it sent: the same units as the goodput its fair
    share is a share of (issue 27)."""
    if isinstance(slo, LatencySLO):
        return output_tokens
    return input_tokens + output_tokens


def deadline_goodput(
    input_tokens: int, output_tokens: int, finish_s: float, deadline_abs_s: float
) -> int:
    return input_tokens + output_tokens if finish_s <= deadline_abs_s + 1e-9 else 0


def score_request(
    slo: SLO,
    input_tokens: int,
    output_tokens: int,
    finish_s: float,
    deadline_abs_s: float,
    ontime_tokens: int = 0,
) -> tuple[int, bool]:
    """(goodput tokens, SLO met) of one finished request: latency requests earn their
    on-time tokens (``ontime_tokens``, see :func:`latency_tokens_on_time`) and meet the
    SLO when every output token was on time; the other kinds earn all their tokens if
    they finished by ``deadline_abs_s``."""
    if isinstance(slo, LatencySLO):
        return ontime_tokens, output_tokens > 0 and ontime_tokens == output_tokens
    goodput = deadline_goodput(input_tokens, output_tokens, finish_s, deadline_abs_s)
    return goodput, finish_s <= deadline_abs_s + 1e-9


ATTAINMENT_OUTCOMES = ("met", "missed", "retired")
"""The outcomes attainment counts: met / (met + missed + retired). A cancelled request
(its client left), one whose queue TTL expired, or an error is not the scheduler's
verdict and counts in neither part (the sidecar's gauge and the SLOPolicy status)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one finished (or retired) request or compound program earned."""

    tenant: str
    kind: SLOKind
    slo_class: str
    input_tokens: int
    output_tokens: int
    goodput_tokens: int
    met: bool
    retired: bool = False
    ttft_s: float | None = None
    e2el_s: float | None = None
    arrival_s: float | None = None
    """When the request (or program) arrived; None where the recorder does not say."""


class LogHistogram:
    """Fixed log-spaced buckets (1% wide) from 0.1 ms to ~3 h: percentiles in O(1) memory.

    Hand-written beside ``ddsketch`` and ``hdrhistogram`` because it measures better where
    it is used (``scripts/bench_libraries.py``, docs/design.md "Libraries"): a streamed
    token's time is appended and binned in batches of :attr:`BATCH` with numpy, ~10x cheaper
    per token than either library's add, at ddsketch's accuracy."""

    LOW = 1e-4
    GROWTH = 1.01
    BUCKETS = int(math.log(1e4 / 1e-4) / math.log(1.01)) + 2
    BATCH = 4096

    def __init__(self) -> None:
        self._counts = np.zeros(self.BUCKETS, dtype=np.int64)
        self._binned = 0
        self._pending: list[float] = []

    @property
    def total(self) -> int:
        """Values added, binned or still pending."""
        return self._binned + len(self._pending)

    def _index(self, values: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
        scaled = np.log(np.maximum(values, self.LOW) / self.LOW) / math.log(self.GROWTH)
        return np.minimum(scaled.astype(np.int64) + 1, self.BUCKETS - 1)

    def add(self, value: float) -> None:
        self._pending.append(value)
        if len(self._pending) >= self.BATCH:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, []
            self.add_many(np.asarray(pending, dtype=np.float64))

    def add_many(self, values: npt.NDArray[np.float64]) -> None:
        if values.size:
            self._counts += np.bincount(self._index(values), minlength=self.BUCKETS)
            self._binned += int(values.size)

    def percentile(self, q: float) -> float:
        self._flush()
        if self._binned == 0:
            return math.nan
        rank = q / 100 * self._binned
        index = int(np.searchsorted(np.cumsum(self._counts), max(rank, 1)))
        return 0.0 if index == 0 else self.LOW * self.GROWTH ** (index - 0.5)

    def merge(self, other: LogHistogram) -> None:
        self._flush()
        other._flush()
        self._counts += other._counts
        self._binned += other._binned


@dataclass(slots=True)
class Tally:
    requests: int = 0
    met: int = 0
    retired: int = 0
    goodput_tokens: int = 0
    tokens: int = 0
    output_tokens: int = 0

    def add(self, o: Outcome) -> None:
        self.requests += 1
        self.met += o.met
        self.retired += o.retired
        self.goodput_tokens += o.goodput_tokens
        self.tokens += o.input_tokens + o.output_tokens
        self.output_tokens += o.output_tokens

    @property
    def attainment(self) -> float:
        return self.met / self.requests if self.requests else math.nan


@dataclass
class GoodputLedger:
    """Aggregates outcomes; memory does not grow with the number of requests."""

    overall: Tally = field(default_factory=Tally)
    by_kind: dict[SLOKind, Tally] = field(default_factory=lambda: defaultdict(Tally))
    by_tenant: dict[str, Tally] = field(default_factory=lambda: defaultdict(Tally))
    by_class: dict[str, Tally] = field(default_factory=lambda: defaultdict(Tally))
    ttft: LogHistogram = field(default_factory=LogHistogram)
    tbt: LogHistogram = field(default_factory=LogHistogram)
    e2el: LogHistogram = field(default_factory=LogHistogram)

    def record(self, o: Outcome) -> None:
        for tally in (
            self.overall,
            self.by_kind[o.kind],
            self.by_tenant[o.tenant],
            self.by_class[o.slo_class],
        ):
            tally.add(o)
        if o.ttft_s is not None:
            self.ttft.add(o.ttft_s)
        if o.e2el_s is not None:
            self.e2el.add(o.e2el_s)

    def attainment(self) -> dict[str, float]:
        result = {kind.value: tally.attainment for kind, tally in self.by_kind.items()}
        result["overall"] = self.overall.attainment
        return result
