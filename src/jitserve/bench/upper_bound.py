"""``upper-bound``: a goodput no schedule can beat on the simulator's engine model.

Two linear programs over one trace, solved with SciPy's HiGHS (``pip install
'jitserve[bench]'``), bound token goodput and request goodput. Each work item (a
request, or a compound program as a whole) may be bought fractionally, x in [0, 1], for
its goodput (a latency request for y on-time tokens); time is cut into slots of
``slot_s`` seconds (2 s by default; any slot length gives a bound, shorter ones a tighter
but larger LP), and the LP decides how many engine iterations N_s run in each slot
and which part of each item's work they carry.

Why it is a bound (proof sketch). Fix any schedule the engine can run. An iteration with
T tokens in the batch (at most C, the largest budget any batching mode allows), n <= B
sequences, prefill attention pairs and decode contexts lasts, by :meth:`Profile.step_s`
(every coefficient >= 0),

    t >= a0 + a3*T + R   and   t >= a6 + a1*T + R,   R = a2*pairs + a4*context + a5*n.

Cut every iteration pro rata over the slots it overlaps and sum inside slot s: with N_s
the iterations, T_s the tokens and R_s the rest in it, both sums are at most the slot's
length, T_s <= C*N_s, and at most B decode steps run per iteration. A request gains at
most one token per iteration, so its decode steps need as many iterations inside its
decode window (a program: its stages' longest calls, one prefill each, in sequence). A
request's first prefill processes its p prompt tokens and p^2/2 attention pairs, then
o - 1 decode steps at contexts p+1 ... p+o-1, each with a5 per iteration; recompute
preemptions only add work. If it met its SLO, that work lies in its window: the first
prefill between arrival and the deadline less the o - 1 decode steps it still needs (each
at least one lone iteration), the decode steps between arrival plus the fastest prefill
and the deadline. Setting x = 1 for every item that earned goodput and placing its work
where the schedule put it is then a feasible point of the LP with the schedule's goodput,
so the LP optimum is at least that. A latency request earning y on-time tokens needs its
prefill and y - 1 decode steps before the due time of its last on-time token, at most
arrival + ttft + (o-1)*tbt; for request goodput (all tokens on time) its prefill must also
end by arrival + ttft. An item that cannot meet its SLO even alone on the engine is fixed
at 0, and a latency request may only earn the tokens it could deliver on time alone.
The attention pairs and the growth of the decode context are placed anywhere in the
item's window (a relaxation), and a program's stages share the program's window.

What it ignores, and where it is loose: iteration sizes are free up to C (the engine fills
each iteration with as many prompt tokens as the budget allows; the LP may run many small
iterations, which serve decoders more often at the same cost per token), batches are
formed freely (any fractions of any requests in any slot; a request need not hold its
slot from admission to its last token), stage order inside a program, and the waste of
work on requests that end up missing their SLO.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from jitserve.requests import LLMCall, Program, Request, Workitem
from jitserve.sim.latency import Profile
from jitserve.slo import LatencySLO


def largest_chunk(profile: Profile) -> int:
    return max(
        profile.chunk_token_budget, profile.prefill_first_token_budget, profile.max_running + 1
    )


def lone_token_times(profile: Profile, prompt: int, output: int) -> npt.NDArray[np.float64]:
    """Earliest delivery (after arrival) of each output token on an idle engine: the
    prefill in the fewest chunks any batching mode allows, then one lone decode step per
    token. Steps only get longer with company, so no schedule delivers token j earlier."""
    p = profile
    chunks = math.ceil(prompt / largest_chunk(p))
    prefill = (
        max(
            chunks * p.a0_s + p.a3_s_per_decode_seq * prompt,
            chunks * p.a6_s_compute_intercept + p.a1_s_per_prefill_token * prompt,
        )
        + p.a2_s_per_attention_pair * prompt * prompt / 2
        + chunks * p.a5_s_per_seq
    )
    context = prompt + np.arange(1, output, dtype=np.float64)
    steps = p.a0_s + p.a3_s_per_decode_seq + p.a5_s_per_seq + p.a4_s_per_context_token * context
    return prefill + np.concatenate(([0.0], np.cumsum(steps)))


@dataclass
class _Job:
    """One LP purchase. Windows are absolute seconds; amounts are per unit of x."""

    value: float
    prefill_window: tuple[float, float]
    decode_window: tuple[float, float]
    window: tuple[float, float]
    prompt_tokens: float
    decode_steps: float
    step_cost_s: float
    """a5 + a4 * (shortest context) per decode step."""
    floating_s: float
    """Attention pairs, per-chunk a5 and context growth: anywhere in ``window``."""
    pace_iterations: float = 0.0
    """Iterations the item needs inside ``decode_window``: it gains at most one token per
    iteration (a program: its stages' longest calls in sequence, one prefill each)."""
    max_tokens: int = 0
    """Latency token bound: tokens that could be on time (decode steps are y - x)."""


def _call_parts(profile: Profile, call: LLMCall | Request) -> tuple[int, int, float, float]:
    """(prompt, decode steps, cost per step, floating cost) of one LLM call."""
    p = profile
    prompt, steps = call.prompt_tokens, (call.output_tokens or 1) - 1
    chunks = math.ceil(prompt / largest_chunk(p))
    step_cost = p.a5_s_per_seq + p.a4_s_per_context_token * (prompt + 1)
    floating = (
        p.a2_s_per_attention_pair * prompt * prompt / 2
        + p.a5_s_per_seq * chunks
        + p.a4_s_per_context_token * steps * (steps - 1) / 2
    )
    return prompt, steps, step_cost, floating


def _program_job(profile: Profile, item: Program, tokens: bool) -> _Job | None:
    chain = sum(
        max(float(lone_token_times(profile, c.prompt_tokens, c.output_tokens)[-1]) for c in s.calls)
        for s in item.stages
    ) + sum(s.tool_s for s in item.stages[:-1])
    if chain > item.slo.deadline_s + 1e-9:
        return None
    parts = [_call_parts(profile, c) for s in item.stages for c in s.calls]
    step_cost = min(part[2] for part in parts)
    steps = sum(part[1] for part in parts)
    floating = sum(part[3] + part[1] * (part[2] - step_cost) for part in parts)
    window = (item.arrival_s, item.arrival_s + item.slo.deadline_s)
    pace = sum(1 + max(c.output_tokens - 1 for c in s.calls) for s in item.stages)
    return _Job(
        float(item.total_tokens) if tokens else 1.0,
        window,
        window,
        window,
        float(sum(part[0] for part in parts)),
        float(steps),
        step_cost,
        floating,
        pace_iterations=float(pace),
    )


def _request_job(profile: Profile, item: Request, tokens: bool) -> _Job | None:
    slo, arrival = item.slo, item.arrival_s
    prompt, steps, step_cost, floating = _call_parts(profile, item)
    times = lone_token_times(profile, prompt, steps + 1)
    lone_prefill, lone_decode = float(times[0]), float(times[-1] - times[0])
    if isinstance(slo, LatencySLO):
        due = slo.due_s(0.0, np.arange(steps + 1))
        on_time = int(np.count_nonzero(times <= due + 1e-9))
        end = arrival + float(due[-1])
        if tokens and on_time:
            floating -= profile.a4_s_per_context_token * steps * (steps - 1) / 2
            window = (arrival, end)
            return _Job(
                0.0,
                window,
                (arrival + lone_prefill, end),
                window,
                prompt,
                0.0,
                step_cost,
                floating,
                max_tokens=on_time,
            )
        if not tokens and on_time == steps + 1:
            return _Job(
                1.0,
                (arrival, arrival + slo.ttft_s),
                (arrival + lone_prefill, end),
                (arrival, end),
                prompt,
                steps,
                step_cost,
                floating,
                pace_iterations=float(steps),
            )
        return None
    deadline = arrival + slo.deadline_s
    if lone_prefill + lone_decode > slo.deadline_s + 1e-9:
        return None
    return _Job(
        float(prompt + steps + 1) if tokens else 1.0,
        (arrival, deadline - lone_decode),
        (arrival + lone_prefill, deadline),
        (arrival, deadline),
        prompt,
        steps,
        step_cost,
        floating,
        pace_iterations=float(steps),
    )


def jobs_of(items: Iterable[Workitem], profile: Profile, tokens: bool) -> list[_Job]:
    jobs = []
    for item in items:
        if isinstance(item, Program):
            job = _program_job(profile, item, tokens)
        else:
            job = _request_job(profile, item, tokens)
        if job is not None:
            jobs.append(job)
    return jobs


class _LP:
    """Sparse rows ``sum(coef * var) <= rhs`` and the objective, built incrementally."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.rhs: list[float] = []
        self.upper: list[float] = []
        self.gain: list[float] = []

    def var(self, upper: float = math.inf, gain: float = 0.0) -> int:
        self.upper.append(upper)
        self.gain.append(gain)
        return len(self.upper) - 1

    def row(self, terms: Iterable[tuple[int, float]], rhs: float = 0.0) -> int:
        index = len(self.rhs)
        self.rhs.append(rhs)
        for col, coef in terms:
            self.add(index, col, coef)
        return index

    def add(self, row: int, col: int, coef: float) -> None:
        self.rows.append(row)
        self.cols.append(col)
        self.vals.append(coef)

    def maximise(self) -> float:
        try:
            from scipy.optimize import linprog
            from scipy.sparse import coo_matrix
        except ImportError as err:
            raise ValueError(
                f"upper-bound needs SciPy: pip install 'jitserve[bench]' ({err})"
            ) from err
        n = len(self.upper)
        matrix = coo_matrix((self.vals, (self.rows, self.cols)), shape=(len(self.rhs), n))
        bounds = np.column_stack([np.zeros(n), np.array(self.upper)])
        result = linprog(
            -np.array(self.gain),
            A_ub=matrix.tocsr(),
            b_ub=np.array(self.rhs),
            bounds=bounds,
            method="highs-ipm",
        )
        if result.status != 0:
            raise RuntimeError(f"upper-bound LP failed: {result.message}")
        return float(-result.fun)


def _slots(window: tuple[float, float], slot_s: float, count: int) -> range:
    first = min(int(window[0] // slot_s), count - 1)
    return range(max(first, 0), max(min(math.ceil(window[1] / slot_s), count), first + 1))


MS = 1e3
"""Times enter the LP in milliseconds and prefill tokens in thousands, decode steps and
iterations as counts: coefficients then span ~1e-3..1e4 instead of 1e-9..1e4, which
HiGHS solves an order of magnitude faster."""
KILO = 1e3


def solve(jobs: list[_Job], profile: Profile, slot_s: float) -> float:
    """The LP optimum (module docstring) for these jobs."""
    if not jobs:
        return 0.0
    p = profile
    count = max(1, math.ceil(max(j.window[1] for j in jobs) / slot_s))
    capacity = slot_s * MS
    # objective in units of the largest single gain: ~1 for requests, thousands of tokens
    scale = max(max(j.value, float(j.max_tokens)) for j in jobs) or 1.0
    lp = _LP()
    iterations = [lp.var() for _ in range(count)]
    memory_bound = [lp.row([(n, p.a0_s * MS)], capacity) for n in iterations]
    compute_bound = [lp.row([(n, p.a6_s_compute_intercept * MS)], capacity) for n in iterations]
    budget = [lp.row([(n, -largest_chunk(p) / KILO)]) for n in iterations]
    batch = [lp.row([(n, -float(p.max_running))]) for n in iterations]

    for job in jobs:
        x = lp.var(1.0, job.value / scale)
        prefill = lp.row([(x, job.prompt_tokens / KILO)])
        for s in _slots(job.prefill_window, slot_s, count):
            g = lp.var()
            lp.add(prefill, g, -1.0)
            lp.add(memory_bound[s], g, p.a3_s_per_decode_seq * MS * KILO)
            lp.add(compute_bound[s], g, p.a1_s_per_prefill_token * MS * KILO)
            lp.add(budget[s], g, 1.0)
        decode = lp.row([(x, job.decode_steps)])
        if job.max_tokens:
            y = lp.var(gain=1.0 / scale)
            lp.add(decode, x, -1.0)
            lp.add(decode, y, 1.0)
            lp.row([(y, 1.0), (x, -float(job.max_tokens))])
        if job.decode_steps or job.max_tokens:
            pace = lp.row([(x, job.pace_iterations)])
            if job.max_tokens:
                lp.add(pace, x, -1.0)
                lp.add(pace, y, 1.0)
            for s in _slots(job.decode_window, slot_s, count):
                u = lp.var()
                lp.add(decode, u, -1.0)
                lp.add(memory_bound[s], u, (p.a3_s_per_decode_seq + job.step_cost_s) * MS)
                lp.add(compute_bound[s], u, (p.a1_s_per_prefill_token + job.step_cost_s) * MS)
                lp.add(batch[s], u, 1.0)
                lp.add(pace, iterations[s], -1.0)
        floating = lp.row([(x, job.floating_s * MS)])
        for s in _slots(job.window, slot_s, count):
            z = lp.var()
            lp.add(floating, z, -1.0)
            lp.add(memory_bound[s], z, 1.0)
            lp.add(compute_bound[s], z, 1.0)
    # HiGHS meets the constraints to ~1e-7: keep the bound on the safe side of that
    return lp.maximise() * scale * (1 + 1e-6)


@dataclass(frozen=True)
class Bound:
    """Totals over the workload (divide by its duration for rates)."""

    goodput_tokens: float
    met_requests: float
    items: int


def upper_bound(items: Iterable[Workitem], profile: Profile, slot_s: float = 2.0) -> Bound:
    """Token and request goodput no schedule of ``items`` on ``profile`` can exceed."""
    workload = list(items)
    return Bound(
        solve(jobs_of(workload, profile, tokens=True), profile, slot_s),
        solve(jobs_of(workload, profile, tokens=False), profile, slot_s),
        len(workload),
    )
