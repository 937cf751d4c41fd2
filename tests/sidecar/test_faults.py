"""Fault injection: the backend dies mid-stream and comes back.

The backend here is the suite's FAKE vLLM (:class:`fake_backend.FakeVLLM`): the real one
cannot be killed and brought back on the same port within a test. The faults against the
real vLLM (SIGKILL, SIGSTOP, poison tenant, drain) are in test_sidecar_vllm_faults.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from jitserve.bench.live import StreamResult, stream_completion
from tests.support.fake_vllm import FakeVLLM
from tests.support.http import get_json, get_text, metric
from tests.support.sidecar import SidecarProcess
from tests.support.waiting import body_timeout

pytestmark = body_timeout(180)
PAUSE_AT = 20  # tokens the victim gets, at most, before its backend freezes and dies


def test_backend_dying_mid_stream(tmp_path: Path) -> None:
    from jitserve.devstack.vllm import free_port

    fake = FakeVLLM(free_port(), pause_at=PAUSE_AT)  # the victim cannot finish before the kill
    config = tmp_path / "policy.yaml"
    config.write_text(yaml.safe_dump({"admission": {"maxWaitingSeconds": 120}}))
    s = SidecarProcess(f"http://127.0.0.1:{fake.port}", config=config, max_running=1)
    try:
        s.wait_ready()

        async def scenario() -> tuple[StreamResult, list[StreamResult], dict[str, Any]]:
            async with aiohttp.ClientSession() as session:

                def send(n: int) -> asyncio.Task[StreamResult]:
                    return asyncio.create_task(
                        stream_completion(session, s.url, {"prompt": [1, 2, 3], "max_tokens": n})
                    )

                victim = send(400)  # runs; dies with the backend
                while not s.state()["running"]:
                    await asyncio.sleep(0.01)
                queued = [send(10), send(12)]  # wait behind it
                while s.state()["waiting"] < 2:
                    await asyncio.sleep(0.01)
                while not any(r["generated"] >= 5 for r in s.state()["running_requests"]):
                    await asyncio.sleep(0.01)
                fake.kill()
                hit = await victim
                # the backend is down: not ready, new requests refused, the queue is kept
                deadline = time.monotonic() + 30
                while get_json(s.url + "/ready")[0] != 503:
                    assert time.monotonic() < deadline, "/ready stayed 200"
                    await asyncio.sleep(0.05)
                _, ready = get_json(s.url + "/ready")
                async with session.post(
                    s.url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 3}
                ) as resp:
                    refused = {
                        "status": resp.status,
                        "retry_after": resp.headers.get("Retry-After"),
                        "body": await resp.json(),
                        "ready": ready,
                        "waiting": s.state()["waiting"],
                    }
                assert not any(t.done() for t in queued), "a queued request was dropped"
                await asyncio.sleep(1.0)
                assert not any(t.done() for t in queued), "a queued request was dropped"
                fake.revive()
                return hit, list(await asyncio.gather(*queued)), refused

        hit, served, refused = asyncio.run(scenario())
        # the affected client got the tokens produced so far, then a clear error event
        assert hit.status == 200 and 5 <= len(hit.token_ids) <= PAUSE_AT
        assert hit.token_ids == list(range(100, 100 + len(hit.token_ids)))
        assert hit.finish_reason is None
        assert hit.error is not None and hit.error["code"] == "backend_failed"
        assert hit.error["type"] == "service_unavailable" and "message" in hit.error
        # while down: /ready false with the reason, new requests 503 + Retry-After, queue kept
        assert refused["ready"]["ready"] is False and refused["ready"]["reason"]
        assert refused["status"] == 503 and int(refused["retry_after"]) >= 1
        assert refused["body"]["error"]["code"] == "backend_unavailable"
        assert refused["waiting"] == 2
        # back up: the queued requests were served, in full
        assert [r.status for r in served] == [200, 200]
        assert [len(r.token_ids) for r in served] == [10, 12]
        assert all(r.error is None and r.finish_reason == "length" for r in served)
        status, ready = get_json(s.url + "/ready")
        assert status == 200 and ready["ready"] is True
        text = get_text(s.url + "/metrics")
        assert metric(text, "jitserve_requests_total", outcome="error") == 1
        assert metric(text, "jitserve_requests_total", outcome="met") == 2
        assert metric(text, "jitserve_backend_up") == 1
        assert metric(text, "jitserve_rejections_total", reason="backend_down") >= 1
        # the autoscaler's demand: every valid request, the refused one included
        assert metric(text, "jitserve_arrivals_total") == 4
        assert json.loads(json.dumps(s.state()))["waiting"] == 0
    finally:
        s.close()
        fake.close()
