"""``--access-log``: one JSON line per answered request, written when the answer ends,
with how the request ended; none without the flag."""

from __future__ import annotations

import json
from typing import Any

from tests.support.http import post, stream
from tests.support.sidecar import Factory
from tests.support.waiting import body_timeout, wait_until

pytestmark = body_timeout(240)

PROMPT = [5, 17, 99, 400, 23, 8, 77]
SLO = {"kind": "latency", "ttft_ms": 60000, "tbt_ms": 5000}  # generous: about the log


def _lines(text: str) -> list[dict[str, Any]]:
    """The access log's lines for completions (the fixture's /ready polls are there too)."""
    return [doc for line in text.splitlines() if line.startswith('{"time"')
            if (doc := json.loads(line))["path"] == "/v1/completions"]


def test_each_answer_is_one_json_line_with_its_outcome(sidecar: Factory) -> None:
    s = sidecar(extra_args=["--access-log"])
    served = stream(s.url, {"prompt": PROMPT, "max_tokens": 6, "ignore_eos": True, "slo": SLO},
                    headers={"x-tenant": "team-a"})
    assert served.status == 200 and len(served.token_ids) == 6
    status, _, _ = post(s.url + "/v1/completions", {"prompt": PROMPT, "max_tokens": -1})
    assert status == 400
    lines = wait_until("two access-log lines", lambda: (
        found if len(found := _lines(s.log_path.read_text())) >= 2 else None), 30)
    done = next(line for line in lines if line["status"] == 200)
    assert done["method"] == "POST" and done["tenant"] == "team-a"
    assert done["kind"] == "latency" and done["outcome"] in ("met", "missed")
    assert done["completion_tokens"] == 6 and done["prompt_tokens"] == len(PROMPT)
    assert done["finish_reason"] == "length"
    headers = {k.lower(): v for k, v in served.headers.items()}
    assert done["request_id"] == headers["x-jitserve-request-id"]
    refused = next(line for line in lines if line["status"] == 400)
    assert "request_id" not in refused  # refused before it was scheduled


def test_no_access_log_without_the_flag(sidecar: Factory) -> None:
    s = sidecar()
    served = stream(s.url, {"prompt": PROMPT, "max_tokens": 2, "ignore_eos": True, "slo": SLO})
    assert served.status == 200
    assert '{"time"' not in s.log_path.read_text()
