"""Compound programs as the sidecar sees them (owner: sidecar): one call at a time.

The simulator knows a program's whole stage graph upfront; the sidecar learns it from
each call's ``slo`` fields (``program_id``, ``stage``, ``stages`` hint, ``final``). This
book keeps one :class:`~jitserve.requests.LiveProgram` per (tenant, program id), opens
stages in the request lifecycle with the analyzer's stage share phi(s) (or the local
fallback: an equal share per declared stage), records the calls each stage really made,
and, when a program ends, sends its stage durations to the analyzer's pattern history.
A program ends when the calls of its ``final`` stage are done, or, if the client never
says which stage is final, at its deadline (scored as missed).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from jitserve.goodput import Outcome
from jitserve.requests import LiveProgram, LLMCall, Program, Stage
from jitserve.scheduling.estimators import StageShareEstimator
from jitserve.serving.lifecycle import Lifecycle
from jitserve.sidecar.api import ProgramRef
from jitserve.slo import CompoundSLO

log = logging.getLogger("jitserve.sidecar")

DEFAULT_STAGES = 4


class StageShares(Protocol):
    """The analyzer client's program calls
    (:class:`jitserve.analyzer.client.AsyncAnalyzerClient`)."""

    async def stage_share(self, program: Program, stage: int) -> float: ...

    async def record_program(self, program: Program, stage_seconds: list[float]) -> None: ...


class DeclaredStageShare(StageShareEstimator):
    """Local fallback: each of the program's declared (or default) stages gets an equal
    share of its deadline."""

    name = "declared"

    def stage_share(self, program: Program, stage: int) -> float:
        return min(1.0, (stage + 1) / max(len(program.stages), stage + 1))


class ProgramBook(StageShareEstimator):
    """Also the lifecycle's stage-share estimator, so that a finished program's stage
    durations reach the analyzer with the calls each stage really made."""

    name = "sidecar-programs"

    def __init__(self, analyzer: StageShares | None = None) -> None:
        self.analyzer: StageShares | None = analyzer
        self.local = DeclaredStageShare()
        self.programs: dict[tuple[str, str], LiveProgram] = {}
        self._calls: dict[Program, list[list[LLMCall]]] = {}
        self._background: set[asyncio.Task[None]] = set()

    async def join(
        self,
        lifecycle: Lifecycle,
        ref: ProgramRef,
        tenant: str,
        slo: CompoundSLO,
        slo_class: str,
        call: LLMCall,
        now_s: float,
    ) -> LiveProgram:
        """The program a compound call belongs to, its stage opened in ``lifecycle``."""
        key = (tenant, ref.program_id)
        lp = self.programs.get(key)
        if lp is not None and (lp.ended or (lp.open_members <= 0 and ref.stage < lp.stage)):
            lp = None  # the id is used again for a new program
        opened = lp is None
        if lp is None:
            stages = max(ref.stages or DEFAULT_STAGES, ref.stage + 1)
            program = Program(ref.program_id, tenant, now_s, slo,
                              tuple(Stage((call,)) for _ in range(stages)), slo_class=slo_class)
            lp = self.programs[key] = lifecycle.open_program(program)
            self._calls[program] = []
        # a call for a later stage while the current one is open joins the current one
        stage = lp.stage if lp.open_members > 0 else max(ref.stage, lp.stage)
        share = None
        if self.analyzer is not None and (opened or stage != lp.stage):
            share = await self._remote_share(lp.program, stage)
        if ref.final:
            share = 1.0
        lifecycle.begin_stage(lp, stage, now_s, share=share, final=ref.final)
        return lp

    async def _remote_share(self, program: Program, stage: int) -> float | None:
        assert self.analyzer is not None
        try:
            return await self.analyzer.stage_share(program, stage)
        except Exception as err:  # the client answers from its fallback; never fail a call
            log.warning("analyzer stage share failed: %s", err)
            return None

    def call_done(self, lp: LiveProgram, prompt_tokens: int, output_tokens: int) -> None:
        calls = self._calls.get(lp.program)
        if calls is None:
            return
        while len(calls) <= lp.stage:
            calls.append([])
        calls[lp.stage].append(LLMCall(prompt_tokens, output_tokens))

    def expire(self, lifecycle: Lifecycle, now_s: float) -> list[Outcome]:
        """End programs past their deadline with no call open; forget ended ones."""
        outcomes = []
        for key, lp in list(self.programs.items()):
            outcome = lifecycle.expire_program(lp, now_s)
            if outcome is not None:
                outcomes.append(outcome)
            if lp.ended:
                del self.programs[key]
                self._calls.pop(lp.program, None)
        return outcomes

    # ---- the lifecycle's stage-share estimator -------------------------------------------
    def stage_share(self, program: Program, stage: int) -> float:
        return self.local.stage_share(program, stage)

    def observe_program(self, program: Program, stage_seconds: list[float]) -> None:
        calls = self._calls.get(program)
        if self.analyzer is None or not calls or any(not stage for stage in calls):
            return
        real = Program(program.program_id, program.tenant, program.arrival_s, program.slo,
                       tuple(Stage(tuple(stage)) for stage in calls), slo_class=program.slo_class)
        durations = stage_seconds[: len(real.stages)]
        if len(durations) != len(real.stages):
            return
        task = asyncio.get_running_loop().create_task(self.analyzer.record_program(real, durations))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
