"""What an SRE types, with Kubernetes' own kubectl 1.20.2 (built by scripts/setup-k8s.sh from
Debian's source, like the API server): the README's commands verbatim, `kubectl explain`
on every field, the webhook refusing a cross-field violation, and the windowed attainment
in `kubectl get slopolicies` moving after `kubectl patch` of p.

The operator is the session's `jitserve operator` (chart RBAC, its webhook registered by
the chart's ValidatingWebhookConfiguration). No kubelet runs: the test marks the serving pod
Running at 127.0.0.1 and copies the ConfigMap into the sidecar's config file, as a kubelet
would; the sidecar and vLLM behind it are real processes.
"""

from __future__ import annotations

import concurrent.futures
import re
import shlex
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from jitserve.operator import builders as b
from jitserve.operator import constants as c
from jitserve.operator.cli import api_server_has_cel
from jitserve.operator.crd import crd_object
from jitserve.operator.kube import RestKube
from tests.support.http import MODEL, complete
from tests.support.operator_session import (
    MEASURED,
    SESSION_NAMESPACES,
    Kubectl,
    SessionOperator,
    mark_pods_running,
    wait_for,
)
from tests.support.sidecar import SidecarProcess
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
NS_KUBECTL, NS_WINDOW = SESSION_NAMESPACES[6], SESSION_NAMESPACES[7]
MET = {"kind": "deadline", "deadline_s": 60}
MISS = {"kind": "latency", "ttft_ms": 1, "tbt_ms": 1}  # no first token within 1 ms


