"""The batch-latency model the budget rules predict with, fitted online from observed
step times (pure): inside vLLM from the steps it takes (:mod:`jitserve.engine.steps`), in
the simulator from the steps it simulates, warm started from the profile
(:mod:`jitserve.sim.budgeting`), so the simulated rules carry the model's error too.

``t = c0 + c1*T + c2*T^2 + c3*n`` for ``T`` tokens and ``n`` requests in the step: the
fixed cost of a forward pass, the per-token linear layers, attention's growth with the
chunk (``T^2``, kept >= 0 so the model stays convex, which the sliding split needs) and
the per-sequence sampling. Least squares over the latest ``window`` steps, refitted every
``refit_every`` samples; :meth:`step_time` is None until ``min_samples`` steps are seen
(the rules then use the fixed budget).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np
import numpy.typing as npt


class OnlineStepModel:
    def __init__(self, window: int = 512, min_samples: int = 16, refit_every: int = 8) -> None:
        self._rows: deque[tuple[float, float, float, float]] = deque(maxlen=window)
        self.min_samples = min_samples
        self.refit_every = refit_every
        self.coef: tuple[float, float, float, float] | None = None
        self._since_fit = 0

    def observe(self, tokens: int, requests: int, seconds: float) -> None:
        if tokens <= 0 or not 0 < seconds < 60:
            return
        self._rows.append((float(tokens), float(tokens) ** 2, float(requests), seconds))
        self._since_fit += 1
        if len(self._rows) >= self.min_samples and (
                self.coef is None or self._since_fit >= self.refit_every):
            self._fit()

    def _fit(self) -> None:
        data = np.array(self._rows)
        x = np.column_stack([np.ones(len(data)), data[:, 0], data[:, 1], data[:, 2]])
        y = data[:, 3]
        cols = [0, 1, 2, 3]
        coef = np.zeros(4)
        while cols:  # drop a negative term and refit: the model must stay monotone, convex
            sol, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
            bad = [c for c, v in zip(cols, sol, strict=True) if v < 0 and c != 0]
            if not bad:
                coef[cols] = sol
                break
            cols.remove(bad[0])
        coef[0] = max(coef[0], 0.0)
        self.coef = (float(coef[0]), float(coef[1]), float(coef[2]), float(coef[3]))
        self._since_fit = 0

    def step_time(self, decoders: int) -> Callable[[int], float] | None:
        """The predictor the budget rules take: a step of ``decoders`` decodes and ``p``
        prompt tokens (one more request when ``p``); None until the model is fitted."""
        if self.coef is None:
            return None

        def step(p: int) -> float:
            return self.predict(decoders + p, decoders + (1 if p else 0))

        return step

    def predict(self, tokens: int, requests: int) -> float:
        assert self.coef is not None
        c0, c1, c2, c3 = self.coef
        return c0 + c1 * tokens + c2 * tokens * tokens + c3 * requests

    def prefill_alone(self, tokens: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Seconds of a step computing ``tokens`` prompt tokens of one request alone, for
        each entry of ``tokens`` (:meth:`predict`'s law, over an array)."""
        return np.asarray(self.predict(tokens, 1), dtype=np.float64)  # type: ignore[arg-type]

    @property
    def ready(self) -> bool:
        return self.coef is not None
