"""The sidecar's dispatcher in-process (no server process): a fake clock and a FAKE
backend (scripted token streams: what this test controls, a real vLLM cannot be made to
emit on a script), against the same lifecycle the simulator drives.

The parity test replays one arrival / token / finish script twice: through
:class:`~jitserve.serving.lifecycle.Lifecycle` called the way the simulator's engine
calls it, and through the :class:`~jitserve.sidecar.dispatcher.Dispatcher` streaming from
the fake backend; dispatch order, preemptions, retirements and outcomes must be equal.
Speed is frozen in both (each engine measures speed its own way; the policy's inputs must
be the same for its decisions to be comparable).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from jitserve.goodput import Outcome
from jitserve.policy import SLOPolicySpec, load_policy
from jitserve.requests import LiveRequest, Request
from jitserve.scheduling.estimators import QuantileEstimator
from jitserve.scheduling.registry import make_policy
from jitserve.serving.lifecycle import Lifecycle
from jitserve.serving.speed import SpeedMeter
from jitserve.sidecar.api import ProgramRef
from jitserve.sidecar.dispatcher import Dispatcher
from jitserve.sidecar.errors import APIError
from jitserve.sidecar.jobs import EventKind, Job
from jitserve.sidecar.metrics import SidecarMetrics
from jitserve.sidecar.wire import DispatchSink
from jitserve.slo import SLO, CompoundSLO, DeadlineSLO, LatencySLO, SLOKind
from tests.support.ledgers import RecordingLedger
from tests.support.waiting import body_timeout

TICK = 0.05
FRAME_EVERY = 4  # ticks


class FrozenSpeed(SpeedMeter):
    """Speed figures that observations do not move (see the module docstring)."""

    def decode_stretch(self, seconds: float, steps: int, decoders: int) -> None:
        pass

    def prefill_iteration(self, seconds: float, prefill_tokens: int, decoders: int) -> None:
        pass


def frozen() -> FrozenSpeed:
    return FrozenSpeed(decode_step_s=0.02, prefill_s_per_token=2e-3, token_s=2e-3)




@dataclass
class Trace:
    dispatched: list[str] = field(default_factory=list)
    preempted: list[tuple[int, str]] = field(default_factory=list)
    retired: list[tuple[int, str, str]] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)


@dataclass(frozen=True)
class Arrival:
    tick: int
    rid: str
    slo: SLO
    prompt: int
    output: int


def workload() -> list[Arrival]:
    return [
        Arrival(0, "a-long", DeadlineSLO(20.0), 30, 40),
        Arrival(1, "b-chat", LatencySLO(1.0, 0.2), 10, 12),
        Arrival(2, "c-urgent", DeadlineSLO(1.5), 12, 8),
        Arrival(3, "d-doomed", DeadlineSLO(0.05), 4000, 5),
        Arrival(5, "e-late", DeadlineSLO(30.0), 50, 20),
        Arrival(6, "f-chat", LatencySLO(0.5, 0.05), 20, 10),
        Arrival(9, "g-deadline", DeadlineSLO(4.0), 8, 15),
    ]


def request(a: Arrival) -> Request:
    return Request(a.rid, "t1", a.slo, a.prompt, a.tick * TICK, max_tokens=a.output)


class NullExecutor:
    def sync(self, now_s: float) -> None:
        pass

    def stop(self, r: LiveRequest) -> None:
        pass


def drive_like_the_simulator(spec: SLOPolicySpec, batch: int, ticks: int) -> Trace:
    """The lifecycle called in the simulator engine's order each tick: arrivals, the
    frame when due, admission up to the batch, then one token for each running request
    (finishing those at their length)."""
    trace = Trace()
    ledger = RecordingLedger()
    lc = Lifecycle(make_policy(spec), QuantileEstimator(0.95), NullExecutor(), frozen(),
                   ledger=ledger)
    arrivals = workload()
    for k in range(ticks):
        now = k * TICK
        for a in arrivals:
            if a.tick == k:
                lc.arrive(request(a), now)
        if k % FRAME_EVERY == 0:
            result = lc.frame(now, batch)
            trace.preempted += [(k, r.req.request_id) for r in result.preempted]
            trace.retired += [(k, g.request.req.request_id, g.reason.value) for g in result.retired]
        while len(lc.running) < batch:
            r = lc.start_next(now)
            if r is None:
                break
            trace.dispatched.append(r.req.request_id)
        for r in list(lc.running):
            lc.delivered(r, np.array([now]), r.generated)
            if r.generated >= (r.req.max_tokens or 0):
                lc.finish(r, now)
    trace.outcomes = ledger.outcomes
    return trace


class Aborted:
    def __init__(self, on_abort: Callable[[], object]) -> None:
        self.on_abort = on_abort

    def abort(self) -> None:
        self.on_abort()


class ScriptedBackend:
    """FAKE vLLM: each dispatch is a stream the test feeds one token per tick."""

    base_url = "fake://scripted"

    def __init__(self) -> None:
        self.streams: dict[str, DispatchSink] = {}
        self.remaining: dict[str, int] = {}
        self.order: list[str] = []

    def open_stream(self, model: str, prompt_ids: list[int], max_tokens: int,
                    sampling: dict[str, Any], priority: int, request_id: str,
                    sink: DispatchSink) -> Aborted:
        self.streams[request_id] = sink
        self.remaining[request_id] = max_tokens
        self.order.append(request_id)
        return Aborted(lambda: self.streams.pop(request_id, None))

    def tick(self) -> None:
        for rid, sink in list(self.streams.items()):
            self.remaining[rid] -= 1
            done = self.remaining[rid] <= 0
            sink.on_chunk([7], "x", "length" if done else None)
            if done and self.streams.pop(rid, None) is not None:
                sink.on_end(None)

    async def health(self) -> bool:
        return True

    async def models(self) -> dict[str, Any]:
        return {"data": [{"id": "fake"}]}

    async def close(self) -> None:
        pass


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_dispatcher(spec: SLOPolicySpec, batch: int, engine_queue: int = 0,
                    unstarted: bool = False) -> tuple[Dispatcher, ScriptedBackend, Clock]:
    backend, clock = ScriptedBackend(), Clock()
    d = Dispatcher(backend, spec, SidecarMetrics(), max_running=batch, engine_queue=engine_queue,
                   engine_queue_unstarted=unstarted, clock=clock)
    d.speed = d.lifecycle.speed = d.frame_clock.speed = frozen()
    d.lifecycle.ledger = RecordingLedger()
    d.health.ready = True
    return d, backend, clock


async def submit(d: Dispatcher, req: Request, program: ProgramRef | None = None) -> Job:
    return await d.submit(req, model="fake", prompt_ids=[1] * req.prompt_tokens,
                          max_tokens=req.max_tokens or 1, program=program)


async def drive_the_dispatcher(spec: SLOPolicySpec, batch: int, ticks: int) -> Trace:
    d, backend, clock = make_dispatcher(spec, batch)
    arrivals = workload()
    for k in range(ticks):
        clock.now = k * TICK
        for a in arrivals:
            if a.tick == k:
                await submit(d, request(a))
        d.step(clock.now, frame_due=k % FRAME_EVERY == 0)
        await settle()
        backend.tick()
        await settle()
    trace = Trace()
    trace.dispatched = [entry["request_id"] for entry in d.report.dispatch_log]
    for entry in d.report.frame_log:
        k = round(entry["t"] / TICK)
        trace.preempted += [(k, rid) for rid in entry["preempted"]]
    retired = []
    for entry in d.report.frame_log:
        k = round(entry["t"] / TICK)
        retired += [(k, rid) for rid in entry["retired"]]
    reasons = {g[1]: g[2] for g in drive_like_the_simulator(spec, batch, ticks).retired}
    trace.retired = [(k, rid, reasons.get(rid, "?")) for k, rid in retired]
    assert isinstance(d.lifecycle.ledger, RecordingLedger)
    trace.outcomes = d.lifecycle.ledger.outcomes
    return trace


@pytest.mark.parametrize("policy", ["gmax", "edf", "fcfs"])
def test_simulator_and_sidecar_drive_the_lifecycle_alike(policy: str) -> None:
    spec = load_policy({"scheduler": {"policy": policy, "frameSteps": 4}})
    reference = drive_like_the_simulator(spec, batch=2, ticks=120)
    sidecar = asyncio.run(drive_the_dispatcher(spec, batch=2, ticks=120))
    assert sidecar.dispatched == reference.dispatched
    assert sidecar.preempted == reference.preempted
    assert sidecar.retired == reference.retired
    assert sidecar.outcomes == reference.outcomes
    # the script exercises what it claims to: every request ends, some wait their turn
    assert len(reference.outcomes) == len(workload())
    assert len(set(reference.dispatched)) + len(reference.retired) >= len(workload())
    if policy == "gmax":
        assert ("d-doomed", "unreachable") in {(r[1], r[2]) for r in reference.retired}
    if policy == "edf":
        assert reference.preempted, "EDF should preempt the long request for the urgent one"


def test_engine_queue_keeps_vllm_fed_beyond_its_slots() -> None:
    async def scenario() -> tuple[int, int, list[str]]:
        d, backend, _ = make_dispatcher(SLOPolicySpec(), batch=2, engine_queue=3)
        for i in range(8):
            await submit(d, Request(f"r{i}", "t1", DeadlineSLO(60.0), 10, 0.0, max_tokens=4))
        d.step(0.0, frame_due=True)
        await settle()
        return len(backend.streams), d.policy.waiting(), backend.order

    in_engine, waiting, order = asyncio.run(scenario())
    assert in_engine == 5  # B = 2 slots + 3 queued inside vLLM
    assert waiting == 3
    assert len(order) == 5


def test_the_unstarted_rule_bounds_the_dispatched_without_a_token() -> None:
    """``--engine-queue-unstarted``: at most Q dispatched requests have no token yet; each
    first token makes room for one more, and B + Q in all still bounds the dispatched."""
    async def scenario() -> list[int]:
        d, backend, _ = make_dispatcher(SLOPolicySpec(), batch=2, engine_queue=1, unstarted=True)
        for i in range(8):
            await submit(d, Request(f"r{i}", "t1", DeadlineSLO(60.0), 10, 0.0, max_tokens=40))
        dispatched = []
        for _ in range(4):
            d.step(0.0, frame_due=True)
            await settle()
            dispatched.append(len(backend.streams))
            backend.tick()  # every stream's next token: the newest has its first
            await settle()
        return dispatched

    assert asyncio.run(scenario()) == [1, 2, 3, 3]


def test_requests_without_slo_are_served_below_capacity() -> None:
    async def scenario() -> list[str | None]:
        spec = load_policy({"admission": {"maxWaitingSeconds": 0.2}})
        d, backend, clock = make_dispatcher(spec, batch=2, engine_queue=2)
        best_effort = spec.slo_defaults.slo_for(SLOKind.BEST_EFFORT)
        jobs: list[Job] = []
        for k in range(60):
            clock.now = k * TICK
            if k % 3 == 0 and len(jobs) < 12:
                req = Request(f"b{k}", "t1", best_effort, 10, clock.now, max_tokens=3)
                jobs.append(await submit(d, req))
            d.step(clock.now, frame_due=k % FRAME_EVERY == 0)
            await settle()
            backend.tick()
            await settle()
        return [job.outcome for job in jobs]

    outcomes = asyncio.run(scenario())
    assert outcomes == ["met"] * 12


def test_a_compound_program_has_one_outcome_at_its_final_stage() -> None:
    async def scenario() -> tuple[list[Outcome], list[str | None]]:
        d, backend, clock = make_dispatcher(SLOPolicySpec(), batch=4)
        slo = CompoundSLO(30.0)
        outcomes: list[str | None] = []
        for stage in range(3):
            ref = ProgramRef("prog-1", stage, (), 3, final=stage == 2)
            calls = [await submit(d, Request(f"p{stage}-{i}", "t1", slo, 10, clock.now,
                                             max_tokens=3, program_id="prog-1", stage=stage),
                                  ref) for i in range(2)]
            for _ in range(6):
                d.step(clock.now, frame_due=False)
                await settle()
                backend.tick()
                await settle()
                clock.now += TICK
            outcomes += [job.outcome for job in calls]
        assert isinstance(d.lifecycle.ledger, RecordingLedger)
        return d.lifecycle.ledger.outcomes, outcomes

    recorded, per_call = asyncio.run(scenario())
    assert len(recorded) == 1  # one outcome for the whole program, as the simulator scores it
    program = recorded[0]
    assert program.kind.value == "compound" and program.met
    assert program.input_tokens == 60 and program.output_tokens == 18
    assert program.goodput_tokens == 78
    assert per_call[:4] == ["finished"] * 4
    assert sorted(per_call[4:], key=str) == ["finished", "met"]


@pytest.mark.parametrize(("policy", "slo", "code"), [
    # reachable (a far deadline) but waiting past the limit, and not in the plan (edf-ac plans
    # the head that fits the free slots: none while the blocker runs)
    ({"scheduler": {"policy": "edf-ac"}, "admission": {"maxWaitingSeconds": 0.1}},
     DeadlineSLO(100.0), "waiting_time_exceeded"),
    # its TTFT passed without a first token: unreachable, whatever the objective
    ({"admission": {"maxWaitingSeconds": 100}}, LatencySLO(0.05, 0.01), "slo_unreachable"),
    ({"objective": "requests", "admission": {"maxWaitingSeconds": 100}},
     LatencySLO(0.05, 0.01), "slo_unreachable"),
])
def test_retired_request_gets_429_with_retry_after(policy: dict[str, Any], slo: SLO,
                                                   code: str) -> None:
    async def scenario() -> Job:
        spec = load_policy(policy)
        d, backend, clock = make_dispatcher(spec, batch=1)
        blocker = await submit(d, Request("long", "t1", DeadlineSLO(100.0), 10, 0.0,
                                          max_tokens=200))
        d.step(0.0, frame_due=True)
        await settle()
        starved = await submit(d, Request("starved", "t1", slo, 10, 0.0, max_tokens=5))
        for k in range(1, 20):
            clock.now = k * TICK
            d.step(clock.now, frame_due=True)
            await settle()
            backend.tick()
            await settle()
            if starved.done:
                break
        assert not blocker.done
        return starved

    starved = asyncio.run(scenario())
    assert starved.outcome == "retired"
    event = starved.events.get_nowait()
    assert event.kind is EventKind.ERROR and event.error is not None
    assert event.error.status == 429 and event.error.code == code
    assert event.error.headers()["x-should-retry"] == "true"
    assert event.error.retry_after_s is not None and event.error.retry_after_s >= 1
    reason = "rejected-ttl-expired" if code == "waiting_time_exceeded" else "rejected-saturated"
    assert event.error.headers()["x-llm-d-request-dropped-reason"] == reason




def test_with_retires_late_a_request_with_slack_keeps_waiting_past_the_limit() -> None:
    async def scenario() -> tuple[Job, Job]:
        spec = load_policy({"scheduler": {"policy": "edf-ac"},
                            "admission": {"maxWaitingSeconds": 0.1, "maxWaitingRetires": "late"}})
        d, backend, clock = make_dispatcher(spec, batch=1)
        blocker = await submit(d, Request("long", "t1", DeadlineSLO(100.0), 10, 0.0,
                                          max_tokens=200))
        d.step(0.0, frame_due=True)
        await settle()
        patient = await submit(d, Request("patient", "t1", DeadlineSLO(100.0), 10, 0.0,
                                          max_tokens=5))
        for k in range(1, 20):  # as the case above that retires it under "all"
            clock.now = k * TICK
            d.step(clock.now, frame_due=True)
            await settle()
            backend.tick()
            await settle()
        return blocker, patient

    blocker, patient = asyncio.run(scenario())
    assert not blocker.done and not patient.done
    assert patient.events.empty()  # no 429: still queued, its deadline 100 s away

@pytest.mark.parametrize("quantile", [0.9, 0.0])
def test_a_latency_request_that_would_start_late_is_refused_at_the_door(
        quantile: float) -> None:
    """One slot, held by a latency stream; slots measured to free every ~0.5 s: an
    arrival wanting its first token in 0.2 s is refused at once (429
    ``would_start_late``), one with 2 s is queued; with ``onTimeQuantile: 0`` both wait.
    Its TTFT breakdown and the door's figures are in the debug document and metrics."""
    async def scenario() -> tuple[Dispatcher, Job | APIError]:
        d, backend, clock = make_dispatcher(
            load_policy({"admission": {"onTimeQuantile": quantile}}), batch=1)

        async def run_ticks(n: int) -> None:
            for _ in range(n):
                clock.now += TICK
                d.step(clock.now, frame_due=True)
                await settle()
                backend.tick()
                await settle()

        first = await submit(d, Request("first", "t1", LatencySLO(5.0, 1.0), 10, 0.0,
                                        max_tokens=10))
        await run_ticks(12)
        assert first.outcome == "met"  # a slot was held ~0.45 s: the door's slot time
        holder = await submit(d, Request("holder", "t1", LatencySLO(5.0, 1.0), 10,
                                         clock.now, max_tokens=100))
        await run_ticks(2)
        patient = await submit(d, Request("patient", "t1", LatencySLO(2.0, 1.0), 10,
                                          clock.now, max_tokens=5))
        try:
            hurried: Job | APIError = await submit(d, Request(
                "hurried", "t1", LatencySLO(0.2, 1.0), 10, clock.now, max_tokens=5))
        except APIError as err:
            hurried = err
        assert not holder.done and not patient.done
        return d, hurried

    d, hurried = asyncio.run(scenario())
    door = d.snapshot()["door"]
    assert d.snapshot()["ttft_breakdown"]["requests"] == 2  # first and holder
    assert door["samples"] == 2 and door["slot_s"] == pytest.approx(0.47, abs=0.05)
    text = d.metrics.render().decode()
    assert 'jitserve_engine_first_token_seconds_count{queued_in_engine="no"} 2.0' in text
    if quantile == 0.0:
        assert isinstance(hurried, Job) and not hurried.done and door["refused"] == 0
        return
    assert isinstance(hurried, APIError), hurried
    assert (hurried.status, hurried.code) == (429, "would_start_late")
    assert hurried.headers()["x-llm-d-request-dropped-reason"] == "rejected-saturated"
    assert hurried.retry_after_s is not None and hurried.retry_after_s >= 1
    assert door["refused"] == 1
    assert 'jitserve_retirements_total{reason="would_start_late"} 1.0' in text


