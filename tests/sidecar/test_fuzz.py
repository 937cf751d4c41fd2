"""Fuzz suite: hypothesis-generated request bodies and headers against the real HTTP
server (a ``jitserve sidecar serve`` process) in front of the FAKE vLLM (fast, so
thousands of cases fit in a test run; what the fake answers does not matter here, what
the sidecar does with hostile input does).

Every case must answer below 500 (a 503 only as ``backend_unavailable``), with an
OpenAI-shaped JSON error when it fails, within ``CASE_TIMEOUT_S`` (no hang); streams
must end with ``[DONE]``; afterwards the server is healthy, ready, serves a normal
request, and the backend was never marked down.

``JITSERVE_FUZZ_EXAMPLES`` sets the number of cases per test (default 250, so ~1,000 per
run with the four tests); ``scripts/fuzz-sidecar.sh`` runs 2,500 per test and prints the
count.
"""

from __future__ import annotations

import http.client
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jitserve.devstack.vllm import free_port
from tests.support.fake_vllm import FakeVLLM
from tests.support.http import get_json, get_text, metric, post
from tests.support.sidecar import SidecarProcess
from tests.support.waiting import body_timeout

pytestmark = body_timeout(900)

EXAMPLES = int(os.environ.get("JITSERVE_FUZZ_EXAMPLES", "250"))
CASE_TIMEOUT_S = 30.0
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PATHS = ["/v1/completions", "/v1/chat/completions"]
CASES: dict[str, int] = {}


class Fuzzed:
    def __init__(self, url: str, fake: FakeVLLM) -> None:
        self.url = url
        self.host, port = url.removeprefix("http://").split(":")
        self.port = int(port)
        self.fake = fake

    def send(
        self, method: str, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=CASE_TIMEOUT_S)
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        except TimeoutError as err:
            raise AssertionError(f"hang: no answer within {CASE_TIMEOUT_S} s") from err
        finally:
            conn.close()

    def check(self, test: str, method: str, path: str, body: bytes,
              headers: dict[str, str]) -> None:
        CASES[test] = CASES.get(test, 0) + 1
        status, head, data = self.send(method, path, body, headers)
        where = f"{method} {path} {headers} {body[:300]!r} -> {status} {data[:500]!r}"
        assert status < 500 or status == 503, where
        if status >= 400:
            doc = json.loads(data)
            error = doc["error"]
            assert error["message"] and error["code"], where
            assert {"type", "param"} <= set(error), where
            if status == 503:
                assert error["code"] == "backend_unavailable", where
            if status in (429, 503):
                assert int(head["retry-after"]) >= 1, where
        elif status == 200 and head.get("content-type", "").startswith("text/event-stream"):
            assert data.rstrip().endswith(b"data: [DONE]"), where


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    tmp = tmp_path_factory.mktemp("fuzz")
    fake = FakeVLLM(free_port(), interval_s=0.0)
    config = tmp / "policy.yaml"
    config.write_text(yaml.safe_dump({
        "sloDefaults": {"classes": [
            {"name": "interactive", "kind": "latency", "ttftSeconds": 1, "tbtSeconds": 0.1}]},
        "fairness": {"tenants": [{"name": "team-a"}]},
        "admission": {"queueCap": 64, "maxWaitingSeconds": 60},
        "limits": {"maxStages": 16, "maxPrograms": 200},
    }))
    s = SidecarProcess(
        f"http://127.0.0.1:{fake.port}", config=config, max_running=8,
        max_body_bytes=64 * 1024,
        extra_args=["--default-max-tokens", "4", "--body-timeout", "5", "--header-timeout", "5",
                    "--log-level", "WARNING"],
    )
    try:
        s.wait_ready()
        yield Fuzzed(s.url, fake)
        # healthy afterwards: probes, a normal request, the backend never marked down
        assert get_json(s.url + "/health")[0] == 200
        status, ready = get_json(s.url + "/ready")
        assert status == 200 and ready["ready"] is True, ready
        status, _, doc = post(s.url + "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 5})
        assert status == 200 and doc["usage"]["completion_tokens"] == 5, doc
        text = get_text(s.url + "/metrics")
        with pytest.raises(KeyError):
            metric(text, "jitserve_rejections_total", reason="backend_down")
        assert s.proc.poll() is None
        total = sum(CASES.values())
        line = f"fuzz: {total} generated cases {CASES}: 0 server errors, 0 hangs\n"
        report = os.environ.get("JITSERVE_FUZZ_REPORT")
        if report:
            with open(report, "a") as out:
                out.write(line)
    finally:
        s.close()
        fake.close()


# ---- strategies ----------------------------------------------------------------------------
HOSTILE_TEXT = st.sampled_from(["\ud800", "a\udfffb", "\x00", "\u202e", "🙂" * 3, "", " "])
TEXT = st.one_of(st.text(max_size=40), HOSTILE_TEXT)
NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, 1, -1, 2**31, 2**63, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=12,
)
SMALL = st.integers(1, 6)


