"""The serving pod the operator makes is the stack ``jitserve up`` measures (real API server).

- the sidecar's B (``--max-running``) is vLLM's ``--max-num-seqs``, by default and when the
  policy sets vLLM's args; the NetworkPolicy is created; the Service and Ingress route only
  the API port;
- with tenant keys on, a real ``jitserve sidecar serve`` started with the Deployment's own
  sidecar arguments (only the kubelet's paths, the loopback host and the backend replaced:
  no kubelet runs here) serves the tenants; the operator scrapes its admin port and the
  ATTAINMENT column (the API server's own table) fills; the admin port's /metrics has the
  goodput series, while the API port (the one the Service routes) answers 404 for /metrics
  and /debug/scheduler.
"""

from __future__ import annotations

import base64
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from jitserve.devstack import vllm as vl
from jitserve.operator import builders as b
from jitserve.operator import constants as c
from jitserve.operator.crd import crd_object
from jitserve.operator.kube import RestKube
from tests.support.http import MODEL, metric_total
from tests.support.kube_fake import serving
from tests.support.operator_session import (
    SESSION_NAMESPACES,
    OperatorProcess,
    mark_pods_running,
    wait_for,
)
from tests.support.waiting import wait_until

NS = SESSION_NAMESPACES[4]  # the session operator's "metrics" namespace


def _policy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND,
        "metadata": {"name": name, "namespace": NS},
        "spec": serving(spec),
    }


def _flag(args: list[str], flag: str) -> str:
    values = [a.split("=", 1)[1] for a in args if a.startswith(flag + "=")]
    return values[-1] if values else args[args.index(flag) + 1]


def _containers(admin: RestKube, name: str) -> dict[str, dict[str, Any]]:
    deployment = wait_for(
        f"the Deployment {name}", lambda: admin.get("apps/v1", "Deployment", NS, name), 60
    )
    return {ct["name"]: ct for ct in deployment["spec"]["template"]["spec"]["containers"]}


