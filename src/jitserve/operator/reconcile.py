"""Level-based reconciliation of one SLOPolicy: make the children match the spec.

Idempotent by construction: each desired child is compared with the live one
(:func:`is_subset`: every field we set must be there with the same value; fields the
API server defaults or others add are ignored) and written only when it differs, so a
second reconcile of an unchanged policy writes nothing, a child edited by someone else
is put back, and an operator killed half-way converges on its next run.
"""

from __future__ import annotations

import contextlib
import copy
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from jitserve.operator import builders as b
from jitserve.operator import constants as c
from jitserve.operator import status as st
from jitserve.operator.kube import JSON, Kube, KubeError
from jitserve.policy import PolicyError, SLOPolicySpec, load_policy


def _quantity(value: str) -> Any:
    from kubernetes.utils.quantity import parse_quantity

    return parse_quantity(value)  # type: ignore[no-untyped-call]


def _same_scalar(desired: Any, live: Any) -> bool:
    if desired == live:
        return True
    if isinstance(desired, str) and isinstance(live, str | int | float):
        try:
            return bool(_quantity(desired) == _quantity(str(live)))
        except (ValueError, ArithmeticError):
            return False
    return False


def is_subset(desired: Any, live: Any) -> bool:
    """Every field in ``desired`` is in ``live`` with an equal value (lists: same length;
    quantities compared by value; an empty map or list matches an absent field)."""
    if isinstance(desired, dict):
        if not isinstance(live, dict):
            return False
        # The API server drops empty maps and lists of typed objects: absent == empty.
        return all(
            is_subset(v, live[k]) if k in live else v in ({}, [], None) for k, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(live, list)
            and len(desired) == len(live)
            and all(is_subset(d, x) for d, x in zip(desired, live, strict=True))
        )
    return _same_scalar(desired, live)


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Outcome:
    """What one reconcile did and saw."""

    writes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    deployment: JSON | None = None
    status_written: bool = False


def spec_problems(body: JSON) -> tuple[SLOPolicySpec | None, list[str]]:
    """Validate the policy: name rules, the pydantic model, cross-field rules."""
    problems = b.name_problems(str(body["metadata"]["name"]))
    try:
        spec = load_policy(body.get("spec") or {})
    except PolicyError as err:
        return None, [*problems, *(f"spec.{p.strip()}" for p in str(err).split("; "))]
    problems += [f"spec.{p}" for p in spec.cross_field_problems()]
    return (None if problems else spec), problems


def _merged_metadata(desired: JSON, live: JSON) -> JSON:
    meta: JSON = copy.deepcopy(live["metadata"])
    want = desired["metadata"]
    meta["labels"] = {**(meta.get("labels") or {}), **want.get("labels", {})}
    if want.get("annotations"):
        meta["annotations"] = {**(meta.get("annotations") or {}), **want["annotations"]}
    meta["ownerReferences"] = want["ownerReferences"]
    return meta


def _replacement(desired: JSON, live: JSON) -> JSON:
    """``desired`` as a full replacement of ``live``: its metadata, server-owned fields kept."""
    obj = copy.deepcopy(desired)
    obj["metadata"] = _merged_metadata(desired, live)
    if desired["kind"] == "Service":
        for key in (
            "clusterIP",
            "clusterIPs",
            "ipFamilies",
            "ipFamilyPolicy",
            "healthCheckNodePort",
        ):
            if key in live.get("spec", {}):
                obj["spec"][key] = live["spec"][key]
    return obj


def ensure(kube: Kube, desired: JSON, out: Outcome) -> JSON:
    """Create ``desired`` or bring the live object back to it; write only on a difference."""
    api_version, kind = desired["apiVersion"], desired["kind"]
    namespace, name = desired["metadata"]["namespace"], desired["metadata"]["name"]
    live = kube.get(api_version, kind, namespace, name)
    if live is None:
        try:
            created = kube.create(desired)
            out.writes.append(f"create {kind} {namespace}/{name}")
            return created
        except KubeError as err:
            if err.status != 409:
                raise
            live = kube.get(api_version, kind, namespace, name)
            if live is None:
                raise
    if kind == "PersistentVolumeClaim":
        # A claim's spec is immutable once bound: only keep its labels and owners right.
        want = {"metadata": {k: desired["metadata"][k] for k in ("labels", "ownerReferences")}}
        if is_subset(want, live):
            return live
        patched = kube.merge_patch(api_version, kind, namespace, name, want)
        out.writes.append(f"patch {kind} {namespace}/{name}")
        return patched
    if is_subset(desired, live):
        return live
    replaced = kube.replace(_replacement(desired, live))
    out.writes.append(f"replace {kind} {namespace}/{name}")
    return replaced


def _policy_ref(body: JSON) -> b.PolicyRef:
    meta = body["metadata"]
    return b.PolicyRef(
        name=str(meta["name"]), namespace=str(meta["namespace"]), uid=str(meta["uid"])
    )


def _remove_stale_ingress(kube: Kube, ref: b.PolicyRef, out: Outcome) -> None:
    live = kube.get("networking.k8s.io/v1", "Ingress", ref.namespace, ref.name)
    if live is None:
        return
    owners = live.get("metadata", {}).get("ownerReferences") or []
    if any(o.get("uid") == ref.uid and o.get("controller") for o in owners):
        kube.delete("networking.k8s.io/v1", "Ingress", ref.namespace, ref.name)
        out.writes.append(f"delete Ingress {ref.namespace}/{ref.name}")


