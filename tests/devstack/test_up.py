"""`jitserve up --backend URL` in front of the session's real vLLM: it starts the real
analyzer and the sidecar, prints the endpoint, the sidecar takes its length bounds from
the analyzer, and SIGTERM stops every child."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from jitserve.analyzer.client import AnalyzerClient
from jitserve.devstack import vllm as vl
from tests.support.http import get_json, get_text, metric, metric_total, stream
from tests.support.processes import alive
from tests.support.waiting import body_timeout, wait_until

pytestmark = body_timeout(900)


def test_up_fronts_a_backend_with_the_analyzer(vllm_url: str, tmp_path: Path) -> None:
    port, analyzer_port = vl.free_port(), vl.free_port()
    config = tmp_path / "policy.yaml"
    config.write_text("scheduler:\n  policy: gmax\n")
    out = (tmp_path / "up.out").open("wb")
    up = vl.start_process(
        [
            sys.executable,
            "-m",
            "jitserve.cli",
            "up",
            "--backend",
            vllm_url,
            "--port",
            str(port),
            "--analyzer-port",
            str(analyzer_port),
            "--config",
            str(config),
            "--log-dir",
            str(tmp_path / "logs"),
            "--timeout",
            "600",
        ],
        out,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600  # against a hang: a busy machine starts slowly
        while "jitserve is up" not in (tmp_path / "up.out").read_text():
            assert up.poll() is None, (tmp_path / "up.out").read_text()
            assert time.monotonic() < deadline, (tmp_path / "up.out").read_text()
            time.sleep(0.2)
        printed = (tmp_path / "up.out").read_text()
        assert f"jitserve is up: {url}" in printed and "curl -N" in printed
        children = [
            int(line.split("pid ")[1].split(",")[0])
            for line in printed.splitlines()
            if ", log " in line
        ]
        assert len(children) == 2  # analyzer, sidecar (vLLM is the given backend)

        with AnalyzerClient(f"127.0.0.1:{analyzer_port}", timeout_s=5) as client:
            while not ((stats := client.stats()) and stats.ready):
                assert time.monotonic() < deadline, "the analyzer never became ready"
                time.sleep(0.5)
            observed_before = stats.observed_total
            send_failures = "jitserve_analyzer_client_send_failures_total"
            failed_before = metric_total(get_text(url + "/metrics"), send_failures,
                                         call="observe")

            def landed(sent: int) -> tuple[int, float] | None:
                """(observed, failed) once every sent completion's observation has either
                reached the analyzer or been counted as a failed send: the sidecar's client
                gives a send 0.1 s, and one late on a busy machine opens its breaker for a
                second, so a completion may legitimately not arrive."""
                now = client.stats()
                failed = metric_total(get_text(url + "/metrics"), send_failures,
                                      call="observe") - failed_before
                if now is None:
                    return None
                observed = now.observed_total - observed_before
                return (observed, failed) if observed + failed >= sent else None

            # The subject is the wiring: streams (a bounded number) until the analyzer has
            # received three of their completions from the sidecar.
            sent, observed = 0, 0
            while observed < 3:
                assert sent < 30, f"{sent} streams sent, the analyzer observed {observed}"
                n = (8, 12, 16)[sent % 3]
                result = stream(
                    url,
                    {
                        "prompt": "hello world",
                        "max_tokens": n,
                        "ignore_eos": True,
                        "slo": {"kind": "deadline", "deadline_s": 30},
                    },
                )
                assert result.status == 200 and len(result.token_ids) == n
                sent += 1
                observed, _ = wait_until("the completion observed or its send counted failed",
                                         lambda s=sent: landed(s), 120)
        assert get_json(url + "/ready")[0] == 200
        text = get_text(url + "/metrics")
        # The sidecar has an analyzer client: no bound came from the local estimator for
        # want of one (a slow analyzer call falls back inside the client, counted apart).
        assert metric(text, "jitserve_analyzer_fallbacks_total") == 0
    finally:
        up.send_signal(signal.SIGTERM)
        code = up.wait(60)
        out.close()
    assert code == 0, (tmp_path / "up.out").read_text()
    assert "stopping sidecar" in (tmp_path / "up.out").read_text()
    wait_until("up's children to exit", lambda: not [pid for pid in children if alive(pid)], 60)
