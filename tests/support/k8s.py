"""A real Kubernetes control plane for the operator tests, or any cluster you point at.

``JITSERVE_E2E_KUBECONFIG=/path/kubeconfig``: use that cluster (kind, k3s, a cloud), as an
admin; nothing is started. Otherwise start etcd, kube-apiserver and kube-controller-manager
1.20.2 on loopback (built by scripts/setup-k8s.sh into
``${JITSERVE_CACHE:-~/.cache/jitserve}/k8s-v1.20.2-p2/bin``, with the kubectl the kubectl
tests use), write an admin kubeconfig, and
stop and delete everything at the end. There is no kubelet: pods stay Pending, so tests that
need running pods patch their status the way a kubelet would, and say so.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from jitserve.devstack import vllm as vl
from tests.support.waiting import PROCESS_START_TIMEOUT_S

K8S_VERSION = "1.20.2"
PATCH_LEVEL = "p2"  # scripts/setup-k8s.sh: the source patches applied to that version
KUBECONFIG_ENV = "JITSERVE_E2E_KUBECONFIG"


def k8s_bin_dir() -> Path:
    cache = Path(os.environ.get("JITSERVE_CACHE", Path.home() / ".cache" / "jitserve"))
    return cache / f"k8s-v{K8S_VERSION}-{PATCH_LEVEL}" / "bin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def write_kubeconfig(path: Path, server: str, token: str, user: str = "admin") -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "local", "cluster": {"server": server, "insecure-skip-tls-verify": True}}
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
        "current-context": "local",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@dataclass
class LocalControlPlane:
    """etcd + kube-apiserver + kube-controller-manager as child processes."""

    workdir: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    kubeconfig: Path | None = None
    server: str = ""
    timings: dict[str, float] = field(default_factory=dict)

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 (lives with the process)
        proc = vl.start_process(argv, log, cwd=self.workdir)  # dies with the tests
        self.processes.append(proc)
        return proc

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.workdir / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def start(self) -> None:
        bins = k8s_bin_dir()
        apiserver, kcm = bins / "kube-apiserver", bins / "kube-controller-manager"
        etcd = shutil.which("etcd")
        missing = [str(p) for p in (apiserver, kcm) if not p.exists()]
        if etcd is None:
            missing.append("etcd (Debian package etcd-server)")
        if shutil.which("openssl") is None:
            missing.append("openssl")
        if missing:
            raise RuntimeError(
                f"missing {', '.join(missing)}: run scripts/setup-k8s.sh (or set {KUBECONFIG_ENV})"
            )
        t0 = time.monotonic()
        w = self.workdir
        subprocess.run(
            ["openssl", "genrsa", "-out", str(w / "sa.key"), "2048"],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            ["openssl", "rsa", "-in", str(w / "sa.key"), "-pubout", "-out", str(w / "sa.pub")],
            check=True,
            capture_output=True,
        )
        token = secrets.token_hex(16)
        (w / "tokens.csv").write_text(f"{token},admin,admin-uid,system:masters\n")
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        self._spawn(
            "etcd",
            [
                str(etcd),
                "--data-dir",
                str(w / "etcd"),
                "--name",
                "jitserve-test",
                "--listen-client-urls",
                f"http://127.0.0.1:{etcd_port}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{etcd_port}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-cluster",
                f"jitserve-test=http://127.0.0.1:{peer_port}",
            ],
        )
        self._spawn(
            "kube-apiserver",
            [
                str(apiserver),
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                "--bind-address=127.0.0.1",
                f"--secure-port={api_port}",
                f"--cert-dir={w / 'certs'}",
                f"--token-auth-file={w / 'tokens.csv'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={w / 'sa.pub'}",
                f"--service-account-signing-key-file={w / 'sa.key'}",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--authorization-mode=RBAC",
                "--enable-priority-and-fairness=false",
                "--v=1",
            ],
        )
        self.server = f"https://127.0.0.1:{api_port}"
        self.kubeconfig = write_kubeconfig(w / "admin.kubeconfig", self.server, token)
        self._wait_ready(token)
        self.timings["apiserver_ready_s"] = time.monotonic() - t0
        self._spawn(
            "kube-controller-manager",
            [
                str(kcm),
                f"--kubeconfig={self.kubeconfig}",
                f"--service-account-private-key-file={w / 'sa.key'}",
                "--controllers=*",
                "--leader-elect=false",
                "--secure-port=0",
                "--port=0",
                "--use-service-account-credentials=false",
            ],
        )

    def _wait_ready(self, token: str, timeout_s: float = PROCESS_START_TIMEOUT_S) -> None:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for proc in self.processes:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{proc.args[0]} exited {proc.returncode}:\n"
                        + self.log_tail(Path(str(proc.args[0])).name)
                    )
            request = urllib.request.Request(
                f"{self.server}/readyz", headers={"Authorization": f"Bearer {token}"}
            )
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(request, context=ctx, timeout=2) as response,
            ):
                if response.status == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError("kube-apiserver not ready:\n" + self.log_tail("kube-apiserver"))

    def stop(self) -> None:
        for proc in reversed(self.processes):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self.processes):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.processes.clear()


@contextlib.contextmanager
def cluster_kubeconfig(workdir: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """An admin kubeconfig: the one in JITSERVE_E2E_KUBECONFIG, or a fresh local cluster's."""
    external = os.environ.get(KUBECONFIG_ENV)
    if external:
        yield Path(external), {"external": True}
        return
    plane = LocalControlPlane(workdir)
    try:
        plane.start()
        assert plane.kubeconfig is not None
        yield plane.kubeconfig, {"external": False, **plane.timings}
    finally:
        plane.stop()


def to_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True)
