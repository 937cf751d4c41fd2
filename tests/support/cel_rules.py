"""The CRD's CEL rules evaluated as a Kubernetes >= 1.25 API server evaluates them, with
cel-python (the test API server, 1.20, has no CEL).

:func:`api_server_verdict` defaults the object from the structural schema (the API server
defaults before it validates), then walks schema and object together: every
``x-kubernetes-validations`` rule is evaluated with ``self`` = the value at its node (for
a list's item schema: each item), and list-maps refuse duplicate keys. What the OpenAPI
types, patterns and bounds say is not re-checked here: the manifests under test are
schema-valid, and the cross-field rules are the point.
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

import celpy

JSON = dict[str, Any]


def apply_defaults(schema: JSON, value: Any) -> Any:
    """The object with the schema's defaults filled in, recursively (also inside a default
    that was just filled in, as the API server does)."""
    if isinstance(value, dict) and schema.get("type") == "object":
        props: JSON = schema.get("properties") or {}
        out = dict(value)
        for name, sub in props.items():
            if name not in out and "default" in sub:
                out[name] = copy.deepcopy(sub["default"])
            if name in out:
                out[name] = apply_defaults(sub, out[name])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            out = {k: apply_defaults(extra, v) for k, v in out.items()}
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(schema["items"], v) for v in value]
    return value


@cache
def _program(rule: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(rule))


def evaluate(rule: str, value: Any) -> bool:
    result = _program(rule).evaluate({"self": celpy.json_to_cel(value)})
    if isinstance(result, Exception):  # celpy returns evaluation errors as values
        raise result
    return bool(result)


def cel_failures(schema: JSON, value: Any, path: str = "") -> list[str]:
    """``path: message`` of every CEL rule (and list-map key) ``value`` breaks."""
    failures = [
        f"{path or '<root>'}: {rule['message']}"
        for rule in schema.get("x-kubernetes-validations") or []
        if not evaluate(rule["rule"], value)
    ]
    if isinstance(value, dict):
        props: JSON = schema.get("properties") or {}
        for name, sub in props.items():
            if name in value:
                failures += cel_failures(sub, value[name], f"{path}.{name}".lstrip("."))
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, sub_value in value.items():
                failures += cel_failures(extra, sub_value, f"{path}[{key}]")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        keys = schema.get("x-kubernetes-list-map-keys") or []
        seen: set[tuple[Any, ...]] = set()
        for index, item in enumerate(value):
            failures += cel_failures(schema["items"], item, f"{path}[{index}]")
            if keys and isinstance(item, dict):
                key = tuple(item.get(k) for k in keys)
                if key in seen:
                    failures.append(f"{path}[{index}]: Duplicate value: {key}")
                seen.add(key)
    return failures


def api_server_verdict(root_schema: JSON, obj: JSON) -> list[str]:
    """What a CEL-enabled API server refuses ``obj`` for, by its CRD's rules (empty: it
    passes them)."""
    return cel_failures(root_schema, apply_defaults(root_schema, obj))
