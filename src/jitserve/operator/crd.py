"""Generate the ``SLOPolicy`` CustomResourceDefinition from the pydantic model.

Pydantic's JSON schema (draft 2020-12) is not a Kubernetes *structural* schema, so it is
converted: ``$ref`` inlined, ``anyOf [X, null]`` turned into plain ``X`` (an optional field
is omitted, and the API server prunes a ``null`` before defaulting; ``nullable: true`` would
make the published OpenAPI v2 drop the field's type, and ``kubectl explain`` its fields),
numeric ``exclusiveMinimum`` into OpenAPI v3's boolean form, ``additionalProperties:
false`` dropped (the API server prunes unknown fields), titles dropped, defaults kept
(nested objects default to ``{}`` so the API server fills in their own defaults, the
same way pydantic does), and lists of named objects become ``x-kubernetes-list-type:
map`` keyed by ``name`` (the API server then rejects duplicate names).

The cross-field rules the models state as CEL ``x-kubernetes-validations`` are kept
(:func:`crd_object`). Kubernetes before 1.25 evaluates no CEL, and its kubectl refuses a
CRD carrying the field (client-side validation: "unknown field"); ``cel=False`` makes the
variant without them for those clusters (``crds/no-cel/``), where the webhook checks
every rule.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from jitserve.operator import constants as c
from jitserve.operator.builders import MAX_NAME
from jitserve.policy import SLOPolicySpec, SLOPolicyStatus

JSON = dict[str, Any]

_KEEP = (
    "type",
    "description",
    "enum",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "maxProperties",
    "format",
    "required",
)


class SchemaError(ValueError):
    """The model's JSON schema has a construct with no structural equivalent."""


class _WithFactoryDefaults(GenerateJsonSchema):
    """Also emit defaults that come from ``default_factory`` (lists, dicts)."""

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        factory = schema.get("default_factory")
        if factory is not None and not schema.get("default_factory_takes_data"):
            patched = dict(schema)
            patched.pop("default_factory")
            patched["default"] = factory()  # type: ignore[call-arg]
            return super().default_schema(patched)  # type: ignore[arg-type]
        return super().default_schema(schema)


def json_schema(model: type[BaseModel]) -> JSON:
    """Pydantic's JSON schema of ``model`` with wire (camelCase) names."""
    return model.model_json_schema(by_alias=True, schema_generator=_WithFactoryDefaults)


def structural_schema(model: type[BaseModel], *, defaults: bool = True) -> JSON:
    """A Kubernetes structural OpenAPI v3 schema for ``model``."""
    raw = json_schema(model)
    defs: dict[str, JSON] = raw.pop("$defs", {})
    return _convert(raw, defs, defaults=defaults, path="")


def _resolve(node: JSON, defs: dict[str, JSON]) -> JSON:
    """Inline a ``$ref`` (or a one-element ``allOf``); sibling keys win over the target's."""
    ref = node.get("$ref")
    if ref is None and isinstance(node.get("allOf"), list) and len(node["allOf"]) == 1:
        ref = node["allOf"][0].get("$ref")
    if ref is None:
        return node
    name = str(ref).rsplit("/", 1)[-1]
    if name not in defs:
        raise SchemaError(f"unresolved $ref {ref}")
    merged = dict(defs[name])
    merged.update({k: v for k, v in node.items() if k not in ("$ref", "allOf")})
    return _resolve(merged, defs)


