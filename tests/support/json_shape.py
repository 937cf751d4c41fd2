"""The shape of a JSON value (keys, list-ness, value types; not the values), for tests
that compare jitserve's answers with the bare vLLM's.

A shape is a union: the types seen at a place, the fields if an object was seen there, the
element shape if a list was. Merging is order-free (commutative and associative), so what
the sampled tokens happen to be (a token of no bytes, `logprobs` null in the first chunk
and an object later) does not change the shape of a stream.
"""
from __future__ import annotations

from typing import Any

Shape = dict[str, Any]


def shape(value: Any) -> Shape:
    if isinstance(value, dict):
        return {"object": {k: shape(v) for k, v in value.items()}}
    if isinstance(value, list):
        items: Shape | None = None
        for item in value:
            items = merge(items, shape(item))
        return {"array": items}
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return {"types": frozenset({type(value).__name__})}
    return {"types": frozenset({"number"})}


def merge(a: Shape | None, b: Shape | None) -> Shape | None:
    if a is None or b is None:
        return a if b is None else b
    merged: Shape = {}
    if "types" in a or "types" in b:
        merged["types"] = a.get("types", frozenset()) | b.get("types", frozenset())
    if "object" in a or "object" in b:
        fa, fb = a.get("object", {}), b.get("object", {})
        merged["object"] = {k: merge(fa.get(k), fb.get(k)) for k in {*fa, *fb}}
    if "array" in a or "array" in b:
        merged["array"] = merge(a.get("array"), b.get("array"))
    return merged


def stream_shape(docs: list[Any]) -> Shape | None:
    """The merged shape of a stream's chunks."""
    merged: Shape | None = None
    for doc in docs:
        merged = merge(merged, shape(doc))
    return merged
