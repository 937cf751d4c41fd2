"""The gateway's routing rules (pure: reports in, a pick or a refusal out): 503 with no
replica, 429 when every one sheds, compound programs sticky to the replica holding their
book (by the reports, or by this gateway's memory until a report shows it), and placed
afresh when that replica is gone."""

from __future__ import annotations

from jitserve.gateway.routing import KEYED, ProgramRoutes, Router, ask_of, prompt_tokens
from jitserve.placement.base import Ask, Pick, Refusal, ReplicaReport, program_key
from jitserve.placement.registry import make_placer
from jitserve.policy import SLODefaults
from jitserve.sidecar.api import parse_request
from jitserve.slo import CompoundSLO, DeadlineSLO


def rep(name: str, *, programs: tuple[str, ...] = (), shedding: bool = False,
        outstanding: int = 0) -> ReplicaReport:
    return ReplicaReport(name, True, 0.0, 4, 0, 0, programs=frozenset(programs),
                         shedding=shedding, outstanding_tokens=outstanding)


def ask(program: str | None = None, tenant: str = "default") -> Ask:
    slo = CompoundSLO(60.0) if program else DeadlineSLO(60.0)
    return Ask("r", tenant, slo, 10, 100, 50, 0.0,
               program=program_key(tenant, program) if program else None)


def test_refusals() -> None:
    router = Router(make_placer("least-loaded"))
    none = router.place(ask(), []).outcome
    assert isinstance(none, Refusal) and none.status == 503
    shed = router.place(ask(), [rep("a", shedding=True), rep("b", shedding=True)]).outcome
    assert isinstance(shed, Refusal) and shed.status == 429 and shed.retry_after_s >= 1
    one = router.place(ask(), [rep("a", shedding=True), rep("b")]).outcome
    assert one == Pick("b")  # a shedding replica is no fallback either


def test_programs_follow_their_book() -> None:
    router = Router(make_placer("least-loaded"))
    reports = [rep("a", outstanding=0), rep("b", outstanding=500, programs=("default/p1",))]
    d = router.place(ask("p1"), reports)
    assert d.sticky and d.outcome == Pick("b", ("a",))  # b holds the book, though busier
    # a program no report shows yet: where this gateway sent its last call
    first = router.place(ask("p2"), reports)
    assert isinstance(first.outcome, Pick) and first.outcome.replica == "a" and not first.sticky
    router.placed(ask("p2"), "a")
    reports = [rep("a", outstanding=900), rep("b", outstanding=0)]
    again = router.place(ask("p2"), reports)
    assert again.sticky and isinstance(again.outcome, Pick) and again.outcome.replica == "a"
    # its holder is shedding: the call still goes there (it answers 429 itself)
    shedding = router.place(ask("p2"), [rep("a", shedding=True), rep("b")])
    assert isinstance(shedding.outcome, Pick) and shedding.outcome.replica == "a"
    # its holder left the picks: placed afresh, and remembered there from now on
    moved = router.place(ask("p2"), [rep("b")])
    assert isinstance(moved.outcome, Pick) and moved.outcome.replica == "b" and not moved.sticky
    router.placed(ask("p2"), "b")
    back = router.place(ask("p2"), [rep("a"), rep("b", outstanding=900)])
    assert isinstance(back.outcome, Pick) and back.outcome.replica == "b"


def test_keyed_tenants_match_the_sidecars_tenant_by_program_id() -> None:
    router = Router(make_placer("least-loaded"))
    keyed = ask("p9", tenant=KEYED + "abcd")
    d = router.place(keyed, [rep("a"), rep("b", outstanding=50, programs=("team-x/p9",))])
    assert d.sticky and isinstance(d.outcome, Pick) and d.outcome.replica == "b"


def test_program_routes_are_bounded_and_expire() -> None:
    routes = ProgramRoutes(capacity=2, ttl_s=10.0)
    for i in range(3):
        routes.put(f"p{i}", "a", float(i))
    assert len(routes) == 2 and routes.get("p0", 3.0) is None and routes.get("p2", 3.0) == "a"
    assert routes.get("p2", 30.0) is None


def test_the_ask_comes_from_the_sidecars_parser() -> None:
    parsed = parse_request("completions", {"prompt": [1, 2, 3], "max_tokens": 40,
                                           "slo": {"program_id": "p", "stage": 1}},
                           {}, SLODefaults())
    a = ask_of(parsed, "t", "id-1", 5.0)
    assert a.program == "t/p" and a.prompt_tokens == 3 and a.output_bound == 40
    assert isinstance(a.slo, CompoundSLO)
    chat = parse_request("chat", {"messages": [{"role": "user", "content": "x" * 400}]},
                         {"x-llm-d-slo-ttft-ms": "500"}, SLODefaults())
    assert prompt_tokens(chat) == 100 and ask_of(chat, "t", "i", 0).slo.kind.value == "latency"
