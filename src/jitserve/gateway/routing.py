"""Where one request goes (owner: gateway): the :class:`~jitserve.placement.base.Ask`
built from a parsed request, the eligibility rules (no replica ready: 503; every
ready one shedding: 429), compound programs kept on one replica, and the placer for the
rest.

**Compound programs are sticky.** A program is scored once only if one replica's program
book (:mod:`jitserve.sidecar.programs`) sees all its calls, so every call of a program
goes to the replica that holds its book: the one whose report lists the program
(:attr:`~jitserve.placement.base.ReplicaReport.programs`), else the one this gateway
sent its last call to (:class:`ProgramRoutes`, remembered between reports: the book
opens when the call arrives, the report shows it up to a report period later). The
reports make it work across gateway replicas without shared state: a program's next
call, through any gateway, finds the holder in the reports. Sharing the book between
replicas instead would cost a synchronous exchange per call for a state that is only
ever needed by one replica. When the holder leaves the picks (dead, hung, not ready),
the program's next call is placed like a new program and the new replica opens a book
for what is left of it (the dead replica's book died with it; the program is then
scored by the replica that ends it). A holder that is shedding still gets the call: it
answers 429 itself, which passes through, rather than splitting the program.
"""

from __future__ import annotations

import collections
import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from jitserve.placement.base import Ask, Pick, Placer, Refusal, ReplicaReport, program_key
from jitserve.sidecar.api import ParsedRequest
from jitserve.sidecar.errors import NO_ENDPOINTS, SATURATED, APIError
from jitserve.sidecar.intake import claimed_tenant

DEFAULT_OUTPUT_BOUND = 1024
"""Output bound of a request that names no ``max_tokens`` (the gateway does not know the
model's context; the replica's analyzer refines it once the request is there)."""
CHARS_PER_TOKEN = 4
KEYED = "key:"
"""Tenant prefix of a request that carries an API key: the sidecar maps keys to tenants
(it checks them), so the gateway names the tenant by a digest of the key."""


def placement_tenant(headers: Mapping[str, str]) -> str:
    """Who the request says it is, for placement only: the claimed tenant, else a digest
    of its bearer key (as the gateway names it), else ``default``."""
    claimed = claimed_tenant(headers)[1]
    if claimed:
        return claimed[:63]
    auth = headers.get("authorization", "")
    key = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
    if key:
        return KEYED + hashlib.sha256(key.encode()).hexdigest()[:16]
    return "default"


def prompt_tokens(parsed: ParsedRequest) -> int:
    """The prompt's length in tokens: exact for token ids, else estimated from its
    characters (the gateway does not tokenize: one hop, no model files)."""
    if parsed.prompt_ids is not None:
        return len(parsed.prompt_ids)
    chars = len(parsed.prompt or "")
    for m in parsed.messages or ():
        content = m.get("content")
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            chars += sum(len(str(p.get("text", ""))) for p in content if isinstance(p, dict))
    return max(1, chars // CHARS_PER_TOKEN)


def ask_of(parsed: ParsedRequest, tenant: str, request_id: str, now_s: float) -> Ask:
    bound = (parsed.max_tokens or DEFAULT_OUTPUT_BOUND) * parsed.n
    program = program_key(tenant, parsed.program.program_id) if parsed.program else None
    return Ask(request_id=request_id, tenant=tenant, slo=parsed.slo,
               prompt_tokens=prompt_tokens(parsed), output_bound=bound,
               typical_output=max(1, bound // 2), arrival_s=now_s, program=program)


def refusal_error(refusal: Refusal) -> APIError:
    """A refusal as the client sees it: 429 ``all_replicas_shedding`` or 503
    ``no_replica``, both retryable, with ``Retry-After`` and llm-d's dropped reason."""
    retry = max(1, round(refusal.retry_after_s))
    if refusal.status == 429:
        return APIError(429, refusal.reason, type_="rate_limit_error",
                        code="all_replicas_shedding", retry_after_s=retry,
                        dropped_reason=SATURATED)
    return APIError(refusal.status, refusal.reason, type_="service_unavailable",
                    code="no_replica", retry_after_s=retry, dropped_reason=NO_ENDPOINTS)


class ProgramRoutes:
    """program key -> the replica its last call went to, least recently used dropped
    past ``capacity``, forgotten ``ttl_s`` after its last call."""

    def __init__(self, capacity: int = 100_000, ttl_s: float = 3600.0) -> None:
        self.capacity = capacity
        self.ttl_s = ttl_s
        self._routes: collections.OrderedDict[str, tuple[str, float]] = (
            collections.OrderedDict())

    def get(self, program: str, now_s: float) -> str | None:
        found = self._routes.get(program)
        if found is None:
            return None
        if now_s - found[1] > self.ttl_s:
            del self._routes[program]
            return None
        return found[0]

    def put(self, program: str, replica: str, now_s: float) -> None:
        self._routes[program] = (replica, now_s)
        self._routes.move_to_end(program)
        while len(self._routes) > self.capacity:
            self._routes.popitem(last=False)

    def __len__(self) -> int:
        return len(self._routes)


@dataclass(frozen=True, slots=True)
class Decision:
    outcome: Pick | Refusal
    sticky: bool = False
    """The pick followed a compound program to the replica holding its book."""


class Router:
    """Eligibility, stickiness, then the placer."""

    def __init__(self, placer: Placer, programs: ProgramRoutes | None = None) -> None:
        self.placer = placer
        self.programs = programs or ProgramRoutes()

    def holder(self, program: str, reports: Sequence[ReplicaReport], now_s: float) -> str | None:
        """The ready replica holding ``program``'s book: the reports' word first, then
        where this gateway sent its last call."""
        for r in reports:
            if program in r.programs:
                return r.replica
        if program.startswith(KEYED):  # the sidecar knows the key's tenant, we do not
            suffix = "/" + program.partition("/")[2]
            for r in reports:
                if any(p.endswith(suffix) for p in r.programs):
                    return r.replica
        remembered = self.programs.get(program, now_s)
        if remembered is not None and any(r.replica == remembered for r in reports):
            return remembered
        return None

    def place(self, ask: Ask, reports: Sequence[ReplicaReport]) -> Decision:
        now = time.monotonic()
        if not reports:
            return Decision(Refusal(503, "no replica is ready", retry_after_s=1.0))
        if ask.program is not None:
            held = self.holder(ask.program, reports, now)
            if held is not None:
                rest = tuple(r.replica for r in reports if r.replica != held)
                return Decision(Pick(held, rest), sticky=True)
        open_ = [r for r in reports if not r.shedding]
        if not open_:
            return Decision(Refusal(429, "every replica is at its waiting limit",
                                    retry_after_s=1.0))
        outcome = self.placer.place(ask, open_, time.time())
        return Decision(outcome)

    def placed(self, ask: Ask, replica: str) -> None:
        """``ask`` went to ``replica`` (its first byte came back from there)."""
        self.placer.placed(ask, replica)
        if ask.program is not None:
            self.programs.put(ask.program, replica, time.monotonic())
