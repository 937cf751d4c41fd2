"""The CRD is generated from the pydantic model, structural, and checked in."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from jitserve.cli import main
from jitserve.operator.crd import (
    CRD_FILENAME,
    NO_CEL_DIR,
    crd_object,
    crd_yaml,
    structural_schema,
)
from jitserve.policy import SLOPolicySpec, load_policy

ROOT = Path(__file__).resolve().parents[2]


def test_crds_dir_matches_the_model() -> None:
    """Fails when jitserve.policy changed and `jitserve crd --out crds/` was not re-run."""
    checked_in = (ROOT / "crds" / CRD_FILENAME).read_text()
    assert checked_in == crd_yaml(), (
        "crds/ drifted from jitserve.policy: run `jitserve crd --out crds/`"
    )


def test_no_cel_variant_matches_the_model_less_its_cel_rules() -> None:
    """crds/no-cel/ (Kubernetes 1.20-1.24) = the CRD without x-kubernetes-validations."""
    checked_in = (ROOT / "crds" / NO_CEL_DIR / CRD_FILENAME).read_text()
    assert checked_in == crd_yaml(cel=False), (
        "crds/no-cel/ drifted: run `jitserve crd --no-cel --out crds/no-cel/`"
    )
    assert "x-kubernetes-validations" not in checked_in
    with_cel = yaml.safe_dump(crd_object())
    assert with_cel.count("x-kubernetes-validations") >= 10


def test_chart_ships_the_same_crd() -> None:
    chart_copy = (ROOT / "charts" / "jitserve" / "crds" / CRD_FILENAME).read_text()
    assert chart_copy == crd_yaml(), (
        "charts/jitserve/crds/ drifted: run `jitserve crd --out charts/jitserve/crds/`"
    )


def test_cli_prints_the_crd(capsys: Any) -> None:
    assert main(["crd"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == crd_object()


def _walk(node: Any, path: str = "") -> Any:
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from _walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}[{i}]")


def test_schema_is_structural() -> None:
    schema = crd_object()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        for forbidden in ("$ref", "$defs", "anyOf", "allOf", "oneOf", "title", "const"):
            assert forbidden not in node, f"{forbidden} at {path}"
        if "additionalProperties" in node:
            assert node["additionalProperties"] is not False and "properties" not in node, path
        if node.get("type") in ("number", "integer") and "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True and "minimum" in node, path


def test_schema_names_the_issue_fields_with_ranges_and_enums() -> None:
    spec = crd_object()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    props = spec["properties"]
    cutoff = props["scheduler"]["properties"]["cutoff"]["properties"]["value"]
    assert (cutoff["minimum"], cutoff["exclusiveMinimum"], cutoff["maximum"]) == (0, True, 1)
    weight = props["fairness"]["properties"]["weight"]
    assert (weight["minimum"], weight["maximum"]) == (0, 1)
    ttft = props["sloDefaults"]["properties"]["latency"]["properties"]["ttftSeconds"]
    assert ttft["exclusiveMinimum"] is True and ttft["minimum"] == 0
    assert props["admission"]["properties"]["overloadAction"]["enum"] == ["drop", "demote"]
    tenants = props["fairness"]["properties"]["tenants"]
    assert tenants["x-kubernetes-list-type"] == "map" and tenants["items"]["required"] == ["name"]
    assert props["model"]["properties"]["gpus"]["maximum"] == 16
    # Optional, not nullable: kubectl explain loses the fields of a nullable object.
    assert "nullable" not in props["ingress"] and "ingress" not in spec.get("required", [])


def test_subresources_printer_columns_and_short_name() -> None:
    crd = crd_object()["spec"]
    version = crd["versions"][0]
    assert version["subresources"]["status"] == {}
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    columns = {col["name"]: col for col in version["additionalPrinterColumns"]}
    for wanted in ("Ready", "Replicas", "P", "F", "Attainment", "Age"):
        assert wanted in columns and columns[wanted].get("priority", 0) == 0
    # The default Attainment column is the recent window; the lifetime figure is -o wide.
    assert columns["Attainment"]["jsonPath"] == ".status.recentAttainment.overall"
    assert columns["Lifetime"]["jsonPath"] == ".status.attainment.overall"
    assert columns["Lifetime"]["priority"] == 1
    assert columns["Jain"]["jsonPath"] == ".status.fairness.jainIndex"
    assert columns["Jain"]["priority"] == 1
    assert crd["names"]["shortNames"] == ["slop"]


def _properties(node: dict[str, Any], path: str = "") -> Any:
    """(path, schema) of every field under ``node`` (objects, list items, map values)."""
    for name, sub in (node.get("properties") or {}).items():
        yield f"{path}.{name}", sub
        yield from _properties(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _properties(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _properties(node["additionalProperties"], f"{path}.*")


def test_every_field_is_described() -> None:
    """`kubectl explain` reads these: no field of spec or status without a description."""
    root = crd_object()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    fields = [(path, node) for path, node in _properties(root) if path != ".metadata"]
    missing = [path for path, node in fields if not str(node.get("description", "")).strip()]
    assert missing == [], f"{len(missing)} of {len(fields)} fields have no description"
    assert len(fields) > 130


def test_conditions_follow_the_api_conventions() -> None:
    status = crd_object()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
        "status"
    ]["properties"]
    conditions = status["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert "type" in conditions["items"]["required"]
    item = conditions["items"]["properties"]
    assert item["lastTransitionTime"]["format"] == "date-time"
    assert status["lastScrapeTime"]["format"] == "date-time"
    assert status["recentAttainment"]["properties"]["overall"]["maximum"] == 1


def test_pod_knobs_are_in_the_schema() -> None:
    spec = crd_object()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    env = spec["properties"]["model"]["properties"]["env"]["items"]["properties"]
    assert set(env["valueFrom"]["properties"]) == {"secretKeyRef", "configMapKeyRef", "fieldRef"}
    pod = spec["properties"]["pod"]["properties"]
    for knob in (
        "nodeSelector",
        "tolerations",
        "affinity",
        "imagePullSecrets",
        "runtimeClassName",
        "priorityClassName",
        "volumes",
    ):
        assert knob in pod, knob
    assert pod["affinity"]["x-kubernetes-preserve-unknown-fields"] is True
    volume = pod["volumes"]["items"]
    assert volume["required"] == ["name"] and volume["x-kubernetes-preserve-unknown-fields"]
    cache = spec["properties"]["model"]["properties"]["cache"]["properties"]
    assert cache["accessMode"]["enum"] == ["ReadWriteOnce", "ReadWriteMany"]
    window = spec["properties"]["reporting"]["properties"]["attainmentWindowSeconds"]
    assert (window["default"], window["minimum"]) == (300, 10)


def _apply_defaults(obj: Any, schema: dict[str, Any]) -> Any:
    """The API server's structural defaulting (apiextensions-apiserver's Default())."""
    if isinstance(obj, dict) and "properties" in schema:
        for key, prop in schema["properties"].items():
            if key not in obj and "default" in prop:
                obj[key] = copy.deepcopy(prop["default"])
        for key, value in obj.items():
            if key in schema["properties"]:
                _apply_defaults(value, schema["properties"][key])
    elif isinstance(obj, list) and "items" in schema:
        for item in obj:
            _apply_defaults(item, schema["items"])
    return obj


def test_server_side_defaults_equal_the_model_defaults() -> None:
    """An empty spec, defaulted by the CRD schema, is exactly SLOPolicySpec()."""
    schema = structural_schema(SLOPolicySpec)
    defaulted = _apply_defaults({}, schema)
    expected = SLOPolicySpec().model_dump(mode="json", by_alias=True, exclude_none=True)
    assert defaulted == expected
    assert load_policy(defaulted) == SLOPolicySpec()
