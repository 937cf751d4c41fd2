"""Reading one client request safely: who sends it, and its JSON body (owner: sidecar).

Everything here runs before a request touches the queue, and turns hostile or broken
input into an OpenAI-shaped 4xx/503 (:class:`~jitserve.sidecar.errors.APIError`), never
a 500 or a hang:

- :func:`tenant_of`: the tenant from the API key (keys on) or ``x-tenant`` / llm-d's
  ``x-llm-d-inference-fairness-id`` (its deprecated ``x-gateway-inference-fairness-id``
  as an alias; keys off; with keys on they must name the key's tenant, else 403); keys
  configured but none loaded refuses everyone (503 ``auth_unavailable``);
- :func:`check_admin`: who may read ``/metrics`` and ``/debug/scheduler`` on the API port;
- :func:`read_json`: the body within ``max_body_bytes`` (413) and ``body_timeout_s``
  (408: a ``Content-Length`` larger than what is sent), valid JSON (400), nested at most
  ``max_json_depth`` deep (400 ``too_deep``) and without lone surrogates (400: they cannot
  be encoded for vLLM or the analyzer).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from jitserve.sidecar import headers as hdr
from jitserve.sidecar.config import SidecarSettings, TenantKeys
from jitserve.sidecar.errors import APIError, auth_unavailable, bad_request, request_timeout

_TENANT_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
# a JSON string escape of a UTF-16 surrogate (a pair is fine, a lone one is not)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def bearer_key(request: web.Request) -> str:
    auth = request.headers.get("Authorization", "")
    return auth[7:].strip() if auth[:7].lower() == "bearer " else ""


def claimed_tenant(headers: Mapping[str, str]) -> tuple[str, str | None]:
    """(the header read, the tenant it names or None): ``x-tenant``, else the fairness id
    or its alias."""
    found = hdr.lookup(headers, hdr.TENANT) or hdr.lookup(headers, hdr.FAIRNESS_ID)
    return found if found is not None else (hdr.FAIRNESS_ID, None)


def tenant_of(request: web.Request, keys: TenantKeys) -> str:
    header, claimed = claimed_tenant(request.headers)
    if keys.enabled:
        reason = keys.unavailable
        if reason is not None:
            raise auth_unavailable(reason)
        key = bearer_key(request)
        tenant = keys.tenant_of(key) if key else None
        if tenant is None:
            raise APIError(401, "missing or invalid API key (Authorization: Bearer KEY)",
                           type_="authentication_error", code="invalid_api_key")
        if claimed and claimed != tenant:
            raise APIError(403, f"{header}: this API key belongs to tenant {tenant!r}, "
                           f"it cannot act as {claimed[:63]!r}", type_="permission_error",
                           param=header, code="tenant_mismatch")
        return tenant
    if claimed is None:
        return "default"
    if not _TENANT_RE.match(claimed):
        raise bad_request(header, "must be 1-63 letters, digits, '-', '_' or '.'")
    return claimed


def check_admin(request: web.Request, keys: TenantKeys, settings: SidecarSettings) -> None:
    """``/metrics`` and ``/debug/scheduler`` on the API port: open while keys are off (a
    single-tenant or local setup); with keys on they show every tenant's figures and
    request ids, so they need an admin key (``--admin-key``). The admin port
    (``--admin-port``, not routed by the Service or the Ingress) needs none."""
    if not keys.enabled:
        return
    key = bearer_key(request)
    if key and key in settings.admin_keys:
        return
    raise APIError(401, "API keys are on: this endpoint needs an admin key (--admin-key), or "
                   "read it on the admin port (--admin-port)", type_="authentication_error",
                   code="invalid_api_key")


async def read_json(request: web.Request, settings: SidecarSettings) -> Any:
    length = request.content_length
    if length is not None and length > settings.max_body_bytes:
        raise APIError(413, f"request body of {length} bytes is over the limit of "
                       f"{settings.max_body_bytes} bytes", code="request_too_large")
    try:
        async with asyncio.timeout(settings.body_timeout_s):
            raw = await request.read()
    except TimeoutError:
        raise request_timeout(settings.body_timeout_s) from None
    try:
        doc = json.loads(raw)
    except RecursionError:
        raise _too_deep("body", settings.max_json_depth) from None
    except (ValueError, UnicodeDecodeError) as err:
        raise bad_request("body", f"invalid JSON: {str(err)[:200]}", code="invalid_json") from err
    if raw.count(b"[") + raw.count(b"{") > settings.max_json_depth:
        check_depth(doc, settings.max_json_depth)
    if _SURROGATE_ESCAPE.search(raw):
        check_text(doc)
    return doc


def _too_deep(param: str, limit: int) -> APIError:
    return bad_request(param, f"nested more than {limit} levels deep", code="too_deep")


def _child(path: str, key: object) -> str:
    return f"{path}.{key}" if path != "body" else str(key)


def check_depth(doc: Any, limit: int) -> None:
    """400 naming the first array or object nested deeper than ``limit`` (iterative: a
    hostile body cannot exhaust the stack)."""
    stack: list[tuple[Any, int, str]] = [(doc, 1, "body")]
    while stack:
        node, depth, path = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            if isinstance(value, dict | list):
                if depth + 1 > limit:
                    raise _too_deep(_child(path, key), limit)
                stack.append((value, depth + 1, _child(path, key)))


def check_text(doc: Any) -> None:
    """400 naming the first string (or key) holding a lone surrogate, which no UTF-8
    consumer (vLLM's tokenizer, the analyzer's protobuf) can take."""
    stack: list[tuple[Any, str]] = [(doc, "body")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                raise bad_request(path, "contains a lone UTF-16 surrogate (invalid Unicode)",
                                  code="invalid_value") from None
        elif isinstance(node, dict):
            for key, value in node.items():
                stack.append((key, path))
                stack.append((value, _child(path, key)))
        elif isinstance(node, list):
            stack.extend((value, _child(path, i)) for i, value in enumerate(node))
