"""Small clients for the servers under test: blocking JSON calls, one streamed
completion, a burst of completions, and Prometheus text parsing."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from jitserve import sse
from jitserve.bench.live import StreamResult, stream_completion
from jitserve.devstack import tinymodel

MODEL = tinymodel.MODEL_NAME


def get_json(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}),
                                    timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def get_text(url: str, headers: dict[str, str] | None = None) -> str:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}),
                                timeout=30) as resp:
        text: str = resp.read().decode()
        return text


def post(
    url: str,
    body: bytes | dict[str, Any],
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, headers={"content-type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), json.loads(err.read() or b"null")


def stream(
    url: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
    path: str = "/v1/completions",
) -> StreamResult:
    async def go() -> StreamResult:
        async with aiohttp.ClientSession() as session:
            return await stream_completion(session, url, body, headers, path)

    return asyncio.run(go())


async def sse_docs(resp: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """Each JSON event of an SSE answer as it comes, until ``[DONE]``."""
    buffer = b""
    async for data in resp.content.iter_any():
        events, buffer = sse.split(buffer + data)
        for payload in map(sse.data, events):
            if payload == sse.DONE:
                return
            if payload is not None:
                yield json.loads(payload)


def complete(
    url: str, slo: dict[str, Any], *, tenant: str = "default", max_tokens: int = 16, **extra: Any
) -> int:
    """One non-streamed completion on the tiny model; returns the HTTP status."""
    body = {"model": MODEL, "prompt": [1, 2, 3, 4, 5], "max_tokens": max_tokens, "slo": slo,
            **extra}
    status, _, _ = post(url + "/v1/completions", body, {"x-tenant": tenant})
    return status


def burst(url: str, requests: list[dict[str, Any]]) -> list[int]:
    """Send ``requests`` (keyword arguments of :func:`complete`) at once."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(requests)) as pool:
        futures = [pool.submit(complete, url, **r) for r in requests]
        return [f.result() for f in futures]


def _samples(text: str, name: str, labels: dict[str, str]) -> list[float]:
    from prometheus_client.parser import text_string_to_metric_families

    return [float(sample.value)
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())]


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``; KeyError if none."""
    values = _samples(text, name, labels)
    if not values:
        raise KeyError(f"no sample {name}{labels}")
    return sum(values)


def metric_total(text: str, name: str, **labels: str) -> float:
    """Like :func:`metric`, 0 when there is no such sample (a counter not yet touched)."""
    return sum(_samples(text, name, labels))


def alternates(ids: list[int]) -> bool:
    """The tiny dummy model's greedy output is a strict two-token cycle ABAB...: a token
    duplicated, dropped or reordered at a preemption boundary breaks it."""
    return len(ids) >= 2 and all(ids[i] == ids[i % 2] for i in range(len(ids))) and ids[0] != ids[1]
