"""Output-length estimators: the scheduler's view of how long a request will run.

A :class:`LengthEstimator` returns an upper bound on a request's *total* output length
given what it has generated so far; the scheduler calls ``bound`` when a request arrives
and again every ``refine_every`` generated tokens, and ``observe`` when one finishes.
Implementations here are in-process and cheap; the analyzer service adds the quantile
regression forest (``jitserve.analyzer``) behind the same interface.
"""

from __future__ import annotations

import bisect
import itertools
from abc import ABC, abstractmethod
from collections import deque

from jitserve.requests import Program, Request

DEFAULT_PRIOR_TOKENS = 256


class LengthEstimator(ABC):
    name: str = "estimator"

    @abstractmethod
    def bound(self, req: Request, generated: int) -> int:
        """Upper bound on total output tokens; always > ``generated``."""

    def expected(self, req: Request, generated: int) -> float:
        """Typical total output length (for expected gain and cost); default: the bound."""
        return float(self.bound(req, generated))

    def observe(self, req: Request, output_tokens: int) -> None:  # noqa: B027 - optional hook
        """A request finished with ``output_tokens``; learn from it."""


def _cap(req: Request, value: int, generated: int) -> int:
    bound = max(value, generated + 1)
    if req.max_tokens is not None:
        bound = min(bound, req.max_tokens)
    return max(bound, generated + 1)


class OracleEstimator(LengthEstimator):
    """Exact lengths (simulation only): the oracle baseline's estimator."""

    name = "oracle"

    def bound(self, req: Request, generated: int) -> int:
        if req.output_tokens is None:
            raise ValueError(f"request {req.request_id} has no true length; the oracle needs one")
        return max(req.output_tokens, generated + 1)


class MeanEstimator(LengthEstimator):
    """Global running mean of observed lengths as a point estimate (the paper's
    "without Request Analyzer" ablation). Once a request outgrows the mean, it is
    assumed to be about to finish."""

    name = "mean"

    def __init__(self, prior_tokens: int = DEFAULT_PRIOR_TOKENS) -> None:
        self._total = float(prior_tokens)
        self._count = 1

    def bound(self, req: Request, generated: int) -> int:
        return _cap(req, round(self._total / self._count), generated)

    def expected(self, req: Request, generated: int) -> float:
        return float(self.bound(req, generated))

    def observe(self, req: Request, output_tokens: int) -> None:
        self._total += output_tokens
        self._count += 1


class QuantileEstimator(LengthEstimator):
    """The q-quantile of lengths seen so far (a sliding window), conditioned on the
    tokens already generated: among past lengths longer than ``generated``, the
    q-quantile. The bound therefore relaxes toward the truth as generation proceeds.
    ``expected`` is the conditional mean over the same window."""

    name = "quantile"

    def __init__(
        self,
        quantile: float = 0.95,
        window: int = 4096,
        prior: tuple[int, ...] = (64, 128, 256, 512, 1024),
    ) -> None:
        if not 0 < quantile < 1:
            raise ValueError(f"quantile must be in (0, 1), got {quantile}")
        self.quantile = quantile
        self._window: deque[int] = deque(maxlen=window)
        self._sorted: list[int] = []
        self._prefix: list[int] | None = None  # prefix sums of _sorted, rebuilt lazily
        for length in prior:
            self.observe_length(length)

    def observe_length(self, output_tokens: int) -> None:
        if len(self._window) == self._window.maxlen:
            old = self._window[0]
            del self._sorted[bisect.bisect_left(self._sorted, old)]
        self._window.append(output_tokens)
        bisect.insort(self._sorted, output_tokens)
        self._prefix = None

    def observe(self, req: Request, output_tokens: int) -> None:
        self.observe_length(output_tokens)

    def bound(self, req: Request, generated: int) -> int:
        lengths = self._sorted
        start = bisect.bisect_right(lengths, generated)
        tail = len(lengths) - start
        if tail == 0:
            return _cap(req, 2 * generated + 1, generated)
        return _cap(req, lengths[start + min(tail - 1, int(self.quantile * tail))], generated)

    def expected(self, req: Request, generated: int) -> float:
        lengths = self._sorted
        start = bisect.bisect_right(lengths, generated)
        tail = len(lengths) - start
        if tail == 0:
            return float(_cap(req, 2 * generated + 1, generated))
        if self._prefix is None:
            self._prefix = [0, *itertools.accumulate(lengths)]
        mean = (self._prefix[-1] - self._prefix[start]) / tail
        return float(_cap(req, round(mean), generated))


class StageShareEstimator(ABC):
    """phi(s) for compound programs: the share of the program's time budget that should
    be used up when stage ``stage`` (0-based) ends. The scheduler sets the stage
    sub-deadline to ``phi(s) * D``."""

    name: str = "stage-share"

    @abstractmethod
    def stage_share(self, program: Program, stage: int) -> float:
        """A value in (0, 1], non-decreasing in ``stage``; 1 for the last stage."""

    def observe_program(self, program: Program, stage_seconds: list[float]) -> None:  # noqa: B027
        """A program finished; ``stage_seconds[s]`` is how long stage s took (incl. tools)."""


class UniformStageShare(StageShareEstimator):
    """No history: assume the program has as many stages as the longest seen, each
    taking an equal share (until the last known stage, which gets the rest)."""

    name = "uniform"

    def __init__(self, expected_stages: int = 4) -> None:
        self.expected_stages = expected_stages

    def stage_share(self, program: Program, stage: int) -> float:
        return min(1.0, (stage + 1) / max(self.expected_stages, stage + 1))

    def observe_program(self, program: Program, stage_seconds: list[float]) -> None:
        self.expected_stages = max(self.expected_stages, len(stage_seconds))


class OracleStageShare(StageShareEstimator):
    """Exact program graph (simulation only): the share of the program's ideal
    execution time (prefill + decode of the longest call per stage + tool time) that is
    done by the end of each stage."""

    name = "oracle"

    def __init__(self, prefill_s_per_token: float = 1e-4, decode_s_per_token: float = 0.03) -> None:
        self.prefill_s_per_token = prefill_s_per_token
        self.decode_s_per_token = decode_s_per_token

    def stage_share(self, program: Program, stage: int) -> float:
        times = [
            max(
                c.prompt_tokens * self.prefill_s_per_token
                + c.output_tokens * self.decode_s_per_token
                for c in s.calls
            )
            + s.tool_s
            for s in program.stages
        ]
        total = sum(times)
        return 1.0 if stage >= len(times) - 1 or total <= 0 else sum(times[: stage + 1]) / total