def readme_commands() -> list[str]:
    """The README's kubectl block (every line a kubectl command)."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    for block in blocks:
        lines = [line for line in block.splitlines() if line.strip()]
        if lines and all(line.startswith("kubectl ") for line in lines):
            return lines
    raise AssertionError("README.md has no block of kubectl commands")


def table(output: str) -> list[dict[str, str]]:
    """`kubectl get` output as rows keyed by column name (columns are aligned; an empty
    cell is blank, so cells are cut at the header's column starts)."""
    header, *rows = output.rstrip().splitlines()
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    names = header.split()
    bounds = [*starts[1:], None]
    return [
        {n: row[a:z].strip() for n, a, z in zip(names, starts, bounds, strict=True)} for row in rows
    ]


def test_docs_show_the_same_commands() -> None:
    docs = (ROOT / "docs" / "operator.md").read_text()
    for line in readme_commands():
        assert line in docs, f"docs/operator.md lacks: {line}"


def test_readme_commands_verbatim(
    admin: RestKube, session_operator: SessionOperator, webhook: dict[str, Any], kubectl: Kubectl
) -> None:
    example = yaml.safe_load((ROOT / "manifests" / "examples" / "chat.yaml").read_text())
    name = example["metadata"]["name"]
    patched = False
    cel = api_server_has_cel(admin)
    for line in readme_commands():
        args = [a.replace("team-a", NS_KUBECTL) for a in shlex.split(line, comments=True)[1:]]
        if args == ["apply", "-f", "crds/"] and not cel:
            # What the README's comment says for an API server without CEL (this 1.20):
            # its kubectl refuses a CRD with x-kubernetes-validations ("unknown field").
            assert "crds/no-cel/" in line
            args = ["apply", "-f", "crds/no-cel/"]
        result = kubectl(*args)
        said = result.stdout + result.stderr
        verb = args[0]
        if verb == "apply" and any("invalid/" in a for a in args):
            # Refused by the webhook, the field named; nothing stored.
            assert result.returncode != 0, said
            assert 'admission webhook "validate.slopolicies.jitserve.io" denied' in said, said
            assert "spec.ingress.tlsSecret: TLS needs ingress.host" in said, said
            assert admin.get(c.API_VERSION, c.KIND, NS_KUBECTL, "tls-without-host") is None
            continue
        assert result.returncode == 0, f"{line}\n{said}"
        if verb == "apply" and any(a.startswith("crds/") for a in args):
            assert f"customresourcedefinition.apiextensions.k8s.io/{c.CRD_NAME}" in said
        elif verb == "apply":
            assert f"slopolicy.jitserve.io/{name} created" in said
            wait_for(
                "the example's Deployment",
                lambda: admin.get("apps/v1", "Deployment", NS_KUBECTL, name),
                timeout_s=180,
            )
        elif verb == "explain":
            assert "DESCRIPTION:" in said and "<empty>" not in said
            for field in ("weight", "tenants", "windowSeconds"):
                assert re.search(rf"^   {field}\t<", said, re.M), said
            assert "f: 0 = pure goodput, 1 = pure fair share." in said
        elif verb == "get":
            (row,) = table(result.stdout)
            assert row["NAME"] == name
            assert float(row["P"]) == (
                0.8 if patched else example["spec"]["scheduler"]["cutoff"]["value"]
            )
            assert float(row["REPLICAS"]) == example["spec"]["replicas"]
            wide = "-o" in args and "wide" in args
            columns = set(result.stdout.splitlines()[0].split())
            assert {"READY", "AVAILABLE", "F", "ATTAINMENT", "AGE"} <= columns
            assert ({"EFFECTIVE-P", "LIFETIME", "GOODPUT"} <= columns) == wide
            if patched:
                assert float(row["F"]) == 0.3
        elif verb == "patch":
            assert f"slopolicy.jitserve.io/{name} patched" in said
            patched = True

            def tuned() -> bool:
                cm = admin.get("v1", "ConfigMap", NS_KUBECTL, b.config_map_name(name)) or {}
                spec = yaml.safe_load((cm.get("data") or {}).get(c.CONFIG_KEY, "{}"))
                return bool(
                    spec["scheduler"]["cutoff"]["value"] == 0.8
                    and spec["fairness"]["weight"] == 0.3
                )

            wait_for("p=0.8 and f=0.3 in the sidecar's ConfigMap", tuned)
        elif verb == "describe":  # the operator's Events on the policy, as users read them
            assert "Events:" in said and "jitserve-operator" in said, said
            assert re.search(r"Normal\s+\w+\s+.*jitserve-operator\s+(Ready|Progressing|"
                             r"Degraded)=", said), said
        elif verb == "delete":
            assert f'slopolicy.jitserve.io "{name}" deleted' in said
            wait_for(
                "the children garbage-collected",
                lambda: admin.get("apps/v1", "Deployment", NS_KUBECTL, name) is None,
                timeout_s=180,
            )
        else:
            raise AssertionError(f"no expectation for: {line}")
    assert patched


def _object_paths(node: dict[str, Any], path: str) -> Any:
    """Paths of every object in the schema that has fields (list items included). A
    free-form object (x-kubernetes-preserve-unknown-fields, e.g. pod.volumes[]) is
    published without its fields: kubectl shows its own description only."""
    if node.get("type") == "array" and isinstance(node.get("items"), dict):
        yield from _object_paths(node["items"], path)
        return
    if node.get("properties") and not node.get("x-kubernetes-preserve-unknown-fields"):
        yield path
        for name, sub in node["properties"].items():
            yield from _object_paths(sub, f"{path}.{name}")


def test_kubectl_explain_describes_every_field(admin: RestKube, kubectl: Kubectl) -> None:
    root = crd_object()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    paths = [p for p in _object_paths(root, "slopolicy") if not p.startswith("slopolicy.metadata")]
    # The API server publishes a new CRD's OpenAPI a moment after it is established.
    wait_for(
        "the CRD in the published OpenAPI",
        lambda: kubectl("explain", "slopolicy.spec.pod").returncode == 0,
        timeout_s=180,
    )
    start = time.monotonic()
    checked = 0
    for path in paths:
        result = kubectl("explain", path)
        assert result.returncode == 0, f"{path}: {result.stderr}"
        text = result.stdout
        assert "<empty>" not in text, f"kubectl explain {path}:\n{text}"
        assert "FIELDS:" in text, f"kubectl explain {path}:\n{text}"
        fields = text.split("FIELDS:", 1)[1]
        entries = re.findall(
            r"^   (\S+)\t<([^>]*)>(?: -required-)?\n((?:     .*\n)*)", fields, re.M
        )
        assert entries, f"kubectl explain {path}: no fields parsed:\n{text}"
        # (A free-form object such as pod.affinity is published without a type: "<>".)
        for field, _kind, description in entries:
            assert description.strip(), f"{path}.{field} has no description"
        checked += len(entries)
    MEASURED["kubectl_explain_fields_described"] = float(checked)
    MEASURED["kubectl_explain_all_s"] = time.monotonic() - start
    assert checked >= 140


def test_windowed_attainment_follows_a_patch_of_p(
    admin: RestKube,
    session_operator: SessionOperator,
    webhook: dict[str, Any],
    vllm_url: str,
    kubectl: Kubectl,
    tmp_path: Path,
) -> None:
    """24 requests meet their SLO, and more keep meeting it until ATTAINMENT shows 1;
    `kubectl patch` sets p = 0.5 (the sidecar reloads it: EFFECTIVE-P); from then on
    requests miss (an impossible 1 ms TTFT, two a second, induced by the test, not by p).
    Within the 10 s window ATTAINMENT shows only the post-patch requests (0), while
    LIFETIME still counts the met ones (met / (met + misses))."""
    name, window = "window", 10
    config = tmp_path / "policy.yaml"
    config.write_text("{}\n")
    sidecar = SidecarProcess(vllm_url, config=config, max_running=2, engine_queue=None,
                             admin_port=True).wait_ready()
    ports = (sidecar.port, sidecar.admin_port)
    try:
        spec = {
            "sidecar": {"port": sidecar.port, "adminPort": sidecar.admin_port},
            "model": {"name": MODEL, "port": 8000 if 8000 not in ports else 8001},
            "replicas": 1,
            "scheduler": {"cutoff": {"mode": "fixed", "value": 0.9}},
            "admission": {"maxWaitingSeconds": 120},
            "reporting": {"attainmentWindowSeconds": window},
        }
        doc = {
            "apiVersion": c.API_VERSION,
            "kind": c.KIND,
            "metadata": {"name": name},
            "spec": spec,
        }
        applied = kubectl("apply", "-n", NS_WINDOW, "-f", "-", stdin=yaml.safe_dump(doc))
        assert applied.returncode == 0, applied.stderr

        def kubelet_config() -> bool:
            """Play the kubelet: the ConfigMap's file becomes the sidecar's config."""
            cm = admin.get("v1", "ConfigMap", NS_WINDOW, b.config_map_name(name))
            if cm is None:
                return False
            text = cm["data"][c.CONFIG_KEY]
            if config.read_text() != text:
                sidecar.write_config(text)
            return True

        wait_for("the ConfigMap", kubelet_config, timeout_s=180)
        wait_for(
            "the serving pod",
            lambda: admin.list("v1", "Pod", NS_WINDOW, b.selector_string(name)),
            timeout_s=180,
        )
        assert mark_pods_running(admin, NS_WINDOW, name) == 1

        def get(*extra: str) -> dict[str, str]:
            result = kubectl("get", "slopolicies", name, "-n", NS_WINDOW, *extra)
            assert result.returncode == 0, result.stderr
            (row,) = table(result.stdout)
            return row

        def status() -> dict[str, Any]:
            body = admin.get(c.API_VERSION, c.KIND, NS_WINDOW, name) or {}
            found: dict[str, Any] = body.get("status") or {}
            return found

        # The operator reads the sidecar before any request (the window's baseline).
        wait_for("the first scrape", lambda: status().get("scrapedPods") == 1, timeout_s=180)
        met: list[int] = []
        met_enough = threading.Event()

        def keep_meeting() -> None:
            # The window forgets a request `window` s after it: requests keep coming until
            # the row is read, so a late scrape or a slow kubectl still finds them there.
            with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
                met.extend(pool.map(lambda _: complete(sidecar.url, MET), range(24)))
            while not met_enough.wait(0.5):
                met.append(complete(sidecar.url, MET))

        meeting = threading.Thread(target=keep_meeting, daemon=True)
        meeting.start()
        try:
            row = wait_until(
                "ATTAINMENT 1 over the met requests",
                lambda: (lambda r: r if r["ATTAINMENT"] == "1" else None)(get("-o", "wide")),
                timeout_s=120,
            )
        finally:
            met_enough.set()
            meeting.join(timeout=120)
        assert len(met) >= 24 and set(met) == {200}
        assert row["LIFETIME"] == "1" and float(row["EFFECTIVE-P"]) == 0.9
        # one tenant got all the goodput it asked for: its max-min share, Jain's index 1
        assert row["JAIN"] == "1"

        patch = '{"spec":{"scheduler":{"cutoff":{"value":0.5}}}}'
        result = kubectl("patch", "slop", name, "-n", NS_WINDOW, "--type", "merge", "-p", patch)
        assert result.returncode == 0, result.stderr
        patched_at = time.monotonic()
        wait_for(
            "p=0.5 in the sidecar's file",
            lambda: kubelet_config() and "value: 0.5" in config.read_text(),
            timeout_s=120,
        )
        wait_until(
            "EFFECTIVE-P 0.5 (the sidecar reloaded, the operator scraped it)",
            lambda: get("-o", "wide")["EFFECTIVE-P"] == "0.5",
            timeout_s=120,
        )
        misses: list[int] = []
        stop = threading.Event()

        def keep_missing() -> None:
            while not stop.wait(0.5):
                misses.append(complete(sidecar.url, MISS))

        thread = threading.Thread(target=keep_missing, daemon=True)
        thread.start()
        try:

            def only_misses() -> tuple[dict[str, str], dict[str, Any]] | None:
                # The row and the status it is printed from, both showing it (a failed
                # scrape in between empties the status's figures).
                shown, found = get("-o", "wide"), status()
                recent = (found.get("recentAttainment") or {}).get("overall")
                return (shown, found) if shown["ATTAINMENT"] == "0" and recent == 0 else None

            row, seen = wait_until(
                "ATTAINMENT 0: the window holds only post-patch requests",
                only_misses,
                timeout_s=window + 240,
            )
            reflected = time.monotonic()
        finally:
            stop.set()
            thread.join(timeout=60)
        assert 0 < float(row["LIFETIME"]) < 1
        assert seen["recentAttainment"] == {"latency": 0.0, "overall": 0.0}
        assert seen["recentRequests"] >= 1
        # the baseline is the first scrape at least a window old (scrapes are seconds apart)
        assert window <= seen["recentWindowSeconds"] < window + 120
        # Lifetime: all 24 met and every miss, once the last scrape is in.
        # served late (200) or retired by the overload layer as unreachable (429): both
        # count as missed, so LIFETIME counts every one of them
        assert misses and set(misses) <= {200, 429}
        lifetime = round(len(met) / (len(met) + len(misses)), 4)
        wait_until(
            f"LIFETIME {lifetime}",
            lambda: float(get("-o", "wide")["LIFETIME"] or "nan") == lifetime,
            timeout_s=120,
        )
        MEASURED["window_reflects_after_patch_s"] = reflected - patched_at
    finally:
        sidecar.close()


def test_operator_metrics_count_reconciles_and_webhook_answers(
    admin: RestKube, session_operator: SessionOperator, webhook: dict[str, Any], kubectl: Kubectl
) -> None:
    """The operator's own /metrics (what the chart's ServiceMonitor scrapes)."""
    from tests.support.http import metric_total

    url = f"http://127.0.0.1:{session_operator.metrics_port}/metrics"
    refused = kubectl(
        "apply", "-n", NS_KUBECTL, "-f", "manifests/examples/invalid/tls-without-host.yaml"
    )
    assert refused.returncode != 0
    name = "metered-op"
    doc = {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND,
        "metadata": {"name": name},
        "spec": {"model": {"name": MODEL}},
    }
    assert kubectl("apply", "-n", NS_KUBECTL, "-f", "-", stdin=yaml.safe_dump(doc)).returncode == 0

    def text() -> str:
        with urllib.request.urlopen(url, timeout=10) as resp:
            body: str = resp.read().decode()
            return body

    def seen() -> str | None:
        body = text()
        labels = {"namespace": NS_KUBECTL, "policy": name}
        ready = (
            "jitserve_operator_policy_ready" in body
            and metric_total(body, "jitserve_operator_policy_degraded", **labels) == 0
            and f'policy="{name}"' in body
        )
        return body if ready else None

    body = wait_until("the new policy in the operator's metrics", seen, timeout_s=120)
    assert metric_total(body, "jitserve_operator_admission_reviews_total", result="denied") >= 1
    assert metric_total(body, "jitserve_operator_admission_reviews_total", result="allowed") >= 1
    assert metric_total(body, "jitserve_operator_reconciles_total", result="ok") >= 1
    assert metric_total(body, "jitserve_operator_writes_total", kind="Deployment") >= 1
    assert metric_total(body, "jitserve_operator_reconcile_seconds_count") >= 1
    assert kubectl("delete", "slopolicy", name, "-n", NS_KUBECTL).returncode == 0
