"""The gateway on the real path: real sidecar processes in front of the real tiny CPU
vLLM (the session's shared one; a private second one only where a test needs two
engines: the faults of one vLLM while the other serves).

- streaming through, chat and completions;
- a compound program whose calls come through two gateway processes is scored once, by
  the one replica that held its book (the sidecars' own metrics say so);
- SIGSTOP and SIGKILL of one vLLM mid-run: nothing lost silently, its replica leaves the
  picks (printed seconds, never asserted), new requests go to the other, and it comes
  back after SIGCONT or a restart on the same port."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from jitserve.bench.stream import StreamResult, stream_completion
from tests.gateway.conftest import Stack, StackFactory
from tests.support.gateway import (
    PATIENT,
    GatewayProcess,
    nothing_lost,
    streams_until,
    until_every_replica_chosen,
)
from tests.support.http import get_json, metric, post
from tests.support.vllm import RestartableVLLM
from tests.support.waiting import body_timeout, wait_until

pytestmark = body_timeout(900)
REPLICA = "x-jitserve-replica"
PROMPT = [5, 17, 99, 400, 23, 8, 77]


def body(n: int, **extra: Any) -> dict[str, Any]:
    return {"prompt": PROMPT, "max_tokens": n, "ignore_eos": True, **extra}


@pytest.fixture(scope="module")
def fleet_vllm() -> Iterator[RestartableVLLM]:
    engine = RestartableVLLM()
    yield engine
    engine.stop()


def test_streaming_through_the_gateway(vllm_url: str, stack: StackFactory) -> None:
    st = stack([vllm_url, vllm_url])

    async def go() -> list[StreamResult]:
        async with aiohttp.ClientSession() as session:
            chat = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 24,
                    "ignore_eos": True}
            return list(await asyncio.gather(
                stream_completion(session, st.gateway.url, body(24)),
                stream_completion(session, st.gateway.url, chat, path="/v1/chat/completions")))

    for r in asyncio.run(go()):
        assert r.status == 200 and r.error is None and r.finish_reason == "length", r
        assert len(r.texts) >= 2 and len(set(r.token_times or [0.0])) >= 1
        assert r.headers[REPLICA] in st.gateway.names
    completion, _ = asyncio.run(go())
    assert len(completion.token_ids) == 24
    assert len(set(completion.token_times)) > 1  # tokens arrived as they were made


def _program_outcomes(stack: Stack, replica: str) -> float:
    text = stack.sidecar_of(replica).metrics()
    total = 0.0
    for outcome in ("met", "missed", "retired", "error"):
        with contextlib.suppress(KeyError):
            total += metric(text, "jitserve_requests_total", kind="compound", outcome=outcome)
    return total


def _holds(gateway: GatewayProcess, replica: str, program: str) -> bool:
    _, doc = get_json(gateway.admin_url + "/debug/fleet")
    return any(r["name"] == replica and r["report"] and program in r["report"]["programs"]
               for r in doc["replicas"])


def test_a_compound_program_through_two_gateways_is_scored_once(
        vllm_url: str, stack: StackFactory) -> None:
    st = stack([vllm_url, vllm_url], gateway_args=("--placement", "round-robin", *PATIENT))
    gw2 = GatewayProcess(st.sidecars, st.gateway.log_path.with_name("gateway-2.log"),
                         extra_args=["--placement", "round-robin", *PATIENT])
    try:
        gw2.wait_ready()
        slo = {"program_id": "agent-7", "stages": 3, "deadline_s": 600}
        chosen = []
        for stage, gateway in enumerate((st.gateway, gw2, st.gateway)):
            doc = body(4, slo={**slo, "stage": stage, "final": stage == 2})
            status, headers, answer = post(gateway.url + "/v1/completions", doc)
            assert status == 200, answer
            chosen.append(headers[REPLICA])
            if stage == 0:  # the other gateway learns the holder from the reports alone
                wait_until("gateway 2 to see the program's book",
                           lambda: _holds(gw2, chosen[0], "default/agent-7"))
        holder = chosen[0]
        other = next(n for n in st.gateway.names if n != holder)
        assert chosen == [holder] * 3  # round-robin alone would have alternated
        wait_until("the program's outcome", lambda: _program_outcomes(st, holder) == 1)
        assert _program_outcomes(st, other) == 0
        assert not _holds(st.gateway, other, "default/agent-7")
    finally:
        gw2.close()


@pytest.mark.parametrize("sig", [
    pytest.param(signal.SIGSTOP, id="SIGSTOP"),
    pytest.param(signal.SIGKILL, id="SIGKILL",  # its body restarts vLLM up to 3 times
                 marks=body_timeout(900, vllm_starts=3))])
def test_one_vllm_stopped_or_killed_mid_run(vllm_url: str, fleet_vllm: RestartableVLLM,
                                            stack: StackFactory, sig: signal.Signals) -> None:
    # PATIENT: the victim leaves the picks because its sidecar reports its engine down
    st = stack([vllm_url, fleet_vllm.url],
               gateway_args=("--placement", "round-robin", *PATIENT),
               extra_args=["--stall-timeout", "20"])
    survivor, victim = st.name(0), st.name(1)
    took: dict[str, float] = {}
    n = 2000  # seconds of decoding: mid-run when the sidecar has seen its first tokens

    def victim_streaming() -> bool:
        return any(r["generated"] >= 3 for r in st.sidecars[1].state()["running_requests"])

    async def run() -> list[StreamResult]:
        async with aiohttp.ClientSession() as session:
            tasks = await streams_until(session, st.gateway.url, body(n), victim_streaming)
            fleet_vllm.signal(sig)
            started = time.monotonic()
            await asyncio.to_thread(wait_until, "the victim out of the picks",
                                    lambda: st.gateway.ready() == [survivor], 120)
            took["out"] = time.monotonic() - started
            return list(await asyncio.gather(*tasks))

    def fault_and_recovery() -> dict[str, int]:
        results = asyncio.run(run())
        seen = nothing_lost(results, n)  # how many landed on each replica depends on
        assert sum(seen.values()) == len(results)  # which reports were fresh
        print(f"vLLM {sig.name}: its replica out of the picks after {took['out']:.2f} s; {seen}")
        for _ in range(2):
            status, headers, _ = post(st.gateway.url + "/v1/completions", body(4))
            assert status == 200 and headers[REPLICA] == survivor
        started = time.monotonic()
        if sig is signal.SIGSTOP:
            fleet_vllm.signal(signal.SIGCONT)
        else:
            fleet_vllm.restart()
        wait_until("the victim back in the picks", lambda: victim in st.gateway.ready(), 300)
        print(f"back in the picks {time.monotonic() - started:.2f} s after "
              f"{'SIGCONT' if sig is signal.SIGSTOP else 'the restart began'}")
        return seen

    try:
        # The signal must catch a victim's stream mid-run (it then ends with an error
        # event). The sidecar's count can trail what vLLM already sent on a busy machine
        # (seen: a 600-token stream came whole after SIGSTOP); such a fault hit nothing,
        # and is done again.
        for _ in range(3):
            if fault_and_recovery()["error_event"] >= 1:
                break
        else:
            pytest.fail("in 3 faults the victim's streams were always sent whole before it")
        assert until_every_replica_chosen(
            lambda: post(st.gateway.url + "/v1/completions", body(4))[1][REPLICA],
            st.gateway.names) == {survivor, victim}
    finally:
        fleet_vllm.signal(signal.SIGCONT)
