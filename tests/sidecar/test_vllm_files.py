"""The sidecar's policy and key files going bad, and hostile compound programs, in front
of the real vLLM (the session's): auth fails closed when keys are configured but none
load, a bad policy file is reported and the last good one kept, and programs asking for
the most they can do not grow the sidecar's memory.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from tests.support.http import get_json, get_text, metric, post
from tests.support.sidecar import Factory
from tests.support.waiting import body_timeout, wait_until

pytestmark = body_timeout(300)

PROMPT = [5, 17, 99, 400, 23, 8, 77]


def body(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True,
            "slo": {"kind": "deadline", "deadline_s": 900}, **extra}




# ---- policy and key files ------------------------------------------------------------------
def test_keys_configured_but_not_loadable_refuse_everyone(sidecar: Factory,
                                                          tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.yaml"
    keys_file.write_text("")
    s = sidecar(ready=False, extra_args=["--api-keys-file", str(keys_file),
                                         "--admin-key", "admin"])
    url = s.url + "/v1/completions"
    served_without_key = 0

    def try_without_a_valid_key(expect: int) -> None:
        nonlocal served_without_key
        for headers in ({}, {"Authorization": "Bearer guess"}, {"x-tenant": "team-a"},
                        {"Authorization": "Bearer "}):
            status, _, doc = post(url, body(2), headers)
            served_without_key += status == 200
            assert status == expect, (headers, status, doc)
            assert doc["error"]["code"] == ("auth_unavailable" if expect == 503
                                            else "invalid_api_key")

    phases = [
        ("", "empty file"),
        ("team-a: [\n", "corrupt file"),
        ("- just\n- a list\n", "not a mapping"),
        (b"\xff\xfe\x00", "not UTF-8"),
        (None, "missing file"),
    ]
    for content, what in phases:
        if content is None:
            keys_file.unlink()
        elif isinstance(content, bytes):
            keys_file.write_bytes(content)
        else:
            keys_file.write_text(content)
        time.sleep(0.6)  # three reload intervals
        status, ready = get_json(s.url + "/ready")
        assert status == 503 and "API keys" in ready["reason"], (what, ready)
        try_without_a_valid_key(503)
    keys_file.write_text(yaml.safe_dump({"team-a": "key-a"}))
    wait_until("keys loaded", lambda: get_json(s.url + "/ready")[0] == 200, 30)
    try_without_a_valid_key(401)
    status, _, doc = post(url, body(2), {"Authorization": "Bearer key-a"})
    assert status == 200 and doc["jitserve"]["tenant"] == "team-a"
    assert served_without_key == 0
    text = get_text(s.url + "/metrics", {"Authorization": "Bearer admin"})
    assert metric(text, "jitserve_requests_total") == 1  # only the one with a key
    log = s.log_path.read_text()
    assert "Traceback" not in log


def test_missing_secrets_fail_closed(sidecar: Factory, tmp_path: Path) -> None:
    keys_dir = tmp_path / "keys"
    keys_dir.mkdir()
    policy = {"fairness": {"tenants": [{"name": "team-a", "apiKeySecret": "team-a-key"}]}}
    s = sidecar(policy, ready=False, extra_args=["--keys-dir", str(keys_dir)])
    status, ready = get_json(s.url + "/ready")
    assert status == 503 and "team-a" in ready["reason"], ready
    status, _, doc = post(s.url + "/v1/completions", body(2))
    assert status == 503 and doc["error"]["code"] == "auth_unavailable", doc
    s.config.write_text("")  # an emptied policy file keeps the last good one (keys stay on)
    wait_until("the empty policy file to be reported",
               lambda: "empty" in (s.ready()[1].get("config_error") or ""), 60)
    status, ready = get_json(s.url + "/ready")
    assert status == 503 and "empty" in ready["config_error"], ready
    status, _, doc = post(s.url + "/v1/completions", body(2))
    assert status == 503 and doc["error"]["code"] == "auth_unavailable", doc
    (keys_dir / "team-a-key").write_text("key-a\n")
    wait_until("the Secret to load", lambda: get_json(s.url + "/ready")[0] == 200, 30)
    assert post(s.url + "/v1/completions", body(2))[0] == 401
    status, _, doc = post(s.url + "/v1/completions", body(2), {"Authorization": "Bearer key-a"})
    assert status == 200 and doc["jitserve"]["tenant"] == "team-a", doc


def test_bad_policy_files_are_reported_and_the_last_good_one_kept(sidecar: Factory) -> None:
    s = sidecar({"scheduler": {"policy": "gmax", "cutoff": {"mode": "fixed", "value": 0.7}},
                 "fairness": {"weight": 0.3}})
    for errors, (content, needle) in enumerate([
        (b"scheduler:\n  policy: gmax\n\xff\xfe bad bytes\n", "utf-8"),
        (b"scheduler:\n  policy: no-such-scheduler\n", "no-such-scheduler"),
        (b"", "empty"),
        (b"scheduler: [1, 2\n", "cannot read"),
        (b"   \n", "empty"),
    ], start=1):
        s.write_config(content)
        wait_until(f"the error about {needle}",
                   lambda needle=needle: needle in (s.ready()[1].get("config_error") or "").lower(),
                   60)
        status, ready = get_json(s.url + "/ready")
        assert status == 200, ready  # the last good policy serves on
        state = s.state()
        assert state["policy"] == "gmax" and state["describe"]["cutoff"] == 0.7
        assert post(s.url + "/v1/completions", body(2))[0] == 200
        text = get_text(s.url + "/metrics")
        assert metric(text, "jitserve_config_reloads_total", result="error") == errors
        assert metric(text, "jitserve_fairness_weight") == 0.3
    s.write_config({"scheduler": {"policy": "fcfs"}})
    wait_until("the good file to apply", lambda: s.state()["policy"] == "fcfs", 30)
    assert get_json(s.url + "/ready")[1].get("config_error") is None
    assert "Traceback" not in s.log_path.read_text()


# ---- hostile compound programs -------------------------------------------------------------
def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_hostile_programs_do_not_grow_memory(sidecar: Factory) -> None:
    """300 compound requests, each a new program asking for the most it can (stages,
    deadlines from the body and from headers, 1e308 included): the ones over the limits
    are 400s, the others are served, and the sidecar's RSS grows by less than 50 MB."""
    s = sidecar()
    for i in range(10):  # warm up the code paths before measuring
        post(s.url + "/v1/completions", body(1, slo={"program_id": f"warm-{i}", "stages": 2}))
    before = rss_kib(s.proc.pid)
    hostile: list[tuple[dict[str, Any], dict[str, str]]] = [
        ({"program_id": "p", "stages": 10_000}, {}),
        ({"program_id": "p", "stages": 64, "deadline_s": 86_400}, {}),
        ({"program_id": "p", "stages": 64}, {"x-slo-deadline-ms": "1e308"}),
        ({"program_id": "p", "stage": 63, "stages": 64, "parent_ids": ["x" * 256] * 1024}, {}),
        ({"program_id": "p", "stages": 64, "deadline_s": 3600}, {}),
    ]

    async def scenario() -> list[int]:
        sem = asyncio.Semaphore(8)
        async with aiohttp.ClientSession() as session:

            async def one(i: int) -> int:
                slo, headers = hostile[i % len(hostile)]
                doc = body(1, slo={**slo, "program_id": f"hostile-{i}"})
                async with sem, session.post(s.url + "/v1/completions", json=doc,
                                             headers=headers) as resp:
                    await resp.read()
                    return resp.status

            return list(await asyncio.gather(*(one(i) for i in range(300))))

    statuses = asyncio.run(scenario())
    grown_mb = (rss_kib(s.proc.pid) - before) / 1024
    print(f"programs: RSS {before / 1024:.1f} MB -> +{grown_mb:.1f} MB after 300 hostile "
          f"compound requests ({statuses.count(400)} refused, {statuses.count(200)} served)")
    assert statuses.count(400) == 180 and statuses.count(200) == 120, statuses
    assert grown_mb < 50, f"RSS grew {grown_mb:.1f} MB"
