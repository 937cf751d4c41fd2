"""The chart's observability: the PrometheusRule under Debian's promtool, and a real
Prometheus (Debian's `prometheus`) scraping a real sidecar in front of a real tiny vLLM,
evaluating every query of the Grafana dashboard and firing the burn-rate alert under an
induced SLO miss. scripts/setup-prometheus.sh installs both binaries.

Labels: in a cluster the chart's PodMonitor puts ``namespace``, ``pod`` and ``policy`` (from
the pod label ``jitserve.io/policy``) on the targets; here static scrape configs carry the
same labels, since no prometheus-operator runs.
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.http import burst, complete, metric_total
from tests.support.operator_session import MEASURED, chart_objects
from tests.support.prometheus import Prometheus, tool
from tests.support.sidecar import SidecarProcess
from tests.support.stall import StallRelay
from tests.support.waiting import wait_until

HERE = Path(__file__).resolve().parent
TARGET = {"namespace": "e2e", "policy": "live", "pod": "live-0"}


def rule_groups(values: dict[str, Any] | None = None) -> dict[str, Any]:
    """The PrometheusRule's spec, as Helm renders the chart (monitoring values merged)."""
    rule_values = {"enabled": True, **(values or {})}
    docs = chart_objects({"monitoring": {"prometheusRule": rule_values}})
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    spec: dict[str, Any] = rule["spec"]
    return spec


def dashboard() -> dict[str, Any]:
    (config_map,) = [d for d in chart_objects() if d["kind"] == "ConfigMap"]
    board: dict[str, Any] = json.loads(config_map["data"]["jitserve.json"])
    return board


def queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (panel["title"], target["expr"])
        for panel in board["panels"]
        for target in panel.get("targets", [])
    ]


