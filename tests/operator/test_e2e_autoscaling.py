"""Scale by SLO end to end (issue 28): the real API server and controller-manager (which
make the Deployment's pods), the session operator (the real CLI) with a policy's
``spec.autoscaling`` on, a real sidecar in front of the FAKE vLLM as the policy's pods
(the test plays the kubelet: it marks the pods Running and Ready at 127.0.0.1, so the
operator scrapes that sidecar), and Debian's Prometheus scraping the operator's and the
sidecar's metrics.

Load up moves ``spec.replicas`` and the Deployment's replicas up; the load gone moves
them down; the count never goes back up in between (no flapping); the chart's KEDA query,
on the real Prometheus, reads the planner's count.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import yaml

from jitserve.devstack import vllm as vl
from jitserve.operator import builders as b
from jitserve.operator import constants as c
from jitserve.operator.autoscaler import pod_readiness
from jitserve.operator.kube import RestKube
from tests.support.fake_vllm import FakeVLLM
from tests.support.http import post
from tests.support.kube_fake import serving
from tests.support.operator_session import (
    SESSION_NAMESPACES,
    SessionOperator,
    chart_objects,
    mark_pods_running,
    wait_for,
)
from tests.support.prometheus import Prometheus
from tests.support.sidecar import SidecarProcess
from tests.support.waiting import body_timeout

NS = SESSION_NAMESPACES[4]  # the session operator's "metrics" namespace
NAME = "scaled"
pytestmark = body_timeout(300)


def keda_query() -> str:
    """The query of the ScaledObject the chart renders for this policy."""
    values = {"keda": {"enabled": True, "serverAddress": "http://prometheus:9090",
                       "policies": [{"name": NAME, "namespace": NS, "minReplicas": 1,
                                     "maxReplicas": 3}]}}
    (scaled,) = [o for o in chart_objects(values) if o["kind"] == "ScaledObject"]
    query: str = scaled["spec"]["triggers"][0]["metadata"]["query"]
    return query


class Load:
    """Requests to the sidecar, back to back from two threads, until stopped."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.sent = 0
        self.failed: list[Any] = []
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(2)]
        for t in self.threads:
            t.start()

    def run(self) -> None:
        while not self.stop.is_set():
            status, _, doc = post(self.url + "/v1/completions",
                                  {"prompt": [1, 2, 3], "max_tokens": 2})
            self.sent += 1
            if status != 200:
                self.failed.append((status, doc))
            time.sleep(0.05)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)


def test_load_moves_the_replicas_up_and_its_end_down_without_flapping(
    admin: RestKube, session_operator: SessionOperator, tmp_path: Path
) -> None:
    fake = FakeVLLM(vl.free_port(), interval_s=0.001)
    config = tmp_path / "policy.yaml"
    config.write_text(yaml.safe_dump({}))
    sidecar = SidecarProcess(f"http://127.0.0.1:{fake.port}", config=config, admin_port=True)
    prometheus = Prometheus(tmp_path, {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "operator", "static_configs": [
                {"targets": [f"127.0.0.1:{session_operator.metrics_port}"]}]},
            {"job_name": "sidecar", "static_configs": [
                {"targets": [sidecar.admin_url.removeprefix("http://")]}]},
        ],
    })
    seen: list[int] = []
    watching = threading.Event()

    def spec_replicas() -> int:
        body = admin.get(c.API_VERSION, c.KIND, NS, NAME) or {}
        return int(body.get("spec", {}).get("replicas", 0))

    def watch() -> None:
        while not watching.is_set():
            n = spec_replicas()
            if not seen or seen[-1] != n:
                seen.append(n)
            time.sleep(0.1)

    def kubelet() -> int:
        return mark_pods_running(admin, NS, NAME)

    load: Load | None = None
    try:
        sidecar.wait_ready()
        admin.create({
            "apiVersion": c.API_VERSION, "kind": c.KIND,
            "metadata": {"name": NAME, "namespace": NS},
            "spec": serving({
                "replicas": 1,
                "sidecar": {"port": sidecar.port, "adminPort": sidecar.admin_port},
                # a replica is worth 1 request/s; the planner decides every 2 s, looks
                # 10 s back, and removes after 4 s of agreeing recommendations
                "autoscaling": {"enabled": True, "replicaCapacity": 1.0, "utilization": 0.5,
                                "minReplicas": 1, "maxReplicas": 3, "periodSeconds": 2,
                                "warmupSeconds": 0, "trendSeconds": 10,
                                "scaleDownStabilizationSeconds": 4},
            }),
        })
        threading.Thread(target=watch, daemon=True).start()
        wait_for("the serving pod", lambda: admin.list("v1", "Pod", NS,
                                                       b.selector_string(NAME)), 60)
        kubelet()
        load = Load(sidecar.url)  # ~2 threads x ~15/s: far above 3 replicas' worth

        def deployment_replicas() -> int:
            found = admin.get("apps/v1", "Deployment", NS, NAME) or {}
            return int(found.get("spec", {}).get("replicas", 0))

        wait_for("spec.replicas at the maximum", lambda: spec_replicas() == 3, 90)
        wait_for("the Deployment following it", lambda: deployment_replicas() == 3, 60)
        status = (admin.get(c.API_VERSION, c.KIND, NS, NAME) or {})["status"]["autoscaling"]
        assert status["desiredReplicas"] == 3 and "lastScaleTime" in status

        def keda_reads_three() -> bool:
            result = prometheus.query(keda_query())
            return bool(result) and float(result[0]["value"][1]) == 3

        wait_for("the chart's KEDA query to read the planner's count", keda_reads_three, 60)
        # the demand the operator read, as Prometheus scraped it from the same sidecar
        def arriving() -> bool:
            found = prometheus.query('sum(rate(jitserve_arrivals_total{job="sidecar"}[10s]))')
            return bool(found) and float(found[0]["value"][1]) > 3  # above 3 replicas' worth

        wait_for("Prometheus to see the sidecar's arrivals", arriving, 30)
        wait_for("three pods", lambda: kubelet() == 3, 60)  # the new pods come up
        load.close()
        assert load.sent > 50 and not load.failed, load.failed[:3]
        try:
            wait_for("spec.replicas back at the minimum", lambda: spec_replicas() == 1, 120)
        except AssertionError:
            body = admin.get(c.API_VERSION, c.KIND, NS, NAME) or {}
            pods = admin.list("v1", "Pod", NS, b.selector_string(NAME))
            status = body.get("status", {})
            raise AssertionError(
                f"{status.get('autoscaling')}; pods (ready, warming) {pod_readiness(pods)}; "
                f"seen {seen}; last scrape {status.get('lastScrapeTime')}; operator log:\n"
                f"{session_operator.log()[-3000:]}") from None
        wait_for("the Deployment following it", lambda: deployment_replicas() == 1, 60)
        watching.set()
        # up to the top, then down, never up again
        top = seen.index(3)
        assert seen[: top + 1] == sorted(seen[: top + 1]), seen
        assert seen[top:] == sorted(seen[top:], reverse=True), seen
        events = admin.list("v1", "Event", NS)
        reasons = [e["reason"] for e in events
                   if e.get("involvedObject", {}).get("name") == NAME
                   and e["reason"] in ("ScaledUp", "ScaledDown")]
        assert "ScaledUp" in reasons and "ScaledDown" in reasons, reasons
    finally:
        watching.set()
        if load is not None:
            load.close()
        admin.delete(c.API_VERSION, c.KIND, NS, NAME)
        prometheus.close()
        sidecar.close()
        fake.close()
