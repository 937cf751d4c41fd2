"""Render manifests/install.yaml from charts/jitserve with Helm (the Go SDK, via helm-python-sdk).

    .venv/bin/python scripts/render_manifests.py          # rewrite manifests/install.yaml
    .venv/bin/python scripts/render_manifests.py --check  # exit 1 if it is out of date

The plain install manifest = a Namespace, the chart's CRD and the chart's templates
rendered with default values (but no validating webhook, see INSTALL_VALUES), release
"jitserve" in namespace "jitserve-system".
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "jitserve"
OUT = ROOT / "manifests" / "install.yaml"
RELEASE = "jitserve"
NAMESPACE = "jitserve-system"
ORDER = ["Namespace", "CustomResourceDefinition", "ServiceAccount", "Secret", "ConfigMap",
         "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Service", "Deployment",
         "ValidatingWebhookConfiguration"]
# The plain manifest has no webhook: its TLS certificate would be one key for every
# installation, in git. The chart generates one per installation (see docs/operator.md).
INSTALL_VALUES: dict[str, object] = {"webhook": {"enabled": False}}


def render_documents(values: dict[str, object] | None = None,
                     namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """The chart's objects (CRD first), as Helm renders them."""
    import helm_python as helm

    chart = helm.Chart.load(str(CHART))
    rendered = chart.render(values, name=RELEASE, namespace=namespace, is_install=True)
    docs: list[dict[str, Any]] = []
    for crd in sorted((CHART / "crds").glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(crd.read_text()) if d)
    for path in sorted(rendered):
        if path.endswith(".yaml"):
            docs.extend(d for d in yaml.safe_load_all(rendered[path]) if d)
    return sorted(docs, key=lambda d: ORDER.index(d["kind"]) if d["kind"] in ORDER else len(ORDER))


def install_manifest() -> str:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    docs = [namespace, *render_documents(INSTALL_VALUES)]
    header = (
        "# Plain install manifest of jitserve: `kubectl apply -f manifests/install.yaml`.\n"
        "# Rendered from charts/jitserve (default values) by scripts/render_manifests.py;"
        " do not edit.\n"
    )
    return header + yaml.safe_dump_all(docs, sort_keys=False, explicit_start=True, width=100)


def main(argv: list[str]) -> int:
    text = install_manifest()
    if "--check" in argv:
        if OUT.read_text() != text:
            print(f"{OUT} is out of date: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