def ensure_analyzer(kube: Kube, namespace: str, settings: b.OperatorSettings, out: Outcome) -> None:
    """The namespace's analyzer, owned by every live SLOPolicy there."""
    policies = kube.list(c.API_VERSION, c.KIND, namespace)
    owners = [
        _policy_ref(p) for p in policies if not p.get("metadata", {}).get("deletionTimestamp")
    ]
    if not owners:
        return
    for obj in b.build_analyzer_children(namespace, owners, settings):
        ensure(kube, obj, out)


def tenant_keys(kube: Kube, namespace: str, spec: SLOPolicySpec, out: Outcome) -> dict[str, str]:
    """``api-key`` of each tenant's Secret (base64, as stored); a missing one is an error."""
    keys: dict[str, str] = {}
    for index, tenant in enumerate(spec.fairness.tenants):
        name = tenant.api_key_secret
        if not name:
            continue
        secret = kube.get("v1", "Secret", namespace, name)
        value = ((secret or {}).get("data") or {}).get("api-key")
        if value is None:
            what = "not found" if secret is None else "has no key 'api-key'"
            out.errors.append(f"spec.fairness.tenants[{index}].apiKeySecret: Secret {name} {what}")
            continue
        keys[name] = str(value)
    return keys


def reconcile_children(kube: Kube, body: JSON, settings: b.OperatorSettings) -> Outcome:
    """Apply the policy's children (and the shared analyzer). Writes only differences."""
    out = Outcome()
    ref = _policy_ref(body)
    spec, out.problems = spec_problems(body)
    if spec is None:
        # Invalid spec: leave the running children alone, report Degraded.
        out.deployment = kube.get("apps/v1", "Deployment", ref.namespace, ref.name)
        return out
    try:
        keys = tenant_keys(kube, ref.namespace, spec, out)
        for child in b.build_policy_children(ref, spec, settings, keys):
            live = ensure(kube, child, out)
            if child["kind"] == "Deployment":
                out.deployment = live
        if spec.ingress is None:
            _remove_stale_ingress(kube, ref, out)
        ensure_analyzer(kube, ref.namespace, settings, out)
    except KubeError as err:
        out.errors.append(err.message)
        if out.deployment is None:
            with contextlib.suppress(KubeError):
                out.deployment = kube.get("apps/v1", "Deployment", ref.namespace, ref.name)
    return out


# --- metrics -----------------------------------------------------------------------------

Fetch = Callable[[str, float], str]


def http_fetch(url: str, timeout_s: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        body: bytes = response.read()
    return body.decode()


def metrics_targets(kube: Kube, body: JSON, spec_port: int) -> list[str]:
    """``/metrics`` URLs of the policy's running pods (pod IP and the sidecar port)."""
    ref = _policy_ref(body)
    pods = kube.list("v1", "Pod", ref.namespace, b.selector_string(ref.name))
    urls = []
    for pod in pods:
        status = pod.get("status") or {}
        ip = status.get("podIP")
        if status.get("phase") == "Running" and ip and not pod["metadata"].get("deletionTimestamp"):
            host = f"[{ip}]" if ":" in str(ip) else str(ip)
            urls.append(f"http://{host}:{spec_port}/metrics")
    return sorted(urls)


@dataclass
class Scraper:
    """Reads the sidecars' metrics and remembers the last goodput totals per target."""

    fetch: Fetch = http_fetch
    timeout_s: float = 2.0
    clock: Callable[[], float] = time.monotonic
    _last: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)

    def scrape(self, key: str, urls: list[str]) -> tuple[list[st.SidecarSample], float | None]:
        samples: list[st.SidecarSample] = []
        totals: dict[str, tuple[float, float]] = {}
        for url in urls:
            try:
                sample = st.parse_metrics(self.fetch(url, self.timeout_s))
            except (OSError, ValueError):
                continue
            samples.append(sample)
            totals[url] = (self.clock(), sample.goodput_tokens)
        rate = st.goodput_rate(self._last.get(key, {}), totals)
        self._last[key] = totals
        return samples, rate

    def forget(self, key: str) -> None:
        self._last.pop(key, None)


def reconcile(
    kube: Kube,
    body: JSON,
    settings: b.OperatorSettings,
    scraper: Scraper | None = None,
    now: str | None = None,
) -> Outcome:
    """Children, then status (written only when it changed). ``scraper``: also read metrics."""
    out = reconcile_children(kube, body, settings)
    ref = _policy_ref(body)
    samples: list[st.SidecarSample] | None = None
    rate: float | None = None
    if scraper is not None:
        spec, _ = spec_problems(body)
        port = spec.sidecar.port if spec is not None else SLOPolicySpec().sidecar.port
        try:
            urls = metrics_targets(kube, body, port)
        except KubeError as err:
            out.errors.append(err.message)
            urls = []
        samples, rate = scraper.scrape(f"{ref.namespace}/{ref.name}", urls)
    old = body.get("status") or {}
    new = st.build_status(
        old_status=old,
        generation=int(body["metadata"].get("generation", 0)),
        problems=out.problems,
        errors=out.errors,
        deployment=out.deployment,
        selector=b.selector_string(ref.name),
        samples=samples,
        goodput_per_s=rate,
        now=now or now_iso(),
    )
    patch = st.status_patch(old, new)
    if patch is not None:
        kube.patch_status(c.API_VERSION, c.KIND, ref.namespace, ref.name, patch)
        out.status_written = True
    return out
