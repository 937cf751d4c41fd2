"""What a request or a compound program earned, as one :class:`~jitserve.goodput.Outcome`
(pure; the lifecycle records it in the ledger)."""

from __future__ import annotations

from jitserve.goodput import Outcome, score_request
from jitserve.requests import LiveProgram, LiveRequest


def request_outcome(
    r: LiveRequest, goodput: int, met: bool, now_s: float, retired: bool = False
) -> Outcome:
    req = r.req
    return Outcome(
        req.tenant,
        req.kind,
        req.slo_class,
        req.prompt_tokens,
        r.generated,
        goodput,
        met,
        retired,
        None if r.first_token_s is None else r.first_token_s - req.arrival_s,
        now_s - req.arrival_s,
        req.arrival_s,
    )


def program_outcome(lp: LiveProgram, now_s: float, retired: bool) -> Outcome:
    """One outcome per compound program: all its tokens count if it finished in time."""
    program = lp.program
    goodput, met = (
        (0, False)
        if retired
        else score_request(
            program.slo, lp.prompt_tokens, lp.attained_tokens, now_s, lp.deadline_abs_s
        )
    )
    return Outcome(
        program.tenant,
        program.slo.kind,
        program.slo_class,
        lp.prompt_tokens,
        lp.attained_tokens,
        goodput,
        met,
        retired,
        None,
        now_s - program.arrival_s,
        program.arrival_s,
    )
