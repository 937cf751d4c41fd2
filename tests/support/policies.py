"""A policy for tests of the stages around a policy's own (overload control): a FIFO whose
one stage records what it saw at each frame and plans nothing."""

from __future__ import annotations

from jitserve.policy import SLOPolicySpec
from jitserve.requests import LiveRequest
from jitserve.scheduling.frame import Frame, Stage
from jitserve.scheduling.overload import OverloadControl
from jitserve.scheduling.staged import StagedPolicy


class Recorder:
    name = "record"

    def __init__(self) -> None:
        self.seen: list[set[str]] = []

    def configure(self, spec: SLOPolicySpec) -> None:
        pass

    def run(self, frame: Frame) -> None:
        self.seen.append({r.req.request_id for r in (*frame.running, *frame.queue.rows)})


class Spy(StagedPolicy):
    name = "spy"

    def __init__(
        self, spec: SLOPolicySpec | None = None, overload: OverloadControl | None = None
    ) -> None:
        super().__init__(overload)
        self.recorder = Recorder()
        self.configure(spec or SLOPolicySpec())

    @property
    def seen(self) -> list[set[str]]:
        """The requests (running and waiting) the policy's own stage saw, per frame."""
        return self.recorder.seen

    def enqueue(self, r: LiveRequest, now_s: float) -> None:
        self.queue.push(r, r.req.arrival_s)

    def profile(self, spec: SLOPolicySpec) -> list[Stage]:
        return [self.recorder]