def test_sidecar_b_is_vllms_and_only_the_api_port_is_routed(
    admin: RestKube, session_operator: OperatorProcess
) -> None:
    cases = {
        "shape-default": ({}, "256"),
        "shape-args": ({"model": {"args": ["--max-num-seqs", "48", "--dtype", "half"]}}, "48"),
    }
    for name, (spec, _) in cases.items():
        admin.create(_policy(name, {**spec, "ingress": {"host": f"{name}.example.com"}}))
    for name, (_, slots) in cases.items():
        containers = _containers(admin, name)
        vllm_b = _flag(containers["vllm"]["args"], "--max-num-seqs")
        sidecar_args = containers["sidecar"]["args"]
        assert vllm_b == _flag(sidecar_args, "--max-running") == slots, name
        assert _flag(sidecar_args, "--engine-queue") == str(int(slots) // 2)
        assert containers["vllm"]["args"].count("--max-num-seqs") == 1
        admin_port = _flag(sidecar_args, "--admin-port")
        ports = {p["name"]: p["containerPort"] for p in containers["sidecar"]["ports"]}
        assert ports[c.ADMIN_PORT_NAME] == int(admin_port) != ports["http"]

        service = wait_for("the Service", lambda n=name: admin.get("v1", "Service", NS, n), 60)
        assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
        ingress = wait_for(
            "the Ingress",
            lambda n=name: admin.get("networking.k8s.io/v1", "Ingress", NS, n),
            60,
        )
        backends = [p["backend"] for r in ingress["spec"]["rules"] for p in r["http"]["paths"]]
        assert backends == [{"service": {"name": name, "port": {"name": "http"}}}]

        network = wait_for(
            "the NetworkPolicy",
            lambda n=name: admin.get("networking.k8s.io/v1", "NetworkPolicy", NS, n),
            60,
        )
        assert network["spec"]["podSelector"]["matchLabels"] == b.selector_labels(name)
        assert network["spec"]["policyTypes"] == ["Ingress"]
        clients, placers, watchers = network["spec"]["ingress"]
        assert clients == {"ports": [{"protocol": "TCP", "port": "http"}]}
        assert placers["ports"] == [{"protocol": "TCP", "port": c.ADMIN_PORT_NAME}]
        assert {p["port"] for p in watchers["ports"]} == {c.ADMIN_PORT_NAME, "vllm"}
        assert watchers["from"][0]["namespaceSelector"]["matchLabels"] == {
            c.NAMESPACE_NAME_LABEL: "monitoring"
        }
        owners = network["metadata"]["ownerReferences"]
        assert [o["name"] for o in owners] == [name] and owners[0]["controller"] is True

    # A deleted NetworkPolicy is a child's drift: the operator puts it back at once.
    name = "shape-default"
    uid = admin.get("networking.k8s.io/v1", "NetworkPolicy", NS, name)["metadata"]["uid"]
    admin.delete("networking.k8s.io/v1", "NetworkPolicy", NS, name)
    back = wait_for(
        "the NetworkPolicy back",
        lambda: (lambda o: o if o and o["metadata"]["uid"] != uid else None)(
            admin.get("networking.k8s.io/v1", "NetworkPolicy", NS, name)
        ),
        30,
    )
    assert back["spec"]["ingress"][0] == {"ports": [{"protocol": "TCP", "port": "http"}]}


def test_the_1_20_api_server_stores_the_cel_crd_without_its_rules(admin: RestKube) -> None:
    """The session installed the chart's CRD (with CEL rules) through the API: 1.20 takes
    it and drops the field it does not know (its kubectl would refuse it: crds/no-cel/)."""
    stored = admin.request(
        "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{c.CRD_NAME}"
    )
    version = admin.request("GET", "/version") or {}
    assert "x-kubernetes-validations" in json.dumps(crd_object())
    if (int(version["major"]), int(version["minor"].rstrip("+"))) < (1, 25):
        assert stored is not None and "x-kubernetes-validations" not in json.dumps(stored)


def _table_cell(admin: RestKube, name: str, column: str) -> Any:
    """A printer column's cell as the API server renders ``kubectl get`` (its Table)."""
    table = admin.request(
        "GET",
        f"/apis/{c.API_VERSION}/namespaces/{NS}/{c.PLURAL}/{name}",
        accept="application/json;as=Table;v=v1;g=meta.k8s.io",
    )
    assert table is not None
    names = [col["name"] for col in table["columnDefinitions"]]
    return table["rows"][0]["cells"][names.index(column)]


def _call(url: str, key: str | None, body: dict[str, Any] | None = None) -> tuple[int, str]:
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read().decode()


def _local_sidecar_command(
    args: list[str], config: Path, keys_dir: Path, backend: str
) -> list[str]:
    """The pod's sidecar arguments with what the kubelet and the pod network provide here
    replaced: the mounted paths, the loopback host, vLLM's address; the analyzer (none runs
    here) dropped. Ports, B, the engine queue and the admin port stay as the pod has them."""
    replace = {
        "--config": str(config),
        "--keys-dir": str(keys_dir),
        "--host": "127.0.0.1",
        "--backend": backend,
    }
    out: list[str] = []
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg == "--analyzer":
            skip = True
            continue
        if i > 0 and args[i - 1] in replace:
            out.append(replace[args[i - 1]])
            continue
        out.append(arg)
    return [sys.executable, "-m", "jitserve.cli", *out]


def test_with_tenant_keys_the_attainment_column_fills_from_the_admin_port(
    admin: RestKube, session_operator: OperatorProcess, vllm_url: str, tmp_path: Path
) -> None:
    name = "keys"
    keys = {"alpha": "alpha-key-0123456789", "beta": "beta-key-0123456789"}
    for tenant, key in keys.items():
        admin.create(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": f"{tenant}-key", "namespace": NS},
                "data": {"api-key": base64.b64encode(key.encode()).decode()},
            }
        )
    port, admin_port = vl.free_port(), vl.free_port()
    spec = {
        "model": {"name": MODEL, "args": ["--max-num-seqs", "8"]},  # the session vLLM's B
        "sidecar": {"port": port, "adminPort": admin_port},
        "fairness": {
            "tenants": [{"name": t, "apiKeySecret": f"{t}-key"} for t in keys],
        },
        "admission": {"maxWaitingSeconds": 120},
        "reporting": {"attainmentWindowSeconds": 120},  # both requests stay in the window
        # auto through the operator; a margin no candidate beats: gmax runs throughout
        "scheduler": {"policy": "auto", "auto": {"candidates": ["gmax", "edf-ac"],
                                                 "margin": 10, "profile": "cpu-tiny-llama"}},
    }
    admin.create(_policy(name, spec))
    sidecar_args = _containers(admin, name)["sidecar"]["args"]
    assert _flag(sidecar_args, "--max-running") == "8"

    # Play the kubelet: the ConfigMap and the operator's key Secret become files.
    config_map = wait_for(
        "the ConfigMap", lambda: admin.get("v1", "ConfigMap", NS, b.config_map_name(name)), 60
    )
    config = tmp_path / "policy.yaml"
    config.write_text(config_map["data"][c.CONFIG_KEY])

    def copied() -> dict[str, str] | None:
        secret = admin.get("v1", "Secret", NS, b.api_keys_secret_name(name)) or {}
        data: dict[str, str] = secret.get("data") or {}
        return data if len(data) == len(keys) else None

    keys_dir = tmp_path / "keys"
    keys_dir.mkdir()
    for secret_name, value in wait_for("the tenants' keys", copied, 60).items():
        (keys_dir / secret_name).write_bytes(base64.b64decode(value))

    log_path = tmp_path / "sidecar.log"
    with log_path.open("ab") as log:
        proc = vl.start_process(
            _local_sidecar_command(sidecar_args, config, keys_dir, vllm_url), log
        )
    api, admin_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}"
    try:
        assert vl.wait_http_ok(admin_url + "/ready", 60, proc), vl.tail(log_path)
        wait_for("the serving pod", lambda: admin.list("v1", "Pod", NS, b.selector_string(name)))
        assert mark_pods_running(admin, NS, name) == 1

        def status() -> dict[str, Any]:
            body = admin.get(c.API_VERSION, c.KIND, NS, name) or {}
            found: dict[str, Any] = body.get("status") or {}
            return found

        wait_for("the first scrape (the window's baseline)",
                 lambda: status().get("scrapedPods") == 1, timeout_s=60)
        assert _table_cell(admin, name, "Attainment") is None  # nothing finished yet

        body = {"model": MODEL, "prompt": [1, 2, 3, 4], "max_tokens": 8,
                "slo": {"kind": "deadline", "deadline_s": 60}}
        assert _call(api + "/v1/completions", None, body)[0] == 401  # keys are on
        tokens: dict[str, int] = {}
        for tenant in keys:
            code, text = _call(api + "/v1/completions", keys[tenant], body)
            assert code == 200, text
            usage = json.loads(text)["usage"]
            # A met deadline request's goodput is its prompt and its output (goodput.py).
            tokens[tenant] = int(usage["prompt_tokens"]) + int(usage["completion_tokens"])

        def shown() -> Any:
            # What `kubectl get slop` prints, once a scrape after both requests is in (read
            # in the same wait: a failed scrape later empties the status's figures).
            if status().get("recentRequests") != 2:
                return None
            cell = _table_cell(admin, name, "Attainment")
            return None if cell is None else (cell,)

        (cell,) = wait_until("a scrape after both requests, in the table", shown, timeout_s=60)
        assert float(cell) == 1.0
        assert _table_cell(admin, name, "Scheduler") == "gmax"  # -o wide: what runs
        assert status()["policyInEffectSince"].endswith("Z")

        code, text = _call(admin_url + "/metrics", None)
        assert code == 200
        assert "jitserve_goodput_tokens_total" in text
        for tenant, counted in tokens.items():  # both met their 60 s deadline
            assert metric_total(text, "jitserve_goodput_tokens_total", tenant=tenant) == counted
        # The port the Service routes: no metrics, no scheduler dump, key or not.
        for path in ("/metrics", "/debug/scheduler"):
            assert _call(api + path, None)[0] == 404, path
            assert _call(api + path, keys["alpha"])[0] == 404, path
    finally:
        vl.stop_process(proc)
