"""The simulator's per-iteration token budget: the budget rule with the profile as its
batch-latency predictor (the in-engine vLLM scheduler fits its own online instead)."""

from __future__ import annotations

from collections.abc import Iterable

from jitserve.requests import LiveRequest
from jitserve.scheduling.budget import BudgetRule, DecodeSlack, choose_budget
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

    def step(p: int) -> float:
        return profile.step_s(p, p * (cached + p / 2), decoders, decode_context,
                              decoders + (1 if p else 0))

    most = profile.chunk_token_budget
    demand = pending + (2 * most if queued else 0)
    return choose_budget(rule, step, decodes, decoders=decoders, most=most, demand=demand)
