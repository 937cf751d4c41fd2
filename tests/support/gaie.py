"""The Gateway API Inference Extension's InferencePool CRD (crds/gaie/, with its notice) on
the test API server. An API server without CEL (this 1.20) drops the CRD's
``x-kubernetes-validations`` it does not know; its kubectl refuses them client-side, so
kubectl applies it with ``--validate=false`` there, as crds/gaie/NOTICE.md says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from jitserve.operator.kube import RestKube
from tests.support.operator_session import apply, wait_for

ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = ROOT / "crds" / "gaie"
CRD_FILE = CRD_DIR / "inference.networking.k8s.io_inferencepools.yaml"
CRD_NAME = "inferencepools.inference.networking.k8s.io"
API_VERSION = "inference.networking.k8s.io/v1"


def inference_pool_crd() -> dict[str, Any]:
    crd: dict[str, Any] = yaml.safe_load(CRD_FILE.read_text())
    return crd


def wait_established(admin: RestKube) -> None:
    def established() -> bool:
        live = admin.request(
            "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}")
        conds = ((live or {}).get("status") or {}).get("conditions") or []
        return any(x["type"] == "Established" and x["status"] == "True" for x in conds)

    wait_for("the InferencePool CRD to be established", established)
    wait_for("inferencepools in discovery", lambda: admin.request("GET", f"/apis/{API_VERSION}"))


def install_inference_pool_crd(admin: RestKube) -> None:
    """The CRD as the project ships it (the API server keeps what it knows)."""
    apply(admin, inference_pool_crd())
    wait_established(admin)
