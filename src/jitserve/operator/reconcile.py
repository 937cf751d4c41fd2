"""Level-based reconciliation of one SLOPolicy: make the children match the spec.

Children are written with server-side apply (field manager ``jitserve-operator``): the
API server merges our fields, keeps what others own, and removes fields we applied
before but no longer want (a dropped Ingress annotation, a removed toleration). Each
applied object carries a hash of what we applied; a child whose live state contains
every field we set (:func:`is_subset`) and the same hash is left alone, so a second
reconcile of an unchanged policy writes nothing, a child edited by someone else is put
back, and an operator killed half-way converges on its next run.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from jitserve.operator import analyzer_builders as ab
from jitserve.operator import builders as b
from jitserve.operator import constants as c
from jitserve.operator import events
from jitserve.operator import gateway_builders as gb
from jitserve.operator import sidecar_metrics as sm
from jitserve.operator import status as st
from jitserve.operator.autoscaler import Autoscaler, autoscale
from jitserve.operator.fairness_status import fairness_status
from jitserve.operator.kube import JSON, Kube, KubeError
from jitserve.operator.routing import policy_url
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
    """Every field in ``desired`` is in ``live`` with an equal value (lists: same length,
    items matched by their merge key or else by position; quantities compared by value;
    an empty map or list matches an absent field)."""
    if isinstance(desired, dict):
        if not isinstance(live, dict):
            return False
        # The API server drops empty maps and lists of typed objects: absent == empty.
        return all(
            is_subset(v, live[k]) if k in live else v in ({}, [], None) for k, v in desired.items()
        )
    if isinstance(desired, list):
        if not isinstance(live, list) or len(desired) != len(live):
            return False
        key = _merge_key(desired)
        if key is not None and _merge_key(live) == key:
            by_key = {x[key]: x for x in live}
            return all(d[key] in by_key and is_subset(d, by_key[d[key]]) for d in desired)
        return all(is_subset(d, x) for d, x in zip(desired, live, strict=True))
    return _same_scalar(desired, live)


def _merge_key(items: list[Any]) -> str | None:
    """``uid`` or ``name`` when every item is an object with a distinct one: a list the
    API server merges item by item (ownerReferences, containers, env, volumes). Server-side
    apply keeps such a list in its live order and appends new items, so an order other
    than ours is not drift (two policies' analyzer owners, sorted by uid, were re-applied
    by every reconcile when the newer policy's uid sorted first)."""
    for key in ("uid", "name"):
        values = [i[key] for i in items if isinstance(i, dict) and isinstance(i.get(key), str)]
        if len(values) == len(items) and len(set(values)) == len(values):
            return key
    return None


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Outcome:
    """What one reconcile did and saw."""

    writes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    deployment: JSON | None = None
    gateway: JSON | None = None
    """The live gateway Deployment (more than one pod)."""
    gateway_wanted: bool = False
    pods: list[JSON] | None = None
    """The serving pods (None: they could not be listed)."""
    status_written: bool = False
    scrape: Scrape | None = None
    status: JSON = field(default_factory=dict)


def spec_problems(body: JSON, *, cel: bool = False) -> tuple[SLOPolicySpec | None, list[str]]:
    """Validate the policy: name rules, the pydantic model, cross-field rules.

    ``cel``: the API server has already evaluated the CRD's CEL rules, so only what they
    cannot say is checked (the webhook on Kubernetes >= 1.25)."""
    problems = [] if cel else b.name_problems(str(body["metadata"]["name"]))
    try:
        spec = load_policy(body.get("spec") or {})
    except PolicyError as err:
        return None, [*problems, *(f"spec.{p.strip()}" for p in str(err).split("; "))]
    rules = spec.webhook_problems() if cel else spec.cross_field_problems()
    problems += [f"spec.{p}" for p in rules]
    return (None if problems else spec), problems


APPLIED_HASH = f"{c.GROUP}/applied-hash"


def applied_hash(desired: JSON) -> str:
    """A short digest of an object as the operator applies it."""
    text = json.dumps(desired, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _keep_claim_spec(desired: JSON, live: JSON) -> JSON:
    """A claim's spec is immutable once made: apply the live values of the fields we set
    (so we keep owning them) and only our metadata."""
    obj = copy.deepcopy(desired)
    live_spec = live.get("spec") or {}
    obj["spec"] = {k: copy.deepcopy(live_spec[k]) for k in desired["spec"] if k in live_spec}
    if "resources" in obj["spec"]:
        requests = (live_spec.get("resources") or {}).get("requests") or {}
        obj["spec"]["resources"] = {"requests": {"storage": requests.get("storage")}}
    return obj


def ensure(kube: Kube, desired: JSON, out: Outcome) -> JSON:
    """Server-side apply ``desired`` unless the live object already matches it."""
    kind = desired["kind"]
    namespace, name = desired["metadata"]["namespace"], desired["metadata"]["name"]
    live = kube.get(desired["apiVersion"], kind, namespace, name)
    if kind == "PersistentVolumeClaim" and live is not None:
        desired = _keep_claim_spec(desired, live)
    obj = copy.deepcopy(desired)
    meta = obj["metadata"]
    meta["annotations"] = {**(meta.get("annotations") or {}), APPLIED_HASH: applied_hash(desired)}
    if live is not None and is_subset(obj, live):
        return live
    applied = kube.apply(obj)
    out.writes.append(f"{'create' if live is None else 'apply'} {kind} {namespace}/{name}")
    return applied


def _policy_ref(body: JSON) -> b.PolicyRef:
    meta = body["metadata"]
    return b.PolicyRef(
        name=str(meta["name"]), namespace=str(meta["namespace"]), uid=str(meta["uid"])
    )


def _remove_stale(kube: Kube, ref: b.PolicyRef, api_version: str, kind: str, name: str,
                  out: Outcome) -> None:
    """Delete a child the spec no longer asks for, if this policy controls it."""
    live = kube.get(api_version, kind, ref.namespace, name)
    if live is None:
        return
    owners = live.get("metadata", {}).get("ownerReferences") or []
    if any(o.get("uid") == ref.uid and o.get("controller") for o in owners):
        kube.delete(api_version, kind, ref.namespace, name)
        out.writes.append(f"delete {kind} {ref.namespace}/{name}")


def ensure_analyzer(kube: Kube, namespace: str, settings: b.OperatorSettings, out: Outcome) -> None:
    """The namespace's analyzer, owned by every live SLOPolicy there."""
    policies = kube.list(c.API_VERSION, c.KIND, namespace)
    owners = [
        _policy_ref(p) for p in policies if not p.get("metadata", {}).get("deletionTimestamp")
    ]
    if not owners:
        return
    for obj in ab.build_analyzer_children(namespace, owners, settings):
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
        out.gateway_wanted = b.uses_gateway(spec.replicas)
        for child in b.build_policy_children(ref, spec, settings, keys):
            live = ensure(kube, child, out)
            if child["kind"] == "Deployment":
                if child["metadata"]["name"] == ref.name:
                    out.deployment = live
                else:
                    out.gateway = live
        if spec.ingress is None:
            _remove_stale(kube, ref, "networking.k8s.io/v1", "Ingress", ref.name, out)
        if not out.gateway_wanted:
            for api_version, kind, name in gb.gateway_children_ids(ref):
                _remove_stale(kube, ref, api_version, kind, name, out)
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


def metrics_targets(pods: list[JSON], spec_port: int) -> dict[str, str]:
    """The ``/metrics`` URL of each of the policy's running pods, by pod name (pod IP and
    the sidecar's admin port, which needs no key even with tenant keys on)."""
    urls = {}
    for pod in pods:
        status = pod.get("status") or {}
        ip = status.get("podIP")
        if status.get("phase") == "Running" and ip and not pod["metadata"].get("deletionTimestamp"):
            host = f"[{ip}]" if ":" in str(ip) else str(ip)
            urls[pod["metadata"]["name"]] = f"http://{host}:{spec_port}/metrics"
    return urls


@dataclass
class Scrape:
    """What one scrape of a policy's sidecars gave."""

    samples: list[sm.SidecarSample]
    goodput_per_s: float | None
    recent: tuple[sm.Outcomes, float]
    tenants: sm.Outcomes = field(default_factory=dict)
    """(tenant, "demand" | "goodput") -> tokens over the same window as ``recent``."""
    failed: int = 0
    by_pod: dict[str, sm.SidecarSample] = field(default_factory=dict)
    """Each scraped pod's sample, by pod name."""


@dataclass
class Scraper:
    """Reads the sidecars' metrics; remembers the last goodput totals and the outcome
    history (for attainment over the recent window) per policy."""

    fetch: Fetch = http_fetch
    timeout_s: float = 2.0
    clock: Callable[[], float] = time.monotonic
    _last: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)
    _history: dict[str, sm.OutcomeHistory] = field(default_factory=dict)
    _tenants: dict[str, sm.OutcomeHistory] = field(default_factory=dict)

    def scrape(self, key: str, targets: Mapping[str, str], window_s: float = 300.0) -> Scrape:
        """Scrape ``targets`` (pod name -> its ``/metrics`` URL) of the policy ``key``."""
        samples: list[sm.SidecarSample] = []
        totals: dict[str, tuple[float, float]] = {}
        outcomes: dict[str, sm.Outcomes] = {}
        tenants: dict[str, sm.Outcomes] = {}
        by_pod: dict[str, sm.SidecarSample] = {}
        failed = 0
        t = self.clock()
        for pod, url in sorted(targets.items()):
            try:
                sample = sm.parse_metrics(self.fetch(url, self.timeout_s))
            except (OSError, ValueError):
                failed += 1
                continue
            samples.append(sample)
            by_pod[pod] = sample
            totals[pod] = (t, sample.goodput_tokens)
            outcomes[pod] = sample.outcomes
            tenants[pod] = sample.tenants
        rate = sm.goodput_rate(self._last.get(key, {}), totals)
        self._last[key] = totals
        history = self._history.setdefault(key, sm.OutcomeHistory())
        history.add(t, outcomes, window_s)
        by_tenant = self._tenants.setdefault(key, sm.OutcomeHistory())
        by_tenant.add(t, tenants, window_s)
        return Scrape(samples, rate, history.recent(), by_tenant.recent()[0], failed, by_pod)

    def forget(self, key: str) -> None:
        self._last.pop(key, None)
        self._history.pop(key, None)
        self._tenants.pop(key, None)


def reconcile(
    kube: Kube,
    body: JSON,
    settings: b.OperatorSettings,
    scraper: Scraper | None = None,
    now: str | None = None,
    autoscaler: Autoscaler | None = None,
) -> Outcome:
    """Children, then status (written only when it changed). ``scraper``: also read
    metrics; ``autoscaler``: with a scrape, also size the pool (``spec.autoscaling``)."""
    out = reconcile_children(kube, body, settings)
    ref = _policy_ref(body)
    try:
        out.pods = kube.list("v1", "Pod", ref.namespace, b.selector_string(ref.name))
    except KubeError as err:
        out.errors.append(err.message)
    scrape: Scrape | None = None
    valid, _ = spec_problems(body)
    spec = valid or SLOPolicySpec()
    if scraper is not None:
        targets = metrics_targets(out.pods or [], spec.sidecar.admin_port)
        window = spec.reporting.attainment_window_seconds
        scrape = scraper.scrape(f"{ref.namespace}/{ref.name}", targets, window)
        out.scrape = scrape
    scaled: JSON | None = None
    if autoscaler is not None and scrape is not None and valid is not None:
        try:
            scaled, write = autoscale(kube, body, valid.autoscaling, valid.replicas, autoscaler,
                                      out.pods or [], scrape.by_pod, now or now_iso())
        except KubeError as err:
            out.errors.append(err.message)
        else:
            out.writes += [write] if write else []
    old = body.get("status") or {}
    new = st.build_status(
        old_status=old,
        generation=int(body["metadata"].get("generation", 0)),
        problems=out.problems,
        errors=out.errors,
        deployment=out.deployment,
        selector=b.selector_string(ref.name),
        samples=None if scrape is None else scrape.samples,
        goodput_per_s=None if scrape is None else scrape.goodput_per_s,
        now=now or now_iso(),
        recent=None if scrape is None else scrape.recent,
        fairness=None if scrape is None else fairness_status(
            scrape.tenants, spec.fairness,
            [s.fairness_weight for s in scrape.samples if s.fairness_weight is not None]),
        pods=out.pods,
        gateway=out.gateway,
        gateway_wanted=out.gateway_wanted,
        url=policy_url(ref, valid) if valid is not None else old.get("url"),
        autoscaling=scaled,
    )
    out.status = new
    patch = st.status_patch(old, new)
    if patch is not None:
        kube.patch_status(c.API_VERSION, c.KIND, ref.namespace, ref.name, patch)
        out.status_written = True
        events.post(kube, body, events.changes(old, new), now or now_iso())
    return out