def _convert(node: JSON, defs: dict[str, JSON], *, defaults: bool, path: str) -> JSON:
    node = _resolve(node, defs)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if len(options) != 1:
            raise SchemaError(f"{path or '<root>'}: anyOf with {len(options)} non-null options")
        inner = {k: v for k, v in node.items() if k != "anyOf"}
        inner.update({k: v for k, v in _resolve(options[0], defs).items() if k not in inner})
        node = inner
    if "type" not in node and "properties" in node:
        node = {**node, "type": "object"}
    if "type" not in node:
        raise SchemaError(f"{path or '<root>'}: no type")
    if node["type"] == "null":
        raise SchemaError(f"{path or '<root>'}: null type")

    out: JSON = {k: node[k] for k in _KEEP if k in node}
    # Kubernetes extensions a model asks for (e.g. a list-map keyed by `type`).
    out.update({k: v for k, v in node.items() if k.startswith("x-kubernetes-")})
    if "description" in out:
        out["description"] = " ".join(str(out["description"]).replace("``", "`").split())
    if not out.get("required"):
        out.pop("required", None)
    for bound in ("exclusiveMinimum", "exclusiveMaximum"):
        if bound in node:
            value = node[bound]
            if isinstance(value, bool):  # already OpenAPI v3 style
                out[bound] = value
            else:
                out["minimum" if bound == "exclusiveMinimum" else "maximum"] = value
                out[bound] = True
    if "const" in node:
        out["enum"] = [node["const"]]

    kind = node["type"]
    if kind == "object":
        props = node.get("properties", {})
        if props:
            out["properties"] = {
                name: _convert(sub, defs, defaults=defaults, path=f"{path}.{name}".lstrip("."))
                for name, sub in props.items()
            }
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            if props:
                raise SchemaError(f"{path}: both properties and additionalProperties")
            out["additionalProperties"] = _convert(extra, defs, defaults=defaults, path=f"{path}.*")
        elif extra is True or (not props and extra is None):
            out["x-kubernetes-preserve-unknown-fields"] = True
    elif kind == "array":
        items = node.get("items")
        if not isinstance(items, dict):
            raise SchemaError(f"{path}: array without items schema")
        item_schema = _convert(items, defs, defaults=defaults, path=f"{path}[]")
        out["items"] = item_schema
        if (
            "x-kubernetes-list-type" not in out
            and item_schema.get("type") == "object"
            and "name" in item_schema.get("required", [])
        ):
            out["x-kubernetes-list-type"] = "map"
            out["x-kubernetes-list-map-keys"] = ["name"]

    # No null defaults, and no "" ones (a 1.20 API server built with Go >= 1.18 and without
    # setup-k8s.sh's go-openapi patch rejects `default: ""` as null).
    if defaults and "default" in node and node["default"] not in (None, ""):
        value = node["default"]
        out["default"] = (
            {} if isinstance(value, dict) and kind == "object" and "properties" in out else value
        )
    return out


CEL_KEY = "x-kubernetes-validations"


def _without_cel(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_cel(v) for k, v in node.items() if k != CEL_KEY}
    if isinstance(node, list):
        return [_without_cel(v) for v in node]
    return node


