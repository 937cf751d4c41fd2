"""The simulator's per-iteration token budget and batch: the budget rule and SlidingServe's
BatchConstructor with the profile as their batch-latency predictor (the in-engine vLLM
scheduler fits its own online instead)."""

from __future__ import annotations

from collections.abc import Iterable

from jitserve.requests import LiveRequest
from jitserve.scheduling.budget import BudgetRule, DecodeSlack, StepTime, choose_budget
from jitserve.scheduling.constructor import Candidate, construct
from jitserve.scheduling.slack import next_token_due_s
from jitserve.sim.latency import Profile
from jitserve.slo import LatencySLO


def iteration_budget(profile: Profile, rule: BudgetRule, now: float,
                     decoding: Iterable[tuple[LiveRequest, int]], decode_context: int,
                     cached: int, pending: int, queued: bool) -> int:
    """Token budget of the next chunked-prefill iteration. ``decoding``: each decoding
    request with the index of its next token; ``cached``: context already computed for
    the first prefilling request (its chunk's attention); ``pending``: prompt tokens left
    in the running prefills; ``queued``: requests are waiting to be admitted."""
    decodes = []
    decoders = 0
    for r, token in decoding:
        decoders += 1
        slo = r.req.slo
        if isinstance(slo, LatencySLO):
            due = r.req.arrival_s + slo.ttft_s + token * slo.tbt_s
            decodes.append(DecodeSlack(due - now, slo.tbt_s))

    step = step_time(profile, decoders, decode_context, cached)
    most = profile.chunk_token_budget
    demand = pending + (2 * most if queued else 0)
    return choose_budget(rule, step, decodes, decoders=decoders, most=most, demand=demand)


def step_time(profile: Profile, decoders: int, decode_context: int, cached: int) -> StepTime:
    """The profile's time of an iteration with these decodes and ``p`` prompt tokens."""

    def step(p: int) -> float:
        return profile.step_s(p, p * (cached + p / 2), decoders, decode_context,
                              decoders + (1 if p else 0))

    return step


def constructed_batch(profile: Profile, now: float, chunks: list[tuple[LiveRequest, int]],
                      prefilling: list[LiveRequest], decoders: int, decode_context: int,
                      per_step: int) -> list[tuple[LiveRequest, int]]:
    """The prompt chunks of this iteration after the BatchConstructor: ``chunks`` (the full
    candidate batch) unless a prefill in it is at risk and an anchored subset, each run to
    completion, saves it."""
    cands = [Candidate(r.prefill_target - r.prefilled, next_token_due_s(r) - now)
             for r in prefilling]
    step = step_time(profile, decoders, decode_context, 0)
    picked = construct(step, cands, per_step, sum(c for _, c in chunks))
    if picked is None:
        return chunks
    return [(prefilling[i], cands[i].remaining) for i in sorted(picked)]
