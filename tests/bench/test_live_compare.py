"""The live A/B against the bare engine and the vLLM utility routes (real CPU vLLM).

- ``jitserve bench --live SIDECAR --live-bare VLLM`` runs both targets alternately and
  writes one table; the SLO reaches the sidecar (as headers here) and never the bare vLLM;
  both are scored with :mod:`jitserve.goodput` against the same SLOs. Numbers are not
  asserted (a benchmark, on a shared machine): only that every run happened and counted.
- ``/tokenize``, ``/detokenize``, ``/version`` answer through the sidecar exactly as vLLM
  does (what vLLM's serving benchmark calls), and 503 + ``Retry-After`` when vLLM is
  unreachable.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from jitserve.bench.compare import markdown, summarize, uniform_workload
from jitserve.bench.live import slo_headers
from jitserve.cli import main
from jitserve.devstack import vllm as vl
from tests.support.http import get_json, post
from tests.support.ports import DeadPort
from tests.support.sidecar import SidecarProcess
from tests.support.waiting import body_timeout

pytestmark = body_timeout(300)


@pytest.fixture
def sidecar(vllm_url: str, tmp_path: Path) -> Iterator[SidecarProcess]:
    config = tmp_path / "policy.yaml"
    config.write_text(yaml.safe_dump({}))
    s = SidecarProcess(vllm_url, config=config, max_running=16, engine_queue=8)
    try:
        s.wait_ready()
        yield s
    finally:
        s.close()


def test_live_compare_runs_both_targets_alternately(
    sidecar: SidecarProcess, vllm_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cmp"
    code = main(["bench", "--live", sidecar.url, "--live-bare", vllm_url, "--live-workload",
                 "uniform", "--live-prompt", "16", "--live-output", "8", "--rate", "3",
                 "--duration", "2", "--live-rounds", "2", "--live-slo", "headers",
                 "--out", str(out)])
    assert code == 0
    doc = json.loads((out / "live_compare.json").read_text())
    runs = doc["runs"]
    assert [(r["round"], r["target"]) for r in runs] == [
        (1, "jitserve"), (1, "vllm"), (2, "jitserve"), (2, "vllm")]
    assert [r["slo_via"] for r in runs] == ["headers", "none", "headers", "none"]
    requests = len(uniform_workload(2, 3, 1))
    for r in runs:
        assert r["requests"] == requests  # every work item scored, whatever the target
        # the bare vLLM serves all; the sidecar serves all or, on a machine too busy for
        # a request's TTFT, retires it with 429 + Retry-After (its overload control judges
        # the speed it measures, which no test can promise)
        allowed = {"200"} if r["target"] == "vllm" else {"200", "429"}
        assert set(r["status_counts"]) <= allowed, r["status_counts"]
        assert sum(r["status_counts"].values()) == requests
        assert r["refused_without_retry_after"] == 0
        assert r["refused_without_retry_after"] == 0
        assert set(r["attainment"]) == {"latency", "overall"}
    # the sidecar's /debug/scheduler figures come with its rows only (None: no slot was
    # freed while work waited, at this light load)
    assert all("dispatch_gap_ms" in r for r in runs) and runs[1]["dispatch_gap_ms"] is None
    assert set(doc["summary"]["ratios"]) >= {"request_goodput", "output_tokens_per_s"}
    table = (out / "live_compare.md").read_text()
    assert table.count("| jitserve |") == 2 and table.count("| vllm |") == 2
    assert "jitserve / bare vLLM" in capsys.readouterr().out


def test_live_compare_refuses_bad_targets(vllm_url: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "--live", vllm_url, "--live-bare", vllm_url, "--rate", "1", "--duration",
            "1", "--out", str(tmp_path)]
    assert main(args) == 2
    assert "name the same URL" in capsys.readouterr().err
    with DeadPort() as dead:
        assert main(["bench", "--live", dead.url, "--live-bare", vllm_url, "--rate", "1",
                     "--duration", "1", "--out", str(tmp_path)]) == 2
    assert "does not answer GET /v1/models" in capsys.readouterr().err


def test_slo_headers_and_table_without_a_bare_run() -> None:
    assert slo_headers({"kind": "latency", "ttft_ms": 2000.0, "tbt_ms": 100.0}) == {
        "x-llm-d-slo-ttft-ms": "2000", "x-llm-d-slo-tpot-ms": "100"}
    assert slo_headers({"kind": "deadline", "deadline_s": 20.0}) == {
        "x-llm-d-slo-deadline-ms": "20000"}
    compound = {"kind": "compound", "deadline_s": 40.0, "program_id": "p", "stage": 1}
    assert slo_headers(compound, deadline_left_s=12.5) == {"x-llm-d-slo-deadline-ms": "12500"}
    assert slo_headers({"kind": "best_effort"}) == {}
    assert summarize([])["ratios"] == {}
    assert markdown([]).startswith("| run | target |")


def test_vllm_utility_routes_answer_like_vllm(sidecar: SidecarProcess, vllm_url: str) -> None:
    body = {"model": "tiny-llama", "prompt": "hello world", "add_special_tokens": False}
    direct = post(vllm_url + "/tokenize", body)
    through = post(sidecar.url + "/tokenize", body)
    assert through[0] == direct[0] == 200 and through[2] == direct[2]
    tokens = direct[2]["tokens"]
    assert post(sidecar.url + "/detokenize", {"model": "tiny-llama", "tokens": tokens})[2] == \
        post(vllm_url + "/detokenize", {"model": "tiny-llama", "tokens": tokens})[2]
    assert get_json(sidecar.url + "/version") == get_json(vllm_url + "/version")
    # vLLM's own 404 for an unknown model comes back as it is
    status, _, doc = post(sidecar.url + "/tokenize", {**body, "model": "nope"})
    assert status == post(vllm_url + "/tokenize", {**body, "model": "nope"})[0] == 404
    assert "error" in doc


def test_vllm_utility_routes_without_backend_are_503_with_retry_after(tmp_path: Path) -> None:
    config = tmp_path / "policy.yaml"
    config.write_text("{}")
    dead = DeadPort()  # held: nothing answers there, and nobody can take it
    s = SidecarProcess(dead.url, config=config)
    try:
        assert vl.wait_http_ok(s.url + "/health", 60, s.proc)
        status, headers, doc = post(s.url + "/tokenize", {"model": "m", "prompt": "x"})
        assert status == 503 and int(headers["Retry-After"]) >= 1
        assert doc["error"]["code"] == "backend_unavailable"
    finally:
        s.close()
        dead.close()
