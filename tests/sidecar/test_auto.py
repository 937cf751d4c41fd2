"""``scheduler.policy: auto`` in the sidecar (issue 31), in front of the real tiny vLLM:
the scheduler switched again and again under load loses, duplicates and fails no
request; the real tuner replays the traffic in a process of its own and its table shows
on ``/debug/scheduler`` and in the metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import aiohttp
import pytest
import yaml

from jitserve.bench.stream import StreamResult, stream_completion
from jitserve.policy import SLOPolicySpec
from jitserve.requests import Workitem
from jitserve.scheduling.estimators import LengthEstimator
from jitserve.sidecar.config import SidecarSettings
from jitserve.sidecar.server import SidecarServer
from jitserve.sim.latency import Profile
from jitserve.tuning.tuner import Trial
from tests.support.http import alternates, get_json, get_text, metric, metric_total, post
from tests.support.sidecar import keeping_every_request, wait_backend_idle
from tests.support.waiting import body_timeout, wait_until

pytestmark = body_timeout(300)

PROMPT = [5, 17, 99, 400, 23, 8, 77]
CANDIDATES = ["gmax", "edf", "fcfs", "sarathi"]


def auto_policy(**auto: Any) -> dict[str, Any]:
    """Auto over schedulers without overload control, the door off: every request is
    served (a retirement would be the policy's choice, not a lost request)."""
    doc = keeping_every_request({"scheduler": {"policy": "auto", "auto": {
        "candidates": CANDIDATES, "periodSeconds": 0.3, "windowSeconds": 0.5,
        "warmupSeconds": 0, "memory": 1, "minRequests": 1, "profile": "cpu-tiny-llama",
        **auto}}})
    return doc


class EveryPeriodAnother:
    """A scripted replayer (it stands in for the simulator's replays, which cannot be
    made to disagree on cue): each comparison scores the scheduler in effect lowest, so
    the tuner switches at every period."""

    def __init__(self) -> None:
        self.server: SidecarServer | None = None
        self.windows: list[int] = []
        self.frozen = False
        """Set: each comparison scores the scheduler in effect highest (no more switches)."""

    async def __call__(self, spec: SLOPolicySpec, profile: Profile,
                       items: Sequence[Workitem], estimator: LengthEstimator,
                       ) -> tuple[tuple[Trial, ...], float]:
        assert self.server is not None
        self.windows.append(len(items))
        running = self.server.dispatcher.scheduler
        low, high = (100.0, 1.0) if self.frozen else (1.0, 100.0)
        return tuple(Trial(name, low if name == running else high, 1, len(items))
                     for name in spec.scheduler.auto.candidates), 0.0


async def _serve_and_stream(settings: SidecarSettings, replayer: EveryPeriodAnother,
                            switches: int, max_tokens: int) -> tuple[list[StreamResult], str, Any]:
    """Streams arrive every 50 ms until the tuner has switched ``switches`` times (a count,
    not a duration: on a busy machine its periods come late), then all are read out."""
    server = SidecarServer(settings, replayer=replayer)
    replayer.server = server
    port = await server.start()
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            body = {"prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True,
                    "temperature": 0}
            tasks = []
            while len(replayer.windows) < switches and len(tasks) < 4000:
                tasks.append(asyncio.create_task(stream_completion(session, url, body)))
                await asyncio.sleep(0.05)
            results = list(await asyncio.gather(*tasks))
            replayer.frozen = True
            # a comparison begun before the freeze may still switch: read the metrics
            # between two looks at the scheduler in effect that agree
            for _ in range(100):
                async with session.get(url + "/debug/scheduler") as resp:
                    before = await resp.json()
                async with session.get(url + "/metrics") as resp:
                    text = await resp.text()
                async with session.get(url + "/debug/scheduler") as resp:
                    explained = await resp.json()
                if before["auto"]["in_effect"] == explained["auto"]["in_effect"] and (
                        before["auto"]["last"] == explained["auto"]["last"]):
                    break
                await asyncio.sleep(0.1)
        return results, text, explained
    finally:
        await server.shutdown(2.0)
        await server.stop()


def test_switching_the_scheduler_under_load_loses_no_request(vllm_url: str,
                                                             tmp_path: Any) -> None:
    wait_backend_idle(vllm_url)
    config = tmp_path / "policy.yaml"
    config.write_text(yaml.safe_dump(auto_policy()))
    settings = SidecarSettings(backend_url=vllm_url, host="127.0.0.1", port=0,
                               config_path=config, max_running=4)
    replayer = EveryPeriodAnother()
    max_tokens = 48
    results, text, explained = asyncio.run(_serve_and_stream(settings, replayer, 4, max_tokens))
    n = len(results)

    for r in results:  # every token once, in order (the greedy output's ABAB cycle holds
        assert r.status == 200 and r.error is None, r  # across a preemption's seam)
        assert len(r.token_ids) == max_tokens and r.finish_reason == "length", r
        assert alternates(r.token_ids), r.token_ids
    switches = metric(text, "jitserve_policy_switches_total")
    assert switches >= 4, (switches, replayer.windows)  # the load ran across them
    assert metric(text, "jitserve_tuner_comparisons_total", decision="switched") == switches
    assert metric(text, "jitserve_requests_total") == n  # each ended once, none failed
    assert metric_total(text, "jitserve_requests_total", outcome="error") == 0
    in_effect = [line for line in text.splitlines()
                 if line.startswith("jitserve_policy_in_effect{")]
    assert len(in_effect) == 1 and explained["auto"]["in_effect"] in in_effect[0]
    assert explained["auto"]["last"]["choice"] == explained["auto"]["in_effect"]


def test_the_real_tuner_compares_the_candidates_in_its_own_process(sidecar: Any) -> None:
    """Through a sidecar process, the simulator's replays for real: a comparison table of
    every candidate on the traffic just served, its CPU counted, every request served
    (a margin no candidate beats: what runs is known when the metrics are read)."""
    s = sidecar(auto_policy(candidates=["gmax", "fcfs"], periodSeconds=1.0,
                            windowSeconds=4.0, warmupSeconds=0.5, minRequests=3, margin=10))
    served = 0

    def compared() -> dict[str, Any] | None:
        """A request served (a steady trickle: each window holds several), then the last
        comparison, if any yet."""
        nonlocal served
        status, _, doc = post(s.url + "/v1/completions",
                              {"prompt": PROMPT, "max_tokens": 8, "ignore_eos": True})
        assert status == 200 and doc["usage"]["completion_tokens"] == 8, doc
        served += 1
        _, state = get_json(s.admin_url + "/debug/scheduler")
        last: dict[str, Any] | None = state["auto"]["last"]
        return last

    last = wait_until("a comparison", compared, timeout_s=120, every_s=0.3)
    assert [t["policy"] for t in last["trials"]] == ["gmax", "fcfs"]
    assert all(3 <= t["items"] <= served for t in last["trials"])
    assert last["cpu_s"] > 0
    assert last["choice"] == last["in_effect"] == "gmax"
    text = get_text(s.admin_url + "/metrics")
    assert metric(text, "jitserve_tuner_cpu_seconds_total") > 0
    assert metric(text, "jitserve_tuner_comparisons_total", decision="kept") >= 1
    assert metric(text, "jitserve_policy_in_effect", policy="gmax") == 1


def test_a_replay_process_that_died_is_started_again() -> None:
    """The worker killed (the kernel's OOM killer, an operator's kill): that comparison
    fails, the next one runs in a new worker."""
    import os
    import signal
    from concurrent.futures.process import BrokenProcessPool

    from jitserve.scheduling.estimators import QuantileEstimator
    from jitserve.sidecar.tuning import ProcessReplayer
    from jitserve.sim.latency import load_profile
    from jitserve.sim.workload import WorkloadSpec, generate

    spec = SLOPolicySpec.model_validate(auto_policy(candidates=["gmax", "fcfs"]))
    items = list(generate(WorkloadSpec(trace="azure-conv", duration_s=5.0, rate_per_s=4.0,
                                       slo=spec.slo_defaults)))
    profile, estimator = load_profile("cpu-tiny-llama"), QuantileEstimator(0.95)

    async def scenario() -> None:
        replayer = ProcessReplayer()
        try:
            trials, _ = await replayer(spec, profile, items, estimator)
            assert [t.policy for t in trials] == ["gmax", "fcfs"]
            pool = replayer._pool
            assert pool is not None
            for pid in list(pool._processes):
                os.kill(pid, signal.SIGKILL)
            with pytest.raises(BrokenProcessPool):
                await replayer(spec, profile, items, estimator)
            again, _ = await replayer(spec, profile, items, estimator)
            assert again == trials and replayer._pool is not pool
        finally:
            replayer.close()

    asyncio.run(scenario())
