"""Service-level objectives a request can carry (JITServe paper section 3).

Pure data, validated on construction: an invalid value raises :class:`SLOError` naming
the field, so every entry point (CLI, HTTP, CRD) reports the same clear message.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, overload

import numpy as np
import numpy.typing as npt


class SLOKind(StrEnum):
    LATENCY = "latency"
    DEADLINE = "deadline"
    COMPOUND = "compound"
    BEST_EFFORT = "best_effort"


class SLOError(ValueError):
    """An SLO field is missing or out of range; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def _positive(field: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SLOError(field, f"must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise SLOError(field, f"must be a positive finite number of seconds, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class LatencySLO:
    """Token i (0-based) counts when delivered by ``arrival + ttft_s + i * tbt_s``."""

    ttft_s: float
    tbt_s: float
    kind: SLOKind = SLOKind.LATENCY

    def __post_init__(self) -> None:
        _positive("ttft_s", self.ttft_s)
        _positive("tbt_s", self.tbt_s)

    @overload
    def due_s(self, arrival_s: float, token: float) -> float: ...

    @overload
    def due_s(self, arrival_s: float, token: npt.NDArray[Any]) -> npt.NDArray[np.float64]: ...

    def due_s(
        self, arrival_s: float, token: float | npt.NDArray[Any]
    ) -> float | npt.NDArray[np.float64]:
        """When output token ``token`` (0-based; an array of them too) is due: the one
        place the latency timeline is written (the waiting table's ``due0`` column is
        ``arrival + ttft``, :meth:`~jitserve.scheduling.table.Features.token_due`)."""
        return arrival_s + self.ttft_s + token * self.tbt_s


@dataclass(frozen=True, slots=True)
class DeadlineSLO:
    """All input and output tokens count if the last token is delivered by the deadline
    (end-to-end latency ``deadline_s`` after arrival). Best-effort requests use this
    with the policy's default deadline and ``best_effort=True``."""

    deadline_s: float
    best_effort: bool = False

    def __post_init__(self) -> None:
        _positive("deadline_s", self.deadline_s)

    @property
    def kind(self) -> SLOKind:
        return SLOKind.BEST_EFFORT if self.best_effort else SLOKind.DEADLINE


@dataclass(frozen=True, slots=True)
class CompoundSLO:
    """All tokens of every sub-request count if the program's last one finishes by the
    program deadline ``deadline_s`` after the program's arrival."""

    deadline_s: float
    kind: SLOKind = SLOKind.COMPOUND

    def __post_init__(self) -> None:
        _positive("deadline_s", self.deadline_s)


SLO = LatencySLO | DeadlineSLO | CompoundSLO
