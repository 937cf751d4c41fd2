"""``scheduler.policy: auto`` in a pod: the tuner beside the sidecar (owner: sidecar).

The dispatcher's lifecycle tells a :class:`~jitserve.serving.traffic.TrafficRecord` of
each arrival and finish. Every ``auto.periodSeconds`` the last warm-up + window of it is
replayed through the simulator once per candidate (:func:`jitserve.tuning.tuner.replay_all`,
on the engine profile ``auto.profile`` or ``--engine-profile`` names) in a worker process
of its own at a lower CPU priority: never on the event loop, whose request path a replay
of 1-3 s of CPU would stall. The decision (:class:`~jitserve.tuning.tuner.Tuner`) is made
here, and a new choice is switched in by the dispatcher (:mod:`.in_effect`). The last
comparison is on ``/debug/scheduler``; the metrics count comparisons and their CPU.

The replays use a copy of the sidecar's local length estimator (with an analyzer, its
bounds come from the analyzer's forest instead: the twin's estimator is then the local
one, fitted on the same finished requests).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Protocol

from jitserve.policy import AUTO, SLOPolicySpec
from jitserve.requests import Workitem
from jitserve.scheduling.estimators import LengthEstimator
from jitserve.serving.lifecycle import Lifecycle
from jitserve.sidecar.metrics import SidecarMetrics
from jitserve.sim.latency import Profile, load_profile
from jitserve.tuning.tuner import Comparison, Trial, Tuner, check_candidates, replay_all

log = logging.getLogger("jitserve.sidecar.tuning")

IDLE_POLL_S = 1.0
"""With auto off, how often the loop looks whether it was turned on."""

Trials = tuple[tuple[Trial, ...], float]


class Replayer(Protocol):
    """Runs :func:`~jitserve.tuning.tuner.replay_all` (its trials and CPU seconds)."""

    async def __call__(self, spec: SLOPolicySpec, profile: Profile,
                       items: Sequence[Workitem], estimator: LengthEstimator) -> Trials: ...


class Steered(Protocol):
    """What the tuner steers: the sidecar's dispatcher."""

    spec: SLOPolicySpec
    lifecycle: Lifecycle

    @property
    def scheduler(self) -> str: ...

    def use_scheduler(self, name: str) -> None: ...


def auto_profile(spec: SLOPolicySpec, engine_profile: str) -> Profile:
    """The engine model ``spec``'s auto replays on (ValueError: no such profile, or a
    candidate no scheduler has)."""
    check_candidates(spec.scheduler.auto)
    return load_profile(spec.scheduler.auto.profile or engine_profile)


def _lower_priority() -> None:
    with contextlib.suppress(OSError):
        os.nice(10)


class ProcessReplayer:
    """:func:`replay_all` in one worker process, started at the first replay (spawned: a
    forked copy of a process with threads and an event loop is unsafe) and niced; one
    that died (killed for memory, say) is started again at the next replay."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None

    async def __call__(self, spec: SLOPolicySpec, profile: Profile,
                       items: Sequence[Workitem], estimator: LengthEstimator) -> Trials:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(1, multiprocessing.get_context("spawn"),
                                             initializer=_lower_priority)
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._pool, replay_all, spec, profile, list(items), estimator)
        except BrokenProcessPool:
            self.close()
            raise

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


class LiveTuner:
    """Compares the candidates on the pod's own traffic and switches the dispatcher."""

    def __init__(self, steered: Steered, metrics: SidecarMetrics, engine_profile: str,
                 replayer: Replayer | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.steered = steered
        self.metrics = metrics
        self.engine_profile = engine_profile
        self.replayer: Replayer = replayer or ProcessReplayer()
        self.clock = clock
        self.tuner: Tuner | None = None
        self.since_s = 0.0
        self.comparisons = 0
        self.last: Comparison | None = None
        self._task: asyncio.Task[None] | None = None

    def configure(self, spec: SLOPolicySpec) -> None:
        """On with ``policy: auto``, off otherwise; new tuner settings start a new
        history (what the old comparisons measured was under other settings)."""
        lifecycle = self.steered.lifecycle
        if spec.scheduler.policy != AUTO:
            self.tuner, lifecycle.observer = None, None
            return
        if self.tuner is not None and self.tuner.spec.scheduler.auto == spec.scheduler.auto:
            self.tuner.spec = spec  # the objective or a policy's knobs: same history
            return
        self.tuner = Tuner(spec, auto_profile(spec, self.engine_profile))
        lifecycle.observer = self.record = self.tuner.record()
        self.since_s = self.clock()

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="jitserve-tuner")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if isinstance(self.replayer, ProcessReplayer):
            self.replayer.close()

    async def _loop(self) -> None:
        while True:
            tuner = self.tuner
            await asyncio.sleep(IDLE_POLL_S if tuner is None else
                                tuner.settings.period_seconds)
            if self.tuner is not None:
                try:
                    await self.tick()
                except Exception:  # a failed comparison keeps the scheduler in effect
                    log.exception("the tuner's comparison failed; the scheduler stays")

    async def tick(self) -> Comparison | None:
        """One comparison, if a window is due; switches the dispatcher on a new choice."""
        tuner, now = self.tuner, self.clock()
        if tuner is None:
            return None
        window = tuner.due(self.record, self.since_s, now)
        if window is None:
            return None
        estimator = self.steered.lifecycle.estimator
        trials, cpu_s = await self.replayer(tuner.spec, tuner.profile, window, estimator)
        if tuner is not self.tuner:  # the settings changed while it ran
            return None
        comparison = tuner.decide(trials, self.steered.scheduler, now, cpu_s)
        self.last, self.comparisons = comparison, self.comparisons + 1
        switch = comparison.choice != comparison.in_effect
        self.metrics.tuner_comparisons.labels("switched" if switch else "kept").inc()
        self.metrics.tuner_cpu.inc(cpu_s)
        if switch:
            log.info("auto: %s -> %s (%s)", comparison.in_effect, comparison.choice,
                     ", ".join(f"{k} {v:.0f}" for k, v in comparison.evidence.items()))
            self.steered.use_scheduler(comparison.choice)
        return comparison

    def explain(self) -> dict[str, Any] | None:
        """The ``auto`` part of ``/debug/scheduler`` (None with auto off)."""
        if self.tuner is None:
            return None
        settings = self.tuner.settings
        out: dict[str, Any] = {
            "in_effect": self.steered.scheduler,
            "candidates": list(settings.candidates),
            "profile": self.tuner.profile.name,
            "period_s": settings.period_seconds,
            "history_s": round(self.clock() - self.since_s, 3),
            "comparisons": self.comparisons,
            "last": None,
        }
        last = self.last
        if last is not None:
            out["last"] = {
                "age_s": round(self.clock() - last.at_s, 3),
                "in_effect": last.in_effect,
                "choice": last.choice,
                "cpu_s": round(last.cpu_s, 4),
                "trials": [{"policy": t.policy, "goodput_tokens": t.goodput_tokens,
                            "met": t.met, "items": t.items,
                            "evidence": last.evidence.get(t.policy)} for t in last.trials],
            }
        return out
