"""Session fixtures and helpers for the tests against a real API server (see k8s_cluster.py).

- ``admin``: a client with cluster-admin rights (installs the CRD, creates namespaces,
  plays the kubelet where pods must look running);
- ``operator_kubeconfig``: credentials of the chart's operator ServiceAccount, bound by
  the chart's own namespaced RBAC (a Role and RoleBinding in each test namespace, as
  ``helm template --set watchNamespaces=...`` renders them), so every operator test also
  proves the chart's least-privilege rules are enough;
- ``session_operator``: one ``jitserve operator`` process (the real CLI) watching the
  session's test namespaces, with its validating webhook (HTTPS, a self-signed
  certificate made with openssl) and its metrics endpoint;
- ``webhook``: the chart's ValidatingWebhookConfiguration pointed at that operator
  (``webhook.url``), for the namespaces labelled ``WEBHOOK_LABEL``;
- ``kubectl``: Kubernetes' own kubectl (built with the API server by
  scripts/setup-k8s.sh) against that cluster, as an admin.
"""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from jitserve.devstack import vllm as vl
from jitserve.operator import constants as c
from jitserve.operator.kube import KubeError, RestKube
from tests.support.k8s import cluster_kubeconfig, k8s_bin_dir, write_kubeconfig
from tests.support.waiting import PROCESS_START_TIMEOUT_S, wait_until

ROOT = Path(__file__).resolve().parents[2]
RUN = secrets.token_hex(3)
# Namespaces of the session operator (kopf needs no namespace-listing rights for fixed names).
SESSION_NAMESPACES = [
    f"e2e-{RUN}-{n}"
    for n in ("ex", "tune", "invalid", "delete", "metrics", "drift", "kubectl", "window", "fleet")
]
# Namespaces of operators a test starts itself (the restart test).
OTHER_NAMESPACES = [f"e2e-{RUN}-restart", f"e2e-{RUN}-reference"]
# The webhook validates SLOPolicies in namespaces with this label only, so a test can still
# store an invalid policy elsewhere and see the operator report it Degraded.
WEBHOOK_LABEL = ("jitserve.io/e2e-webhook", "on")
STATUS_INTERVAL = "1"
# Measurements printed at the end of the run (reconcile latency, control-plane start).
MEASURED: dict[str, float] = {}

API_PATHS = {
    ("v1", "Namespace"): "/api/v1/namespaces",
    ("v1", "ServiceAccount"): "/api/v1/namespaces/{ns}/serviceaccounts",
    ("v1", "Secret"): "/api/v1/namespaces/{ns}/secrets",
    (
        "rbac.authorization.k8s.io/v1",
        "ClusterRole",
    ): "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    (
        "rbac.authorization.k8s.io/v1",
        "ClusterRoleBinding",
    ): "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    (
        "rbac.authorization.k8s.io/v1",
        "Role",
    ): "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    (
        "rbac.authorization.k8s.io/v1",
        "RoleBinding",
    ): "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    (
        "apiextensions.k8s.io/v1",
        "CustomResourceDefinition",
    ): "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
    ("apps/v1", "Deployment"): "/apis/apps/v1/namespaces/{ns}/deployments",
    ("v1", "Service"): "/api/v1/namespaces/{ns}/services",
    ("v1", "ConfigMap"): "/api/v1/namespaces/{ns}/configmaps",
    (
        "inference.networking.k8s.io/v1",
        "InferencePool",
    ): "/apis/inference.networking.k8s.io/v1/namespaces/{ns}/inferencepools",
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingWebhookConfiguration",
    ): "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
}


Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def wait_for(what: str, check: Callable[[], Any], timeout_s: float = 60.0,
             every_s: float = 0.2) -> Any:
    """:func:`wait_until` for the API server: a KubeError (an object not there yet, a
    conflict) counts as not yet."""
    return wait_until(what, check, timeout_s, every_s, tolerate=(KubeError,))


