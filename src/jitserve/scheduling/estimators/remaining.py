"""The remaining output length as a distribution: log-normal, fitted to the estimator's
two figures (its expected length and its q-quantile bound), so a scheduler can ask how
likely a request is to finish within a number of steps."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


def normal_cdf(z: FloatArray) -> FloatArray:
    """Standard normal CDF (Abramowitz and Stegun 7.1.26, error < 1.5e-7)."""
    x = np.abs(z) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * x)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    erf = 1.0 - poly * np.exp(-x * x)
    return 0.5 * (1.0 + np.sign(z) * erf)


def normal_quantile(q: float) -> float:
    """Inverse standard normal CDF by bisection on :func:`normal_cdf` (called per config)."""
    low, high = -8.0, 8.0
    for _ in range(60):
        mid = (low + high) / 2
        if normal_cdf(np.array([mid]))[0] < q:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def p_within(
    typical: FloatArray, bound: FloatArray, tokens: FloatArray, z_q: float
) -> FloatArray:
    """P(remaining output <= ``tokens``) when the remaining output is log-normal with
    mean ``typical`` and q-quantile ``bound`` (the estimator's expected length and bound,
    both what is left after the tokens generated). Equal mean and bound (exact lengths):
    a step at ``typical``."""
    gap = np.log(np.maximum(bound, 1.0)) - np.log(np.maximum(typical, 1.0))
    disc = np.maximum(z_q * z_q - 2.0 * np.maximum(gap, 0.0), 0.0)
    sigma = np.maximum(z_q - np.sqrt(disc), 1e-3)
    mu = np.log(np.maximum(typical, 1.0)) - sigma * sigma / 2
    with np.errstate(divide="ignore"):
        z = (np.log(np.maximum(tokens, 1e-9)) - mu) / sigma
    return np.where(tokens <= 0, 0.0, normal_cdf(z))
