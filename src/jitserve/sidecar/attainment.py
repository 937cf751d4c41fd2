"""SLO attainment over a recent window, per SLO kind, tenant and class (owner: sidecar).

``jitserve_slo_attainment{kind,tenant,slo_class}``: met / (met + missed + retired)
(:data:`jitserve.goodput.ATTAINMENT_OUTCOMES`) of the requests that ended in the last
``window_s`` seconds, computed when Prometheus scrapes; a label set with nothing counted
in the window is absent, not 0. The counters (``jitserve_requests_total{outcome}``) keep
the lifetime story; this is the figure an SRE alerts on without writing the ratio.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from jitserve.goodput import ATTAINMENT_OUTCOMES

WINDOW_S = 300.0
"""The SLOPolicy status's default window (spec.reporting.attainmentWindowSeconds)."""

Key = tuple[str, str, str]  # kind, tenant, slo_class


class AttainmentWindow(Collector):
    def __init__(self, window_s: float = WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self._ended: dict[Key, deque[tuple[float, bool]]] = {}

    def record(self, kind: str, tenant: str, slo_class: str, outcome: str) -> None:
        if outcome in ATTAINMENT_OUTCOMES:
            key = (kind, tenant, slo_class)
            self._ended.setdefault(key, deque()).append((self.clock(), outcome == "met"))

    def values(self) -> dict[Key, float]:
        """Attainment of each label set with requests in the window."""
        oldest = self.clock() - self.window_s
        out: dict[Key, float] = {}
        for key, ended in list(self._ended.items()):
            while ended and ended[0][0] < oldest:
                ended.popleft()
            if not ended:
                del self._ended[key]
                continue
            out[key] = sum(met for _, met in ended) / len(ended)
        return out

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "jitserve_slo_attainment",
            f"Share of the requests that ended in the last {self.window_s:g} s that met "
            "their SLO: met / (met + missed + retired), as a ratio (0-1).",
            labels=["kind", "tenant", "slo_class"])
        for (kind, tenant, slo_class), value in sorted(self.values().items()):
            family.add_metric([kind, tenant, slo_class], value)
        yield family
