"""A goodput ledger that also keeps every outcome it scored, for the unit tests."""

from __future__ import annotations

from jitserve.goodput import GoodputLedger, Outcome


class RecordingLedger(GoodputLedger):
    def __init__(self) -> None:
        super().__init__()
        self.outcomes: list[Outcome] = []

    def record(self, o: Outcome) -> None:
        super().record(o)
        self.outcomes.append(o)
