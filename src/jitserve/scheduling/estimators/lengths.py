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
import math
from abc import ABC, abstractmethod
from collections import OrderedDict, deque

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


class ExactEstimator(LengthEstimator):
    """Exact lengths (simulation only): ``gmax-exact`` and the ``-exact`` baselines."""

    name = "exact"

    def bound(self, req: Request, generated: int) -> int:
        if req.output_tokens is None:
            raise ValueError(f"request {req.request_id} has no true length; exact needs one")
        return max(req.output_tokens, generated + 1)


class FrozenBounds(LengthEstimator):
    """No refinement (``mechanisms.refinement: false``): the bound and expected length
    given at arrival are kept until the request outgrows them; then ``inner`` is asked."""

    MAX_TRACKED = 100_000

    def __init__(self, inner: LengthEstimator) -> None:
        self.inner = inner
        self.name = f"{inner.name}-frozen"
        self._first: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def _arrival(self, req: Request) -> tuple[int, float]:
        first = self._first.get(req.request_id)
        if first is None:
            first = (self.inner.bound(req, 0), self.inner.expected(req, 0))
            self._first[req.request_id] = first
            if len(self._first) > self.MAX_TRACKED:  # retired requests are never observed
                self._first.popitem(last=False)
        return first

    def bound(self, req: Request, generated: int) -> int:
        bound = self._arrival(req)[0]
        return bound if generated < bound else self.inner.bound(req, generated)

    def expected(self, req: Request, generated: int) -> float:
        bound, expected = self._arrival(req)
        return expected if generated < bound else self.inner.expected(req, generated)

    def observe(self, req: Request, output_tokens: int) -> None:
        self._first.pop(req.request_id, None)
        self.inner.observe(req, output_tokens)


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


class _Lengths:
    """A sliding window of observed lengths, kept sorted, with lazy prefix sums."""

    def __init__(self, window: int) -> None:
        self._window: deque[int] = deque(maxlen=window)
        self.sorted: list[int] = []
        self._prefix: list[int] | None = None

    def add(self, length: int) -> None:
        if len(self._window) == self._window.maxlen:
            old = self._window[0]
            del self.sorted[bisect.bisect_left(self.sorted, old)]
        self._window.append(length)
        bisect.insort(self.sorted, length)
        self._prefix = None

    def tail(self, generated: int) -> tuple[int, int]:
        """(first index, count) of the lengths longer than ``generated``."""
        start = bisect.bisect_right(self.sorted, generated)
        return start, len(self.sorted) - start

    def quantile(self, start: int, tail: int, q: float) -> int:
        return self.sorted[start + min(tail - 1, int(q * tail))]

    def mean(self, start: int, tail: int) -> float:
        if self._prefix is None:
            self._prefix = [0, *itertools.accumulate(self.sorted)]
        return (self._prefix[-1] - self._prefix[start]) / tail


class QuantileEstimator(LengthEstimator):
    """The q-quantile of lengths seen so far (sliding windows), conditioned on what the
    request says about itself and on the tokens already generated.

    Lengths are kept per feature key, most specific first: (application tag, prompt
    length in quarter-octaves), then the prompt-length bucket alone, then all requests;
    the first window with ``min_samples`` lengths longer than ``generated`` answers.
    Among those lengths the bound is the q-quantile and ``expected`` the mean, so the
    bound relaxes toward the truth as generation proceeds. Every policy that reads
    lengths gets this same model (GMAX, LSF, SJF), so conditioning informs them alike."""

    name = "quantile"
    BUCKETS_PER_OCTAVE = 4

    def __init__(
        self,
        quantile: float = 0.95,
        window: int = 4096,
        prior: tuple[int, ...] = (64, 128, 256, 512, 1024),
        key_window: int = 1024,
        min_samples: int = 32,
        by_features: bool = True,
    ) -> None:
        if not 0 < quantile < 1:
            raise ValueError(f"quantile must be in (0, 1), got {quantile}")
        self.quantile = quantile
        self.min_samples = min_samples
        self.by_features = by_features
        self._key_window = key_window
        self._all = _Lengths(window)
        self._by_key: dict[tuple[str | int, ...], _Lengths] = {}
        for length in prior:
            self.observe_length(length)

    def _keys(self, req: Request) -> tuple[tuple[str | int, ...], ...]:
        bucket = int(self.BUCKETS_PER_OCTAVE * math.log2(max(req.prompt_tokens, 1)))
        return ((req.app, bucket), (bucket,))

    def observed(self) -> list[int]:
        """The lengths in the global window, sorted."""
        return list(self._all.sorted)

    def observe_length(self, output_tokens: int) -> None:
        """A length with no request attached: it informs the global window only."""
        self._all.add(output_tokens)

    def observe(self, req: Request, output_tokens: int) -> None:
        self._all.add(output_tokens)
        if self.by_features:
            for key in self._keys(req):
                window = self._by_key.get(key)
                if window is None:
                    window = self._by_key[key] = _Lengths(self._key_window)
                window.add(output_tokens)

    def _window(self, req: Request, generated: int) -> tuple[_Lengths, int, int]:
        if self.by_features:
            for key in self._keys(req):
                window = self._by_key.get(key)
                if window is not None:
                    start, tail = window.tail(generated)
                    if tail >= self.min_samples:
                        return window, start, tail
        start, tail = self._all.tail(generated)
        return self._all, start, tail

    def bound(self, req: Request, generated: int) -> int:
        window, start, tail = self._window(req, generated)
        if tail == 0:
            return _cap(req, 2 * generated + 1, generated)
        return _cap(req, window.quantile(start, tail, self.quantile), generated)

    def expected(self, req: Request, generated: int) -> float:
        window, start, tail = self._window(req, generated)
        if tail == 0:
            return float(_cap(req, 2 * generated + 1, generated))
        return float(_cap(req, round(window.mean(start, tail)), generated))


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
    """No pattern history, only how many stages past programs had: stage s gets an equal
    share of the program's budget among the stages a program that reached s is expected
    to have, ``phi(s) = (s + 1) / E[stages | stages > s]`` over the last ``window``
    programs (``expected_stages`` before any finished)."""

    name = "uniform"

    def __init__(self, expected_stages: int = 4, window: int = 1000) -> None:
        self.expected_stages = expected_stages
        self._stages: deque[int] = deque(maxlen=window)

    def stage_share(self, program: Program, stage: int) -> float:
        longer = [n for n in self._stages if n > stage]
        expected: float
        if not self._stages:
            expected = max(self.expected_stages, stage + 1)
        elif not longer:
            return 1.0
        else:
            expected = sum(longer) / len(longer)
        return min(1.0, (stage + 1) / expected)

    def observe_program(self, program: Program, stage_seconds: list[float]) -> None:
        self._stages.append(len(stage_seconds))


class ExactStageShare(StageShareEstimator):
    """Exact program graph (simulation only): the share of the program's ideal
    execution time (prefill + decode of the longest call per stage + tool time) that is
    done by the end of each stage."""

    name = "exact"

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
