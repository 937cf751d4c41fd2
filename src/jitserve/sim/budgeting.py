"""The simulator's per-iteration token budget and batch: the budget rule and SlidingServe's
BatchConstructor, predicting steps as the in-engine vLLM scheduler does, with the online
step model (:class:`~jitserve.scheduling.estimators.step_model.OnlineStepModel`) fitted from the
steps simulated so far and warm started from the profile: estimators, not the engine's
exact times, so their error is in the results."""

from __future__ import annotations

from collections.abc import Iterable

from jitserve.requests import LiveRequest
from jitserve.scheduling.budget import BudgetRule, DecodeSlack, choose_budget
from jitserve.scheduling.budget.constructor import Candidate, construct
from jitserve.scheduling.estimators.step_model import OnlineStepModel
from jitserve.scheduling.slack import next_token_due_s
from jitserve.sim.latency import Profile
from jitserve.slo import LatencySLO


def iteration_budget(model: OnlineStepModel, most: int, rule: BudgetRule, now: float,
                     decoding: Iterable[tuple[LiveRequest, int]], pending: int,
                     queued: bool) -> int:
    """Token budget of the next chunked-prefill iteration. ``decoding``: each decoding
    request with the index of its next token; ``pending``: prompt tokens left in the
    running prefills; ``queued``: requests are waiting to be admitted."""
    decodes = []
    decoders = 0
    for r, token in decoding:
        decoders += 1
        slo = r.req.slo
        if isinstance(slo, LatencySLO):
            due = slo.due_s(r.req.arrival_s, token)
            decodes.append(DecodeSlack(due - now, slo.tbt_s, max(r.bound - token, 1)))
    demand = pending + (2 * most if queued else 0)
    return choose_budget(rule, model.step_time(decoders), decodes, decoders=decoders,
                         most=most, demand=demand)


def warm_started(profile: Profile) -> OnlineStepModel:
    """The online model before any simulated step: fitted to the profile's steps over
    the shapes an engine forms (decoders alone, a chunk alone, a chunk beside decoders),
    as a live engine's model would be after its first minutes; the simulated steps then
    replace them."""
    model = OnlineStepModel()
    budget, slots = profile.chunk_token_budget, profile.max_running
    decoders = sorted({d for d in (1, 2, 4, 8, 16, 32, 64, 128, 256, slots) if d <= slots})
    chunks = sorted({c for c in (16, 64, 128, 256, 512, 1024, 2048, budget) if c <= budget})
    for d in decoders:
        model.observe(d, d, profile.step_s(0, 0.0, d, d * 1024, d))
        for p in chunks:
            if d + p <= budget:
                model.observe(d + p, d + 1, profile.step_s(p, p * p / 2, d, d * 1024, d + 1))
    for p in chunks:
        model.observe(p, 1, profile.step_s(p, p * p / 2, 0, 0, 1))
    return model


def constructed_batch(model: OnlineStepModel, now: float, chunks: list[tuple[LiveRequest, int]],
                      prefilling: list[LiveRequest], decoders: int,
                      per_step: int) -> list[tuple[LiveRequest, int]]:
    """The prompt chunks of this iteration after the BatchConstructor: ``chunks`` (the full
    candidate batch) unless a prefill in it is at risk and an anchored subset, each run to
    completion, saves it."""
    step = model.step_time(decoders)
    if step is None:
        return chunks
    cands = [Candidate(r.prefill_target - r.prefilled, next_token_due_s(r) - now)
             for r in prefilling]
    picked = construct(step, cands, per_step, sum(c for _, c in chunks))
    if picked is None:
        return chunks
    return [(prefilling[i], cands[i].remaining) for i in sorted(picked)]