def crd_object(*, cel: bool = True) -> JSON:
    """The CustomResourceDefinition for ``slopolicies.jitserve.io``; ``cel=False``: without
    the CEL rules, for API servers before 1.25."""
    if not cel:
        stripped: JSON = _without_cel(crd_object())
        return stripped
    spec_schema = structural_schema(SLOPolicySpec)
    spec_schema["default"] = {}
    status_schema = structural_schema(SLOPolicyStatus, defaults=False)
    status_schema["description"] = (
        "Written by the operator: conditions, replicas, effective p, attainment."
    )
    root = {
        "type": "object",
        # Children are named after the policy (build.name_problems says the same).
        "x-kubernetes-validations": [
            {
                "rule": f"size(self.metadata.name) <= {MAX_NAME}"
                " && !self.metadata.name.contains('.')",
                "message": f"metadata.name: at most {MAX_NAME} characters, no '.' (children "
                "are named after it)",
            }
        ],
        "description": (
            "An SLO-aware LLM serving deployment: the model served by vLLM behind the jitserve "
            "scheduler sidecar, with its SLO defaults, GMAX scheduler knobs (cutoff p), fairness "
            "(weight f, tenants) and admission settings."
        ),
        "properties": {
            "apiVersion": {
                "type": "string",
                "description": f"The versioned schema of this object: {c.API_VERSION}.",
            },
            "kind": {"type": "string", "description": f"The REST resource: {c.KIND}."},
            # Only `type` is allowed here: the API server publishes ObjectMeta's own schema
            # (and its descriptions) for it.
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
    }
    columns = [
        {
            "name": "Ready",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
        },
        {
            "name": "Reason",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
            "description": "Why Ready is what it is (Available, WaitingForReplicas, ...).",
        },
        {"name": "URL", "type": "string", "jsonPath": ".status.url"},
        {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
        {"name": "Available", "type": "integer", "jsonPath": ".status.readyReplicas"},
        {
            "name": "P",
            "type": "number",
            "jsonPath": ".spec.scheduler.cutoff.value",
            "description": "Cutoff p (fixed value, or the starting point in auto mode).",
        },
        {
            "name": "Effective-P",
            "type": "number",
            "jsonPath": ".status.effectiveCutoff",
            "priority": 1,
        },
        {"name": "F", "type": "number", "jsonPath": ".spec.fairness.weight"},
        {
            "name": "Scheduler",
            "type": "string",
            "jsonPath": ".status.policyInEffect",
            "priority": 1,
            "description": "The scheduler the pods run now (with scheduler.policy auto, the "
            "tuner's choice).",
        },
        {
            "name": "Since",
            "type": "date",
            "jsonPath": ".status.policyInEffectSince",
            "priority": 1,
            "description": "When the scheduler in effect last changed on a pod.",
        },
        {
            "name": "Attainment",
            "type": "number",
            "jsonPath": ".status.recentAttainment.overall",
            "description": "SLO attainment over the last spec.reporting.attainmentWindowSeconds.",
        },
        {
            "name": "Lifetime",
            "type": "number",
            "jsonPath": ".status.attainment.overall",
            "priority": 1,
            "description": "SLO attainment since the serving pods started.",
        },
        {
            "name": "Jain",
            "type": "number",
            "jsonPath": ".status.fairness.jainIndex",
            "priority": 1,
            "description": "Jain's index of the tenants' goodput over their max-min fair "
            "shares, over the attainment window (1: every tenant its share).",
        },
        {
            "name": "Goodput",
            "type": "number",
            "jsonPath": ".status.goodputTokensPerSecond",
            "priority": 1,
            "description": "Goodput tokens per second.",
        },
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": c.CRD_NAME, "labels": {c.LABEL_NAME: "jitserve"}},
        "spec": {
            "group": c.GROUP,
            "names": {
                "kind": c.KIND,
                "listKind": f"{c.KIND}List",
                "plural": c.PLURAL,
                "singular": c.SINGULAR,
                "shortNames": list(c.SHORT_NAMES),
                "categories": ["jitserve"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": c.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }


HEADER = (
    "# Generated by `jitserve crd` from src/jitserve/policy/ (SLOPolicySpec, SLOPolicyStatus).\n"
    "# Do not edit: change the model and run `jitserve crd --out crds/`.\n"
)
NO_CEL_HEADER = (
    "# Generated by `jitserve crd --no-cel` from src/jitserve/policy/: for Kubernetes 1.20-1.24\n"
    "# (no CEL; the operator's webhook checks every cross-field rule). Do not edit: change the\n"
    "# model and run `jitserve crd --no-cel --out crds/no-cel/`.\n"
)
NO_CEL_DIR = "no-cel"


def crd_yaml(*, cel: bool = True) -> str:
    """The CRD as the YAML document ``crds/`` (``cel=False``: ``crds/no-cel/``) holds."""
    body = yaml.safe_dump(crd_object(cel=cel), sort_keys=False, width=100)
    return (HEADER if cel else NO_CEL_HEADER) + body


CRD_FILENAME = f"{c.CRD_NAME}.yaml"


def register(subparsers: Any) -> None:
    """``jitserve crd``: print the CRD YAML, or write it into a directory."""
    p = subparsers.add_parser("crd", help="print the SLOPolicy CustomResourceDefinition (YAML)")
    p.add_argument("--out", default=None, metavar="DIR", help=f"write DIR/{CRD_FILENAME} instead")
    p.add_argument("--no-cel", action="store_true",
                   help="without the CEL validation rules (Kubernetes 1.20-1.24)")
    p.set_defaults(handler=_run)


def _run(args: Any) -> int:
    import sys
    from pathlib import Path

    text = crd_yaml(cel=not args.no_cel)
    if args.out is None:
        sys.stdout.write(text)
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / CRD_FILENAME).write_text(text)
    print(out / CRD_FILENAME)
    return 0