def _any(*good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly plausible values, sometimes anything."""
    return st.one_of(*good, JSON)


SLO = st.fixed_dictionaries({}, optional={
    "kind": _any(st.sampled_from(["latency", "deadline", "compound", "best_effort", "urgent"])),
    "class": _any(st.sampled_from(["interactive", "gold"])),
    "ttft_ms": _any(NUMBERS), "tbt_ms": _any(NUMBERS), "tpot_ms": _any(NUMBERS),
    "deadline_s": _any(NUMBERS), "deadline_ms": _any(NUMBERS),
    "program_id": _any(st.text(min_size=1, max_size=8)),
    "stage": _any(st.integers(-2, 40)), "stages": _any(st.integers(-2, 20000)),
    "parent_ids": _any(st.lists(TEXT, max_size=3)),
})
COMMON = {
    "model": _any(st.sampled_from(["fake-model", "gpt-7"])),
    "stream": _any(st.booleans()),
    "stream_options": _any(st.fixed_dictionaries({"include_usage": st.booleans()})),
    "max_tokens": _any(SMALL, st.integers(-5, 10**6)),
    "min_tokens": _any(st.integers(-1, 8)),
    "slo": _any(SLO),
    "app": _any(TEXT),
    "user": _any(TEXT),
    "return_token_ids": _any(st.booleans()),
    "temperature": _any(st.floats(0, 2)),
    "top_p": NUMBERS, "top_k": NUMBERS, "seed": NUMBERS,
    "stop": _any(st.lists(TEXT, max_size=3)),
    "stop_token_ids": _any(st.lists(st.integers(-5, 5000), max_size=3)),
    "ignore_eos": _any(st.booleans()),
    "n": _any(st.integers(0, 3)), "logprobs": _any(st.integers(0, 3)),
    "tools": JSON, "response_format": JSON, "echo": st.booleans(),
}
PROMPT = _any(TEXT, st.lists(st.integers(-3, 5000), max_size=6),
              st.lists(st.lists(st.integers(0, 9), max_size=2), max_size=2))
MESSAGE = st.fixed_dictionaries(
    {"role": _any(st.sampled_from(["user", "system", "assistant"]))},
    optional={"content": _any(TEXT, st.lists(st.fixed_dictionaries(
        {"type": st.just("text"), "text": TEXT}), max_size=2)), "name": TEXT},
)
COMPLETION = st.fixed_dictionaries({"prompt": PROMPT}, optional=COMMON)
CHAT = st.fixed_dictionaries(
    {"messages": _any(st.lists(MESSAGE, max_size=3))},
    optional={**COMMON, "max_completion_tokens": _any(SMALL)},
)
HEADER_TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30)
HEADER_NUMBER = st.one_of(
    st.sampled_from(["1e308", "-1", "0", "nan", "inf", "1e-320", "500", "3600000", "0x10",
                     "", " 5 ", "1_000"]),
    HEADER_TEXT,
)
HEADERS = st.fixed_dictionaries({}, optional={
    "x-slo-ttft-ms": HEADER_NUMBER, "x-slo-tpot-ms": HEADER_NUMBER,
    "x-slo-tbt-ms": HEADER_NUMBER, "x-slo-deadline-ms": HEADER_NUMBER,
    "x-slo-class": st.one_of(st.sampled_from(["interactive", "gold"]), HEADER_TEXT),
    "x-tenant": st.one_of(st.sampled_from(["team-a", "team-b", "-x", "a" * 70]), HEADER_TEXT),
    "Authorization": st.one_of(st.just("Bearer nope"), HEADER_TEXT),
    "Content-Type": st.sampled_from(["application/json", "text/plain", "x/y; charset=latin-1"]),
})


def _encode(doc: Any) -> bytes:
    return json.dumps(doc).encode()  # NaN/Infinity and \\ud800 escapes included on purpose


# ---- the suite -------------------------------------------------------------------------
@FUZZ
@given(body=COMPLETION, headers=HEADERS)
def test_fuzz_completion_bodies(fuzzed: Fuzzed, body: dict[str, Any],
                                headers: dict[str, str]) -> None:
    fuzzed.check("completions", "POST", PATHS[0], _encode(body), headers)


@FUZZ
@given(body=CHAT, headers=HEADERS)
def test_fuzz_chat_bodies(fuzzed: Fuzzed, body: dict[str, Any], headers: dict[str, str]) -> None:
    fuzzed.check("chat", "POST", PATHS[1], _encode(body), headers)


@FUZZ
@given(
    body=st.one_of(JSON.map(_encode), st.binary(max_size=200),
                   st.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n),
                   st.integers(1, 3000).map(lambda n: b'{"prompt": ' + b"[" * n + b"]" * n
                                            + b"}")),
    path=st.sampled_from([*PATHS, "/v1/models", "/nope", "/metrics", "/v1/completions/x"]),
    method=st.sampled_from(["POST", "POST", "GET", "PUT", "DELETE"]),
)
def test_fuzz_raw_bodies_and_routes(fuzzed: Fuzzed, body: bytes, path: str,
                                    method: str) -> None:
    fuzzed.check("raw", method, path, body, {"Content-Type": "application/json"})


@FUZZ
@given(
    headers=HEADERS,
    stream=st.booleans(),
    program=st.one_of(st.none(), st.tuples(st.text(min_size=1, max_size=4), st.integers(0, 20),
                                           st.integers(1, 20))),
)
def test_fuzz_slo_headers_on_valid_bodies(fuzzed: Fuzzed, headers: dict[str, str], stream: bool,
                                          program: tuple[str, int, int] | None) -> None:
    body: dict[str, Any] = {"prompt": [1, 2, 3], "max_tokens": 3, "stream": stream}
    if program is not None:
        body["slo"] = {"program_id": program[0], "stage": program[1], "stages": program[2]}
    headers = {**headers, "Content-Type": "application/json"}
    fuzzed.check("headers", "POST", PATHS[0], _encode(body), headers)


def test_fuzz_case_count_recorded(fuzzed: Fuzzed, tmp_path: Path) -> None:
    """Runs last in the module: the cases above really ran."""
    assert sum(CASES.values()) >= min(EXAMPLES, 50), CASES