def test_a_queue_ttl_ends_only_a_request_never_dispatched() -> None:
    """``x-llm-d-inference-ttl``: the request still queued when it runs out ends with 429
    ``ttl_expired`` and llm-d's dropped reason; one already dispatched is left alone."""
    async def scenario() -> tuple[Job, Job, Job]:
        d, _backend, clock = make_dispatcher(SLOPolicySpec(), batch=1)
        running = await d.submit(Request("running", "t1", DeadlineSLO(100.0), 10, 0.0,
                                         max_tokens=200), model="fake", prompt_ids=[1] * 10,
                                 max_tokens=200, queue_ttl_s=0.01)
        d.step(clock.now, frame_due=True)
        await settle()
        assert running.segment == 1
        queued = await d.submit(Request("queued", "t1", DeadlineSLO(100.0), 10, 0.0,
                                        max_tokens=5), model="fake", prompt_ids=[1] * 10,
                                max_tokens=5, queue_ttl_s=0.01)
        patient = await submit(d, Request("patient", "t1", DeadlineSLO(100.0), 10, 0.0,
                                          max_tokens=5))
        async with asyncio.timeout(30):  # the TTL is 10 ms of the loop's clock
            while not queued.done:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # past the running request's TTL too
        return running, queued, patient

    running, queued, patient = asyncio.run(scenario())
    assert queued.outcome == "ttl_expired"
    event = queued.events.get_nowait()
    assert event.kind is EventKind.ERROR and event.error is not None
    assert (event.error.status, event.error.code) == (429, "ttl_expired")
    assert event.error.headers()["x-llm-d-request-dropped-reason"] == "rejected-ttl-expired"
    assert event.error.headers()["Retry-After"]
    assert not running.done and running.ttl_timer is not None
    assert not patient.done  # no TTL of its own: the policy's waiting limit alone


