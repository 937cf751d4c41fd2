"""Placement policies by name (``--placement``, the gateway's and picker's flag)."""

from __future__ import annotations

from collections.abc import Callable

from jitserve.errors import CLIError
from jitserve.placement.base import Placer
from jitserve.placement.power_of_k import PowerOfK
from jitserve.placement.simple import LeastLoaded, PowerOfTwo, RoundRobin
from jitserve.policy import SLOPolicySpec

PLACERS: dict[str, Callable[[int, SLOPolicySpec | None], Placer]] = {
    "round-robin": lambda seed, spec: RoundRobin(),
    "least-loaded": lambda seed, spec: LeastLoaded(),
    "power-of-two": lambda seed, spec: PowerOfTwo(seed),
    "power-of-k": lambda seed, spec: PowerOfK(seed, spec=spec),
}
"""``power-of-k``: K = M (every eligible replica), the default weights, GMAX's settings
from ``spec`` (the SLOPolicy the replicas serve; None: the defaults); the simulator and
tests build :class:`PowerOfK` directly for other K or weights."""


def make_placer(name: str, seed: int = 0, spec: SLOPolicySpec | None = None) -> Placer:
    try:
        return PLACERS[name](seed, spec)
    except KeyError:
        raise CLIError(
            f"unknown placement {name!r}; choose from {', '.join(sorted(PLACERS))}"
        ) from None


def use_policy(placer: Placer, spec: SLOPolicySpec) -> None:
    """A reloaded SLOPolicy reaches the placer that scores with it (power-of-k)."""
    if isinstance(placer, PowerOfK):
        placer.priorities.use(spec)
