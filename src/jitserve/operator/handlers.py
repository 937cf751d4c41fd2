"""kopf entry points. Each handler is a line or two: the work is in :mod:`reconcile`."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import kopf

from jitserve.operator import constants as c
from jitserve.operator.admission import WEBHOOK_ID, admission_problems
from jitserve.operator.autoscaler import Autoscaler
from jitserve.operator.builders import OperatorSettings
from jitserve.operator.kube import Kube, KubeError
from jitserve.operator.metrics import OperatorMetrics
from jitserve.operator.reconcile import Outcome, Scraper, reconcile

log = logging.getLogger("jitserve.operator")

POLICY = (c.GROUP, c.VERSION, c.PLURAL)
# Children whose changes (drift, rollout progress, deletion) re-reconcile their owner.
CHILDREN = (
    ("apps", "v1", "deployments"),
    ("", "v1", "configmaps"),
    ("", "v1", "services"),
    ("", "v1", "persistentvolumeclaims"),
    ("networking.k8s.io", "v1", "ingresses"),
    ("networking.k8s.io", "v1", "networkpolicies"),
)
MANAGED = {c.LABEL_MANAGED_BY: c.MANAGED_BY}


@dataclass(frozen=True)
class WebhookSettings:
    """Where the validating webhook listens, and its TLS certificate (PEM files)."""

    port: int
    certfile: str
    keyfile: str
    addr: str = "0.0.0.0"


class Controller:
    """Serialises reconciles per policy (kopf runs sync handlers in a thread pool)."""

    def __init__(
        self,
        kube: Kube,
        settings: OperatorSettings,
        scraper: Scraper | None = None,
        metrics: OperatorMetrics | None = None,
        autoscaler: Autoscaler | None = None,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.scraper = scraper or Scraper(timeout_s=settings.scrape_timeout_seconds)
        self.autoscaler = autoscaler or Autoscaler()
        self.metrics = metrics or OperatorMetrics()
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._known: set[tuple[str, str]] = set()

    def _lock(self, key: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def reconcile(self, namespace: str, name: str, *, scrape: bool = False) -> Outcome | None:
        with self._lock(f"{namespace}/{name}"):
            body = self.kube.get(c.API_VERSION, c.KIND, namespace, name)
            if body is None or body["metadata"].get("deletionTimestamp"):
                return None
            start = time.monotonic()
            try:
                out = reconcile(self.kube, body, self.settings, self.scraper if scrape else None,
                                autoscaler=self.autoscaler)
            except Exception:
                self.metrics.reconciles.labels("error").inc()
                raise
            self._observe(namespace, name, out, time.monotonic() - start)
        if out.writes:
            log.info("%s/%s: %s", namespace, name, "; ".join(out.writes))
        return out

    def _observe(self, namespace: str, name: str, out: Outcome, seconds: float) -> None:
        m = self.metrics
        m.reconcile_seconds.observe(seconds)
        m.reconciles.labels("invalid" if out.problems else "error" if out.errors else "ok").inc()
        for write in out.writes:
            verb, kind = write.split()[:2]
            m.writes.labels(kind, verb).inc()
        if out.scrape is not None and out.scrape.failed:
            m.scrape_failures.inc(out.scrape.failed)
        m.observe_status(namespace, name, out.status)

    def admit(self, operation: str, body: dict[str, Any], old: dict[str, Any] | None) -> None:
        """The validating webhook: raise kopf.AdmissionError naming each bad field."""
        problems = admission_problems(body, old, cel=self.settings.api_server_cel)
        result = "denied" if problems else "allowed"
        self.metrics.admissions.labels(operation, result).inc()
        if problems:
            raise kopf.AdmissionError("; ".join(problems), code=422)

    def owners_changed(self, child: dict[str, Any]) -> None:
        meta = child.get("metadata") or {}
        for owner in meta.get("ownerReferences") or []:
            if owner.get("apiVersion") == c.API_VERSION and owner.get("kind") == c.KIND:
                self.reconcile(str(meta["namespace"]), str(owner["name"]))

    def forget(self, namespace: str, name: str) -> None:
        self.scraper.forget(f"{namespace}/{name}")
        self.autoscaler.forget(f"{namespace}/{name}")

    # --- periodic resync (drift check + metrics scrape) ------------------------------------
    # A plain thread over the policies seen in watch events, not kopf timers: kopf puts a
    # finalizer on every object that has a timer, and then deleting a policy would hang
    # while the operator is down. Children go by ownerReference; no finalizer is needed.

    def track(self, namespace: str, name: str, *, present: bool) -> None:
        with self._guard:
            if present:
                self._known.add((namespace, name))
            else:
                self._known.discard((namespace, name))
        if not present:
            self.forget(namespace, name)
            self.metrics.forget(namespace, name)

    def known(self) -> list[tuple[str, str]]:
        with self._guard:
            return sorted(self._known)

    def resync_forever(self, stop: threading.Event) -> None:
        while not stop.wait(self.settings.status_interval_seconds):
            for namespace, name in self.known():
                if stop.is_set():
                    return
                try:
                    if self.reconcile(namespace, name, scrape=True) is None:
                        self.track(namespace, name, present=False)
                except Exception:  # keep resyncing the others
                    log.exception("resync of %s/%s failed", namespace, name)


def _raise_on_errors(out: Outcome | None) -> None:
    if out is not None and out.errors:
        raise kopf.TemporaryError("; ".join(out.errors), delay=5)


def make_registry(
    controller: Controller, webhook: WebhookSettings | None = None
) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=c.GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=c.GROUP, key="last-handled-configuration"
        )
        # No cluster-wide CRD/namespace watching: least privilege (the CRD must exist first).
        settings.scanning.disabled = True
        settings.posting.level = logging.WARNING
        settings.execution.max_workers = 8
        if webhook is not None:
            # The chart (or the user) owns the ValidatingWebhookConfiguration, not kopf.
            settings.admission.managed = None
            settings.admission.server = kopf.WebhookServer(
                addr=webhook.addr,
                port=webhook.port,
                certfile=webhook.certfile,
                pkeyfile=webhook.keyfile,
            )

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.resume(*POLICY, registry=registry)
    @kopf.on.create(*POLICY, registry=registry)
    @kopf.on.update(*POLICY, registry=registry)
    def policy_changed(namespace: str | None, name: str, **_: Any) -> None:
        _raise_on_errors(controller.reconcile(namespace or "", name))

    if webhook is not None:

        @kopf.on.validate(
            *POLICY, id=WEBHOOK_ID, operations=["CREATE", "UPDATE"], registry=registry
        )
        async def validate_policy(body: kopf.Body, **kwargs: Any) -> None:
            # async: kopf runs a sync handler in the thread pool that child events fill
            # with reconciles waiting on a policy's lock, and the API server gives up on
            # the webhook after its timeoutSeconds (5); admit() is pure and quick, so it
            # runs on the event loop and is answered at once.
            old = kwargs.get("old")
            operation = str(kwargs.get("operation") or "")
            controller.admit(operation, dict(body), dict(old) if old is not None else None)

    @kopf.on.event(*POLICY, registry=registry)
    def policy_seen(type: str | None, namespace: str | None, name: str, **_: Any) -> None:
        controller.track(namespace or "", name, present=type != "DELETED")

    stop = threading.Event()

    @kopf.on.startup(registry=registry)
    def start_resync(**_: Any) -> None:
        threading.Thread(
            target=controller.resync_forever, args=(stop,), name="jitserve-resync", daemon=True
        ).start()

    @kopf.on.cleanup(registry=registry)
    def stop_resync(**_: Any) -> None:
        stop.set()

    for group, version, plural in CHILDREN:

        @kopf.on.event(group, version, plural, labels=MANAGED, registry=registry)
        def child_event(body: kopf.Body, **_: Any) -> None:
            try:
                controller.owners_changed(dict(body))
            except KubeError as err:
                log.warning("child event: %s", err)

    return registry