def test_promtool_checks_the_chart_rules(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rule_groups(), sort_keys=False))
    result = subprocess.run(
        [tool("promtool"), "check", "rules", str(rules)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 10 rules found" in result.stdout


def _promtool_test(tmp_path: Path, groups: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(groups, sort_keys=False))
    shutil.copy(HERE / "monitoring" / "rules_test.yaml", tmp_path / "rules_test.yaml")
    return subprocess.run(
        [tool("promtool"), "test", "rules", str(tmp_path / "rules_test.yaml")],
        capture_output=True,
        text=True,
    )


def test_promtool_unit_tests_of_the_chart_rules(tmp_path: Path) -> None:
    result = _promtool_test(tmp_path, rule_groups())
    assert result.returncode == 0, result.stdout + result.stderr
    # The unit tests can fail: with a lax objective (budget 0.5) the 90% miss rate is under
    # 14.4x the budget, so the expected burn-rate alert is missing.
    lax = _promtool_test(tmp_path, rule_groups({"objective": 0.5}))
    assert lax.returncode != 0 and "JitserveSLOBurnRateFast" in lax.stdout + lax.stderr


def test_dashboard_is_grafana_json_with_the_issue_panels() -> None:
    board = dashboard()
    assert board["uid"] == "jitserve-slo"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    exprs = " ".join(expr for _, expr in queries(board))
    for metric in (
        "jitserve_goodput_tokens_total",
        "jitserve_requests_total",
        "jitserve_queue_time_seconds_bucket",
        "jitserve_effective_cutoff",
        "jitserve_fairness_weight",
        "jitserve_preemptions_total",
        "jitserve_retirements_total",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:generation_tokens_total",
    ):
        assert metric in exprs, metric
    variables = [v["name"] for v in board["templating"]["list"]]
    assert variables == ["datasource", "namespace", "policy", "tenant"]


@pytest.fixture
def relay(vllm_url: str) -> Iterator[StallRelay]:
    with StallRelay(vllm_url) as held:
        yield held


@pytest.fixture
def prometheus_stack(
    vllm_url: str, relay: StallRelay, tmp_path: Path
) -> Iterator[tuple[SidecarProcess, Prometheus, StallRelay]]:
    """A sidecar (max one request in vLLM, 0.5 s waiting limit) in front of vLLM through a
    relay the test can hold, and a Prometheus scraping it and vLLM every second, with the
    chart's rules at test windows (30 s / 10 s)."""
    policy = {
        "admission": {"maxWaitingSeconds": 0.5},
        "sloDefaults": {
            "classes": [
                # a latency class any machine meets (the misses are induced below)
                {"name": "interactive", "kind": "latency", "ttftSeconds": 60, "tbtSeconds": 10}
            ]
        },
    }
    config = tmp_path / "policy.yaml"
    config.write_text(yaml.safe_dump(policy))
    sidecar = SidecarProcess(relay.url, config=config, max_running=1, engine_queue=None,
                             admin_port=True, extra_args=["--stall-timeout", "600"]).wait_ready()
    burn = {"name": "Fast", "long": "30s", "short": "10s", "factor": 14.4, "for": "0s",
            "severity": "critical"}  # fmt: skip
    (tmp_path / "rules.yaml").write_text(
        yaml.safe_dump(rule_groups({"burnRates": [burn]}), sort_keys=False)
    )
    vllm_target = urllib.parse.urlsplit(vllm_url).netloc

    def job(name: str, target: str, component: str) -> dict[str, Any]:
        labels = {**TARGET, "jitserve_component": component}
        return {"job_name": name, "static_configs": [{"targets": [target], "labels": labels}]}

    prometheus = Prometheus(
        tmp_path,
        {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(tmp_path / "rules.yaml")],
            "scrape_configs": [
                job("jitserve-sidecar", f"127.0.0.1:{sidecar.admin_port}", "sidecar"),
                job("vllm", vllm_target, "vllm"),
            ],
        },
    )
    try:
        yield sidecar, prometheus, relay
    finally:
        prometheus.close()
        sidecar.close()


def _evaluated_at(group: dict[str, Any]) -> float:
    """A rule group's lastEvaluation (RFC 3339 with nanoseconds) as a Unix time."""
    stamp = str(group["lastEvaluation"])
    head, _, frac = stamp.rstrip("Z").partition(".")
    base = datetime.fromisoformat(head).replace(tzinfo=UTC).timestamp()
    return base + float(f"0.{frac.split('+')[0] or 0}")


def _substituted(expr: str) -> str:
    """A dashboard query as Grafana sends it for namespace e2e, policy live, all tenants."""
    for var, value in (
        ("$namespace", TARGET["namespace"]),
        ("$policy", TARGET["policy"]),
        ("$tenant", ".*"),
        ("$__rate_interval", "5m"),
    ):
        expr = expr.replace(var, value)
    return expr


def test_prometheus_evaluates_every_dashboard_query_and_fires_the_burn_rate_alert(
    prometheus_stack: tuple[SidecarProcess, Prometheus, StallRelay],
) -> None:
    sidecar, prometheus, relay = prometheus_stack
    start = time.monotonic()
    wait_until(
        "both targets up",
        lambda: len([r for r in prometheus.query("up == 1")]) == 2,
        timeout_s=120,
    )
    # Traffic of two tenants and an SLO class, all met, in two rounds with a scrape between:
    # a counter's first exposure already holds its first increments, which rate() cannot
    # see (a property of Prometheus counters), so a series needs increments after it.
    for round_ in (1, 2):
        assert complete(sidecar.url, {"kind": "deadline", "deadline_s": 60}, tenant="alpha") == 200
        assert complete(sidecar.url, {"class": "interactive"}, tenant="beta") == 200
        wait_until(
            f"round {round_} scraped",
            lambda n=round_: [
                r
                for r in prometheus.query('sum(jitserve_requests_total{outcome="met"})')
                if float(r["value"][1]) == 2 * n
            ],
            timeout_s=120,
        )
    # ... then a burst the sidecar cannot start in time (the relay holds vLLM's work until
    # the waiting limit retired some): some are retired (HTTP 429), the rest served.
    relay.hold()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        sent = pool.submit(burst, sidecar.url, [
            dict(slo={"kind": "deadline", "deadline_s": 60}, max_tokens=200) for _ in range(8)])
        wait_until("a retirement", lambda: metric_total(
            sidecar.metrics(), "jitserve_requests_total", outcome="retired") > 0, 120)
        relay.release()
        codes = sent.result(timeout=300)
    assert 429 in codes and 200 in codes, codes
    wait_until(
        "the 12 requests in Prometheus",
        lambda: [r for r in prometheus.query("sum(jitserve_requests_total)")
                 if float(r["value"][1]) == 12],
        timeout_s=120,
    )  # fmt: skip
    scraped = time.time()
    wait_until(
        "a rule evaluation after that scrape",
        lambda: all(_evaluated_at(group) > scraped for group in prometheus.api("rules")["groups"]),
        timeout_s=120,
    )
    # Whether the burst's retirements alone cross the threshold depends on which scrape
    # first exposed the retired series (rate() cannot see a series' first increments) and
    # on how the windows slide; so the misses start only once the burst has left the short
    # window (no request counted there: the ratio is not a number) and the alert is quiet:
    # from then on, what the short window holds is the induced misses alone.
    wait_until(
        "the burst out of the short window, the alert quiet",
        lambda: not any(math.isfinite(float(r["value"][1]))
                        for r in prometheus.query("jitserve:slo_error_ratio:rate10s"))
        and not prometheus.query('ALERTS{alertname="JitserveSLOBurnRateFast"}'),
        timeout_s=120,
    )  # fmt: skip
    # The induced SLO miss: a first token within 1 ms is impossible; keep it up until the
    # alert fires (the short window needs fresh misses).
    stop = threading.Event()

    def miss() -> None:
        while not stop.is_set():
            complete(sidecar.url, {"kind": "latency", "ttft_ms": 1, "tbt_ms": 1}, tenant="beta")

    thread = threading.Thread(target=miss, daemon=True)
    thread.start()
    induced = time.monotonic()

    def fired() -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
        # The short window's ratio read while the misses still come (once they stop, it
        # is 0/0 within 10 s).
        firing = prometheus.query('ALERTS{alertname="JitserveSLOBurnRateFast",'
                                  'alertstate="firing"}')  # fmt: skip
        ratios = [r for r in prometheus.query("jitserve:slo_error_ratio:rate10s")
                  if math.isfinite(float(r["value"][1]))]  # fmt: skip
        return (firing, ratios) if firing and ratios else None

    try:
        firing, ratios = wait_until("JitserveSLOBurnRateFast firing", fired, timeout_s=90)
    finally:
        stop.set()
        thread.join(timeout=30)
    MEASURED["burn_rate_alert_after_induced_miss_s"] = time.monotonic() - induced
    (alert,) = firing
    assert alert["metric"]["namespace"] == "e2e" and alert["metric"]["policy"] == "live"
    assert alert["metric"]["severity"] == "critical"
    (ratio,) = ratios
    assert float(ratio["value"][1]) > 14.4 * 0.05

    # Every dashboard query: at least one series, and a number (not NaN) in it.
    board = dashboard()
    empty: list[str] = []
    for title, expr in queries(board):
        result = prometheus.query(_substituted(expr))
        if not any(math.isfinite(float(r["value"][1])) for r in result):
            empty.append(f"{title}: {_substituted(expr)} -> {result}")
    assert empty == [], "\n".join(empty)
    # The dashboard's variables (label_values(metric, label)) list this target's values.
    for variable in board["templating"]["list"][1:]:
        inner = variable["query"]["query"][len("label_values(") : -1]
        metric, label = inner.rsplit(",", 1)
        values = prometheus.api(
            f"label/{label.strip()}/values", **{"match[]": _substituted(metric)}
        )
        assert values, variable["name"]
    MEASURED["dashboard_queries_evaluated"] = float(len(queries(board)))
    MEASURED["prometheus_test_s"] = time.monotonic() - start
