"""Session fixtures and helpers for the tests against a real API server (see k8s_cluster.py).

- ``admin``: a client with cluster-admin rights (installs the CRD, creates namespaces,
  plays the kubelet where pods must look running);
- ``operator_kubeconfig``: credentials of the chart's operator ServiceAccount, bound by
  the chart's own RBAC (rendered into manifests/install.yaml), so every operator test
  also proves the chart's least-privilege rules are enough;
- ``session_operator``: one ``jitserve operator`` process (the real CLI) watching the
  session's test namespaces.
"""

from __future__ import annotations

import contextlib
import os
import secrets
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
from k8s_cluster import cluster_kubeconfig, write_kubeconfig

from jitserve.operator import constants as c
from jitserve.operator.kube import KubeError, RestKube

ROOT = Path(__file__).resolve().parents[2]
RUN = secrets.token_hex(3)
# Namespaces of the session operator (kopf needs no namespace-listing rights for fixed names).
SESSION_NAMESPACES = [
    f"e2e-{RUN}-{n}" for n in ("ex", "tune", "invalid", "delete", "metrics", "drift")
]
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
}


def wait_for(
    what: str, check: Callable[[], Any], timeout_s: float = 30.0, every_s: float = 0.2
) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except KubeError as err:
            last = err
        if last and not isinstance(last, KubeError):
            return last
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last: {last!r})")


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


def ensure_namespace(kube: RestKube, name: str) -> None:
    if kube.request("GET", f"/api/v1/namespaces/{name}") is None:
        kube.request(
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
        )


def install_objects() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((ROOT / "manifests" / "install.yaml").read_text()) if d]


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    start = time.monotonic()
    with cluster_kubeconfig(tmp_path_factory.mktemp("k8s")) as found:
        if not found[1].get("external"):
            MEASURED["control_plane_start_s (etcd + apiserver ready)"] = time.monotonic() - start
        yield found


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
    docs = install_objects()
    kinds = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
    for doc in docs:
        if doc["kind"] in kinds:
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

    import base64

    encoded = wait_for("the ServiceAccount token (token controller)", token, timeout_s=60)
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

    def start(self, wait: bool = True) -> OperatorProcess:
        from k8s_cluster import free_port

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
        env = {**os.environ, **(self.env or {})}
        env.pop("KUBECONFIG", None)
        log = open(self.log_path, "ab")  # noqa: SIM115 (lives with the process)
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
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

            wait_for("the operator's liveness endpoint", alive, timeout_s=60)
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


@pytest.fixture(scope="session")
def session_operator(
    admin: RestKube, operator_kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    for ns in SESSION_NAMESPACES:
        ensure_namespace(admin, ns)
    op = OperatorProcess(
        operator_kubeconfig, SESSION_NAMESPACES, tmp_path_factory.mktemp("oplog") / "operator.log"
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
def operator_log(session_operator: OperatorProcess) -> Callable[[], str]:
    return session_operator.log