@body_timeout(60)
def test_a_bounded_shutdown_ends_even_when_its_tasks_ignore_the_cancel() -> None:
    """The server bounds Dispatcher.shutdown with asyncio.timeout. Tasks stuck on a silent
    vLLM that do not end when cancelled must not hold the exit: on the old code the first
    wait swallowed the timeout's cancel and the second waited forever (a sidecar that
    logged 'drain over' and never exited, in CI)."""

    giving_up = asyncio.Event()  # set at the end, so that the test's loop can close

    async def stubborn() -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if giving_up.is_set():
                    raise

    async def scenario() -> bool:
        d, _, _ = make_dispatcher(SLOPolicySpec(), batch=2)
        d._tasks = [asyncio.create_task(stubborn()), asyncio.create_task(stubborn())]
        await asyncio.sleep(0.01)  # both running, so a cancel reaches their except
        try:
            async with asyncio.timeout(0.5):
                await d.shutdown()
        except TimeoutError:
            return True
        finally:
            giving_up.set()
            for task in d._tasks:
                task.cancel()
            await asyncio.wait(d._tasks)
        return False

    assert asyncio.run(scenario())


def test_the_f_gauge_shows_the_weight_in_effect() -> None:
    """``jitserve_fairness_weight`` is f as applied: the configured weight with the
    fairness mechanism on, 0 with it off or under a baseline that has no fairness."""
    on = load_policy({"fairness": {"weight": 0.5}})
    d, _, _ = make_dispatcher(on, batch=2)

    def shown() -> tuple[float, float]:
        gauge = d.metrics.fairness_weight._value.get()  # type: ignore[attr-defined]
        return float(gauge), float(d.snapshot()["fairness_weight"])

    d.apply_spec(on)
    assert shown() == (0.5, 0.5)
    d.apply_spec(load_policy({"fairness": {"weight": 0.5},
                              "scheduler": {"mechanisms": {"fairness": False}}}))
    assert shown() == (0.0, 0.0)
    d.apply_spec(load_policy({"fairness": {"weight": 0.5}, "scheduler": {"policy": "edf-ac"}}))
    assert shown() == (0.0, 0.0)


def test_a_scheduler_switched_back_to_is_the_one_that_ran_before() -> None:
    """A hot reload from GMAX to another scheduler and back resumes the same GMAX (what it
    learned, its cutoff's rewards and its pacer's rate, kept) under the settings now in
    force; a scheduler that never ran here is built."""
    d, _, _ = make_dispatcher(load_policy({}), batch=2)
    gmax = d.lifecycle.policy
    d.apply_spec(load_policy({"scheduler": {"policy": "edf-ac"}}))
    edf = d.lifecycle.policy
    assert edf is not gmax and edf.name == "edf-ac"
    d.apply_spec(load_policy({"fairness": {"weight": 0.5}}))
    assert d.lifecycle.policy is gmax
    assert d.snapshot()["fairness_weight"] == 0.5
    d.apply_spec(load_policy({"scheduler": {"policy": "sjf-ac"}}))
    assert d.lifecycle.policy not in (gmax, edf) and d.lifecycle.policy.name == "sjf-ac"
