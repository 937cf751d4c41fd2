"""Readiness of the vLLM backend as the sidecar sees it (owner: sidecar).

Readiness only gates new work (``/ready``, 503 for new requests): running streams end by
themselves when the backend is really gone (their connections break) and queued requests
wait. One slow health answer from a loaded server is not an outage: it takes
``failures_to_down`` failed checks in a row to mark a ready backend down.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger("jitserve.sidecar")


class HealthProbe(Protocol):
    base_url: str

    async def health(self) -> bool: ...

    async def models(self) -> dict[str, Any]: ...


class BackendHealth:
    def __init__(
        self,
        probe: HealthProbe,
        on_change: Callable[[bool], None],
        *,
        interval_s: float = 0.5,
        failures_to_down: int = 3,
    ) -> None:
        self.probe = probe
        self.on_change = on_change
        self.interval_s = interval_s
        self.failures_to_down = failures_to_down
        self.ready = False
        self.reason = "backend not checked yet"
        self.models: list[str] = []
        self._failures = 0

    def set(self, ready: bool, reason: str = "") -> None:
        if ready != self.ready:
            log.warning("backend %s%s", "ready" if ready else "NOT ready",
                        f": {reason}" if reason else "")
        self.ready = ready
        self.reason = reason
        if ready:
            self._failures = 0
        self.on_change(ready)

    async def check(self) -> None:
        ok = await self.probe.health()
        if not ok:
            self._failures += 1
            if self.ready and self._failures < self.failures_to_down:
                return
            if self.ready:
                self.set(False, f"health check of {self.probe.base_url} failed")
            else:
                self.reason = f"health check of {self.probe.base_url} failed"
            return
        self._failures = 0
        if self.ready:
            return
        try:
            doc = await self.probe.models()
        except Exception as err:
            self.set(False, f"model list: {err}")
            return
        self.models = [str(m["id"]) for m in doc.get("data", []) if "id" in m]
        if not self.models:
            self.set(False, "the backend serves no model")
            return
        self.set(True)

    async def loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s if not self.ready else 1.0)
            try:
                await self.check()
            except Exception:
                log.exception("health check failed")
