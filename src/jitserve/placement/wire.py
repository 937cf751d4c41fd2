"""The replica report on the wire (owner: gateway): the JSON a sidecar serves as
``GET /v1/replica`` on its admin port, and its reading back into a
:class:`~jitserve.placement.base.ReplicaReport`.

Pure: no I/O. :func:`report_from_json` trusts nothing it reads (a report crosses the
network): every field is checked for type and range and a bad one raises
``ValueError`` naming it (``replica report: waiting_by_kind.latency: ...``). Fields the
reader does not know are ignored, and fields a newer :class:`ReplicaReport` added with a
default may be absent, so a gateway and a sidecar of different versions still talk.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from jitserve.placement.base import ReplicaReport
from jitserve.slo import SLOKind

MAX_PROGRAMS = 100_000
"""A report listing more programs than this is refused (a sidecar caps its programs
far below; a bigger list is a fault or an attack on the gateway's memory)."""


def report_to_json(report: ReplicaReport) -> dict[str, Any]:
    return {
        "replica": report.replica,
        "ready": report.ready,
        "at_s": report.at_s,
        "max_running": report.max_running,
        "running": report.running,
        "waiting": report.waiting,
        "waiting_by_kind": {kind.value: n for kind, n in report.waiting_by_kind.items()},
        "admit_priority": report.admit_priority,
        "decode_s": report.decode_s,
        "prefill_s": report.prefill_s,
        "tokens_per_s": report.tokens_per_s,
        "kv_usage": report.kv_usage,
        "outstanding_tokens": report.outstanding_tokens,
        "programs": sorted(report.programs),
        "shedding": report.shedding,
        "token_s": report.token_s,
        "prefill_tokens": report.prefill_tokens,
    }


def _error(name: str, message: str) -> ValueError:
    return ValueError(f"replica report: {name}: {message}")


def _int(doc: Mapping[str, Any], name: str, default: int | None = None) -> int:
    value = doc.get(name, default)
    if value is None:
        raise _error(name, "missing")
    if isinstance(value, bool) or not isinstance(value, int):
        raise _error(name, f"must be an integer, got {value!r:.40}")
    if value < 0:
        raise _error(name, f"must be >= 0, got {value}")
    return value


def _float(doc: Mapping[str, Any], name: str, default: float | None = None,
           upper: float = math.inf) -> float:
    value = doc.get(name, default)
    if value is None:
        raise _error(name, "missing")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _error(name, f"must be a number, got {value!r:.40}")
    number = float(value)
    if not math.isfinite(number) or number < 0 or number > upper:
        raise _error(name, f"must be a finite number in [0, {upper:g}], got {value!r:.40}")
    return number


def _bool(doc: Mapping[str, Any], name: str, default: bool | None = None) -> bool:
    value = doc.get(name, default)
    if not isinstance(value, bool):
        shown = "missing" if value is None else f"must be true or false, got {value!r:.40}"
        raise _error(name, shown)
    return value


def _by_kind(doc: Mapping[str, Any]) -> dict[SLOKind, int]:
    raw = doc.get("waiting_by_kind", {})
    if not isinstance(raw, dict):
        raise _error("waiting_by_kind", "must be an object of SLO kind -> count")
    out: dict[SLOKind, int] = {}
    for key, _ in raw.items():
        try:
            kind = SLOKind(key)
        except ValueError:
            known = ", ".join(k.value for k in SLOKind)
            raise _error(f"waiting_by_kind.{key!s:.40}", f"not an SLO kind ({known})") from None
        out[kind] = _int(raw, key)
    return out


def _programs(doc: Mapping[str, Any]) -> frozenset[str]:
    raw = doc.get("programs", [])
    if not isinstance(raw, list):
        raise _error("programs", "must be a list of program keys")
    if len(raw) > MAX_PROGRAMS:
        raise _error("programs", f"more than {MAX_PROGRAMS} entries")
    if not all(isinstance(p, str) for p in raw):
        raise _error("programs", "every entry must be a string")
    return frozenset(raw)


def report_from_json(doc: Any) -> ReplicaReport:
    """A report from its decoded JSON; raises ``ValueError`` naming the first bad field."""
    if not isinstance(doc, dict):
        raise _error("body", "must be a JSON object")
    replica = doc.get("replica")
    if not isinstance(replica, str) or not replica:
        raise _error("replica", "must be a non-empty string (host:port)")
    return ReplicaReport(
        replica=replica,
        ready=_bool(doc, "ready"),
        at_s=_float(doc, "at_s"),
        max_running=_int(doc, "max_running"),
        running=_int(doc, "running"),
        waiting=_int(doc, "waiting"),
        waiting_by_kind=_by_kind(doc),
        admit_priority=_float(doc, "admit_priority", 0.0),
        decode_s=_float(doc, "decode_s", 0.03),
        prefill_s=_float(doc, "prefill_s", 1e-4),
        tokens_per_s=_float(doc, "tokens_per_s", 0.0),
        kv_usage=_float(doc, "kv_usage", 0.0, upper=1.0),
        outstanding_tokens=_int(doc, "outstanding_tokens", 0),
        programs=_programs(doc),
        shedding=_bool(doc, "shedding", False),
        token_s=_float(doc, "token_s", 1e-4),
        prefill_tokens=_int(doc, "prefill_tokens", 0),
    )
