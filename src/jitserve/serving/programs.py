"""Compound programs inside the request lifecycle: the program side of its state changes.

Owner: serving (driven only by :class:`~jitserve.serving.lifecycle.Lifecycle`, which calls
it from its own state changes; pure, told the time). For each live
:class:`~jitserve.requests.LiveProgram` it keeps the calls of the current stage that are
still open and when each stage started; it opens a stage with its sub-deadline share
phi(s) from the :class:`~jitserve.scheduling.estimators.StageShareEstimator`, counts the
tokens its calls earned, and ends the program once (finished, expired or retired): the
outcome is scored by :func:`~jitserve.serving.outcomes.program_outcome` and the stage
durations of a program that was not retired go back to the estimator.
"""

from __future__ import annotations

from jitserve.goodput import Outcome
from jitserve.requests import LiveProgram, LiveRequest
from jitserve.scheduling.estimators import StageShareEstimator
from jitserve.serving.outcomes import program_outcome


class LivePrograms:
    """The live compound programs of one lifecycle, their open calls and stage starts."""

    def __init__(self, stage_share: StageShareEstimator) -> None:
        self.stage_share = stage_share
        self._members: dict[LiveProgram, list[LiveRequest]] = {}
        self._stage_starts: dict[LiveProgram, list[float]] = {}

    def begin_stage(
        self, lp: LiveProgram, stage: int, now_s: float, share: float | None, final: bool | None
    ) -> None:
        """See :meth:`Lifecycle.begin_stage <jitserve.serving.lifecycle.Lifecycle.begin_stage>`."""
        assert not lp.ended, "a program that ended has no next stage"
        assert lp.open_members == 0 or stage == lp.stage, "the previous stage is still open"
        if stage != lp.stage or lp not in self._stage_starts:
            lp.prev_stage_share = 0.0 if stage == 0 else lp.stage_share
            lp.stage_share = (
                share if share is not None else self.stage_share.stage_share(lp.program, stage)
            )
            lp.stage = stage
            lp.stage_started_s = now_s
            self._stage_starts.setdefault(lp, []).append(now_s)
        lp.final_stage = final if final is not None else stage + 1 >= len(lp.program.stages)

    def joined(self, lp: LiveProgram, r: LiveRequest) -> None:
        """``r``, a call of ``lp``'s current stage, arrived."""
        assert not lp.ended, "a call arrived for a program that ended"
        lp.open_members += 1
        lp.prompt_tokens += r.req.prompt_tokens
        self._members.setdefault(lp, []).append(r)

    def finished(self, lp: LiveProgram, r: LiveRequest, now_s: float) -> Outcome | None:
        """``r``, a call of ``lp``, finished: ``lp``'s outcome when that was the last call
        of its final stage, else None."""
        lp.open_members -= 1
        lp.attained_tokens += r.generated
        self._members[lp].remove(r)
        if lp.open_members == 0 and lp.final_stage and not lp.ended:
            return self._end(lp, now_s, retired=False)
        return None

    def left(self, lp: LiveProgram, r: LiveRequest) -> None:
        """``r``, a call of ``lp``, left without finishing (retired, cancelled, failed)."""
        lp.open_members -= 1
        members = self._members.get(lp)
        if members is not None and r in members:
            members.remove(r)

    def expire(self, lp: LiveProgram, now_s: float) -> Outcome | None:
        """See :meth:`Lifecycle.expire_program
        <jitserve.serving.lifecycle.Lifecycle.expire_program>`."""
        if lp.ended or lp.open_members > 0 or now_s <= lp.deadline_abs_s:
            return None
        return self._end(lp, now_s, retired=False)

    def retire(self, lp: LiveProgram, now_s: float) -> tuple[Outcome, list[LiveRequest]]:
        """``lp`` is given up on: its outcome, and its calls still open (to retire too)."""
        others = self._members.pop(lp, [])
        return self._end(lp, now_s, retired=True), others

    def _end(self, lp: LiveProgram, now_s: float, retired: bool) -> Outcome:
        lp.ended = True
        lp.retired = retired
        self._members.pop(lp, None)
        starts = self._stage_starts.pop(lp, [])
        if not retired and starts:
            ends = [*starts[1:], now_s]
            self.stage_share.observe_program(
                lp.program, [e - s for s, e in zip(starts, ends, strict=True)]
            )
        return program_outcome(lp, now_s, retired)