def apply(kube: RestKube, obj: dict[str, Any]) -> dict[str, Any]:
    """Create, or replace if it exists (enough for the test's own objects)."""
    base = API_PATHS[(obj["apiVersion"], obj["kind"])].format(
        ns=obj["metadata"].get("namespace", "")
    )
    name = obj["metadata"]["name"]
    live = kube.request("GET", f"{base}/{name}")
    if live is None:
        return kube.request("POST", base, obj) or {}
    obj = {
        **obj,
        "metadata": {**obj["metadata"], "resourceVersion": live["metadata"]["resourceVersion"]},
    }
    return kube.request("PUT", f"{base}/{name}", obj) or {}


def ensure_namespace(kube: RestKube, name: str, labels: dict[str, str] | None = None) -> None:
    if kube.request("GET", f"/api/v1/namespaces/{name}") is None:
        kube.request(
            "POST",
            "/api/v1/namespaces",
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": name, "labels": labels or {}},
            },
        )


def install_objects() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((ROOT / "manifests" / "install.yaml").read_text()) if d]


def chart_objects(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The chart rendered by Helm's SDK (scripts/render_manifests.py), CRD first."""
    from scripts import render_manifests  # imports Helm's SDK: only where a chart is rendered

    docs: list[dict[str, Any]] = render_manifests.render_documents(values)
    return docs


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    start = time.monotonic()
    with cluster_kubeconfig(tmp_path_factory.mktemp("k8s")) as found:
        if not found[1].get("external"):
            MEASURED["control_plane_start_s (etcd + apiserver ready)"] = time.monotonic() - start
        yield found


TRANSIENT = ("etcdserver: request timed out", "etcdserver: leader changed",
             "the server was unable to return a response in the time allotted",
             "Timeout: request did not complete within")
"""A busy machine's API server answers these now and then (its etcd missed a deadline);
kubectl is run again, as a client with retries would."""


@pytest.fixture(scope="session")
def kubectl(
    cluster: tuple[Path, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> Kubectl:
    built = k8s_bin_dir() / "kubectl"
    binary = str(built) if built.exists() else shutil.which("kubectl")
    if binary is None or (cluster[1].get("external") is False and not built.exists()):
        pytest.fail(f"{built} is missing: run scripts/setup-k8s.sh")
    cache = tmp_path_factory.mktemp("kubectl-cache")

    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        argv = [str(binary), f"--kubeconfig={cluster[0]}", f"--cache-dir={cache}", *args]
        for backoff_s in (1.0, 2.0, 4.0, 8.0, 0.0):
            result = subprocess.run(
                argv, cwd=ROOT, input=stdin, capture_output=True, text=True, timeout=120
            )
            if result.returncode == 0 or not any(m in result.stderr for m in TRANSIENT):
                return result
            if backoff_s:
                time.sleep(backoff_s)
        return result

    return run


@pytest.fixture(scope="session")
def admin(cluster: tuple[Path, dict[str, Any]]) -> RestKube:
    kube = RestKube.from_environment(str(cluster[0]))
    crd = yaml.safe_load((ROOT / "crds" / f"{c.CRD_NAME}.yaml").read_text())
    apply(kube, crd)

    def established() -> bool:
        live = kube.request(
            "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{c.CRD_NAME}"
        )
        conds = ((live or {}).get("status") or {}).get("conditions") or []
        return any(x["type"] == "Established" and x["status"] == "True" for x in conds)

    wait_for("the SLOPolicy CRD to be established", established)
    # The resource shows up in discovery a moment after Established.
    wait_for("slopolicies in discovery", lambda: kube.request("GET", f"/apis/{c.API_VERSION}"))
    return kube


@pytest.fixture(scope="session")
def operator_kubeconfig(
    admin: RestKube, cluster: tuple[Path, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A kubeconfig holding the chart's operator ServiceAccount token (chart RBAC only)."""
    for ns in SESSION_NAMESPACES + OTHER_NAMESPACES:
        # NS_INVALID stores specs the webhook would refuse: no webhook there.
        ensure_namespace(admin, ns, None if ns.endswith("-invalid") else dict([WEBHOOK_LABEL]))
    namespace = next(d for d in install_objects() if d["kind"] == "Namespace")
    apply(admin, namespace)
    docs = chart_objects({"watchNamespaces": SESSION_NAMESPACES + OTHER_NAMESPACES})
    for doc in docs:
        if doc["kind"] in {"ServiceAccount", "Role", "RoleBinding"}:
            apply(admin, doc)
    sa = next(d for d in docs if d["kind"] == "ServiceAccount")
    ns, name = sa["metadata"]["namespace"], sa["metadata"]["name"]
    # A token Secret works on every version (1.24+ no longer makes one per ServiceAccount).
    apply(
        admin,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/service-account-token",
            "metadata": {
                "name": f"{name}-e2e-token",
                "namespace": ns,
                "annotations": {"kubernetes.io/service-account.name": name},
            },
        },
    )

    def token() -> str | None:
        secret = admin.request("GET", f"/api/v1/namespaces/{ns}/secrets/{name}-e2e-token") or {}
        return (secret.get("data") or {}).get("token")

    # kube-controller-manager's token controller, started after the API server was ready
    encoded = wait_for("the ServiceAccount token (token controller)", token,
                       timeout_s=PROCESS_START_TIMEOUT_S)
    server = yaml.safe_load(cluster[0].read_text())["clusters"][0]["cluster"]["server"]
    path = tmp_path_factory.mktemp("operator") / "operator.kubeconfig"
    if cluster[1].get("external"):
        # Keep the external cluster's CA/TLS settings, swap in the ServiceAccount's token.
        config = yaml.safe_load(cluster[0].read_text())
        config["users"] = [
            {"name": "jitserve-operator", "user": {"token": base64.b64decode(encoded).decode()}}
        ]
        for ctx in config["contexts"]:
            ctx["context"]["user"] = "jitserve-operator"
        path.write_text(yaml.safe_dump(config))
        return path
    return write_kubeconfig(
        path, server, base64.b64decode(encoded).decode(), user="jitserve-operator"
    )


@dataclass
class OperatorProcess:
    """``python -m jitserve.cli operator`` as a child process, logging to a file."""

    kubeconfig: Path
    namespaces: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = None
    extra_args: tuple[str, ...] = ()

    def start(self, wait: bool = True) -> OperatorProcess:
        from tests.support.k8s import free_port

        health = f"http://127.0.0.1:{free_port()}/healthz"
        argv = [
            sys.executable,
            "-m",
            "jitserve.cli",
            "operator",
            "--kubeconfig",
            str(self.kubeconfig),
            "--status-interval",
            STATUS_INTERVAL,
            "--sidecar-image",
            "jitserve/sidecar:e2e",
            "--liveness",
            health,
        ]
        for ns in self.namespaces:
            argv += ["--namespace", ns]
        argv += list(self.extra_args)
        env = {**os.environ, **(self.env or {})}
        env.pop("KUBECONFIG", None)
        log = open(self.log_path, "ab")  # noqa: SIM115 (lives with the process)
        self.proc = vl.start_process(argv, log, env)  # dies with the tests
        if wait:  # kopf answers its liveness probe once it runs

            def alive() -> bool:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise AssertionError(
                        f"operator exited {self.proc.returncode}:\n{self.log()[-3000:]}"
                    )
                try:
                    with urllib.request.urlopen(health, timeout=1) as response:
                        return bool(response.status == 200)
                except OSError:
                    return False

            wait_for("the operator's liveness endpoint", alive, timeout_s=PROCESS_START_TIMEOUT_S)
        return self

    def wait(self, timeout_s: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout_s)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass(frozen=True)
class WebhookCert:
    """A self-signed serving certificate for 127.0.0.1 (openssl), and its CA bundle."""

    cert: Path
    key: Path

    @property
    def ca_bundle(self) -> str:
        return base64.b64encode(self.cert.read_bytes()).decode()


def make_webhook_cert(directory: Path) -> WebhookCert:
    cert, key = directory / "tls.crt", directory / "tls.key"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    return WebhookCert(cert, key)


@dataclass
class SessionOperator(OperatorProcess):
    webhook_port: int = 0
    metrics_port: int = 0
    cert: WebhookCert | None = None

    @property
    def webhook_url(self) -> str:
        return f"https://127.0.0.1:{self.webhook_port}/validate-slopolicy"


@pytest.fixture(scope="session")
def session_operator(
    admin: RestKube, operator_kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SessionOperator]:
    from tests.support.k8s import free_port

    workdir = tmp_path_factory.mktemp("oplog")
    cert = make_webhook_cert(workdir)
    webhook_port, metrics_port = free_port(), free_port()
    op = SessionOperator(
        operator_kubeconfig,
        SESSION_NAMESPACES,
        workdir / "operator.log",
        extra_args=(
            *("--webhook-port", str(webhook_port), "--webhook-addr", "127.0.0.1"),
            *("--webhook-cert", str(cert.cert), "--webhook-key", str(cert.key)),
            *("--metrics-port", str(metrics_port), "--metrics-addr", "127.0.0.1"),
        ),
        webhook_port=webhook_port,
        metrics_port=metrics_port,
        cert=cert,
    ).start()
    yield op
    op.stop()
    failures = [
        line for line in op.log().splitlines() if "Forbidden" in line or "forbidden" in line
    ]
    assert not failures, "the operator hit RBAC denials:\n" + "\n".join(failures[:20])
    for ns in SESSION_NAMESPACES:
        with contextlib.suppress(KubeError):
            admin.request("DELETE", f"/api/v1/namespaces/{ns}")


@pytest.fixture(scope="session")
def webhook(admin: RestKube, session_operator: SessionOperator) -> Iterator[dict[str, Any]]:
    """The chart's ValidatingWebhookConfiguration, calling the session operator by URL."""
    import socket

    def listening() -> bool:
        assert session_operator.proc is not None
        if session_operator.proc.poll() is not None:
            raise AssertionError(f"operator exited {session_operator.proc.returncode}:\n"
                                 f"{session_operator.log()[-3000:]}")
        with socket.socket() as sock:
            sock.settimeout(1)
            return sock.connect_ex(("127.0.0.1", session_operator.webhook_port)) == 0

    wait_for("the operator's webhook server", listening, timeout_s=PROCESS_START_TIMEOUT_S)
    assert session_operator.cert is not None
    values = {
        "webhook": {
            "url": session_operator.webhook_url,
            "caBundle": session_operator.cert.ca_bundle,
            "namespaceSelector": {"matchLabels": dict([WEBHOOK_LABEL])},
        }
    }
    (config,) = [d for d in chart_objects(values) if d["kind"] == "ValidatingWebhookConfiguration"]
    config["metadata"]["name"] = f"jitserve-e2e-{RUN}"
    path = API_PATHS[("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration")]
    apply(admin, config)
    yield config
    with contextlib.suppress(KubeError):
        admin.request("DELETE", f"{path.format(ns='')}/{config['metadata']['name']}")


@pytest.fixture(scope="session")
def operator_log(session_operator: OperatorProcess) -> Callable[[], str]:
    return session_operator.log


def gateway_pod_selector(name: str) -> str:
    """The label selector of a policy's gateway pods (``spec.replicas`` > 1)."""
    from jitserve.operator.naming import gateway_selector

    return ",".join(f"{k}={v}" for k, v in sorted(gateway_selector(name).items()))


def mark_pods_running(kube: RestKube, ns: str, name: str, pod_ip: str = "127.0.0.1",
                      selector: str | None = None) -> int:
    """What the kubelet would do: the policy's pods (or those ``selector`` names) become
    Running and Ready with an IP."""
    from datetime import UTC, datetime

    from jitserve.operator import builders as b

    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    pods = kube.list("v1", "Pod", ns, selector or b.selector_string(name))
    for pod in pods:
        conds = [
            {"type": t, "status": "True", "lastTransitionTime": now}
            for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
        ]
        status = {
            "phase": "Running",
            "podIP": pod_ip,
            "podIPs": [{"ip": pod_ip}],
            "startTime": now,
            "conditions": conds,
        }
        kube.request(
            "PATCH",
            f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}/status",
            {"status": status},
            "application/merge-patch+json",
        )
    return len(pods)
