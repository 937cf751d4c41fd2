"""An in-memory stand-in for the API server, enough for the reconciler's unit tests.

Like the real server it assigns uid/resourceVersion/generation, adds a few defaults the
reconciler must tolerate (so "unchanged" is judged the way it is against a cluster), does
not bump resourceVersion for an update that changes nothing, and emulates server-side
apply's removal of fields the manager applied before and no longer applies.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

from jitserve.operator.kube import KubeError

JSON = dict[str, Any]
_counter = itertools.count(1)
SERVED = "tiny-llama"  # the tiny model's served name (jitserve.devstack.tinymodel)


def serving(spec: JSON | None = None) -> JSON:
    """``spec`` with the one field a serving policy must set, ``model.name``, if absent."""
    doc = copy.deepcopy(spec or {})
    model = doc.get("model")
    if isinstance(model, dict) or model is None:
        doc["model"] = {"name": SERVED, **(model or {})}
    return doc


def _server_defaults(obj: JSON) -> None:
    if obj["kind"] == "Deployment":
        spec = obj["spec"]
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("progressDeadlineSeconds", 600)
        pod = spec["template"]["spec"]
        pod.setdefault("restartPolicy", "Always")
        pod.setdefault("dnsPolicy", "ClusterFirst")
        for container in pod["containers"]:
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                if probe in container:
                    container[probe].setdefault("timeoutSeconds", 1)
                    container[probe].setdefault("successThreshold", 1)
        for volume in pod.get("volumes", []):
            if "configMap" in volume:
                volume["configMap"].setdefault("defaultMode", 420)
    if obj["kind"] == "Service":
        obj["spec"].setdefault("clusterIP", f"10.0.0.{next(_counter) % 250}")
        obj["spec"].setdefault("sessionAffinity", "None")


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str, str], JSON] = {}
        self.writes: list[str] = []
        self.fail_kinds: set[str] = set()
        self.applied: dict[tuple[str, str, str, str], JSON] = {}

    @staticmethod
    def _key(obj: JSON) -> tuple[str, str, str, str]:
        m = obj["metadata"]
        return obj["apiVersion"], obj["kind"], m["namespace"], m["name"]

    def add(self, obj: JSON) -> JSON:
        """Put an object in without counting a write (a test's own setup)."""
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        meta.setdefault("uid", f"uid-{next(_counter)}")
        meta["resourceVersion"] = str(next(_counter))
        meta.setdefault("generation", 1)
        _server_defaults(obj)
        self.objects[self._key(obj)] = obj
        return copy.deepcopy(obj)

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> JSON | None:
        obj = self.objects.get((api_version, kind, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def list(self, api_version: str, kind: str, namespace: str, selector: str = "") -> list[JSON]:
        wanted = dict(p.split("=", 1) for p in selector.split(",") if p)
        out = []
        for (av, k, ns, _), obj in sorted(self.objects.items()):
            labels = obj["metadata"].get("labels") or {}
            if (av, k, ns) == (api_version, kind, namespace) and all(
                labels.get(a) == b for a, b in wanted.items()
            ):
                out.append(copy.deepcopy(obj))
        return out

    def _check(self, kind: str) -> None:
        if kind in self.fail_kinds:
            raise KubeError(500, f"injected failure for {kind}")

    def create(self, obj: JSON) -> JSON:
        self._check(obj["kind"])
        meta = obj["metadata"]
        if "name" not in meta and "generateName" in meta:  # as the API server names it
            obj = {**obj, "metadata": {**meta, "name": f"{meta['generateName']}{next(_counter)}"}}
        if self._key(obj) in self.objects:
            raise KubeError(409, "already exists")
        self.writes.append(f"create {obj['kind']}")
        return self.add(obj)

    def apply(self, obj: JSON) -> JSON:
        """Server-side apply, simplified: our fields overwrite (lists whole), fields we
        applied last time and dropped now are removed, others' fields stay."""
        self._check(obj["kind"])
        key = self._key(obj)
        desired = copy.deepcopy(obj)
        live = self.objects.get(key)
        self.writes.append(f"apply {obj['kind']}")
        previous = self.applied.get(key, {})
        self.applied[key] = copy.deepcopy(desired)
        if live is None:
            return self.add(desired)
        new = copy.deepcopy(live)
        _remove_dropped(new, previous, desired)
        _merge(new, desired)
        _keep_live_order(new["metadata"], live["metadata"], "ownerReferences", "uid")
        _server_defaults(new)
        if new != live:
            if new.get("spec") != live.get("spec"):
                new["metadata"]["generation"] = live["metadata"].get("generation", 1) + 1
            new["metadata"]["resourceVersion"] = str(next(_counter))
        self.objects[key] = new
        return copy.deepcopy(new)

    def merge_patch(
        self, api_version: str, kind: str, namespace: str, name: str, patch: JSON
    ) -> JSON:
        self._check(kind)
        key = (api_version, kind, namespace, name)
        live = self.objects[key]
        _merge(live, copy.deepcopy(patch))
        live["metadata"]["resourceVersion"] = str(next(_counter))
        self.writes.append(f"patch {kind}")
        return copy.deepcopy(live)

    def patch_status(
        self, api_version: str, kind: str, namespace: str, name: str, status: JSON
    ) -> JSON:
        live = self.objects[(api_version, kind, namespace, name)]
        live.setdefault("status", {})
        _merge(live["status"], copy.deepcopy(status))
        self.writes.append(f"status {kind}")
        return copy.deepcopy(live)

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        self.objects.pop((api_version, kind, namespace, name), None)
        self.writes.append(f"delete {kind}")


def _merge(target: JSON, patch: JSON) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = value


def _remove_dropped(target: JSON, previous: JSON, desired: JSON) -> None:
    """Remove from ``target`` the keys ``previous`` had and ``desired`` no longer has."""
    for key, value in previous.items():
        if key not in desired:
            target.pop(key, None)
        elif (
            isinstance(value, dict)
            and isinstance(desired[key], dict)
            and isinstance(target.get(key), dict)
        ):
            _remove_dropped(target[key], value, desired[key])


def _keep_live_order(target: JSON, live: JSON, field: str, key: str) -> None:
    """What the API server does with an applied list merged item by item: the live items
    keep their order, new ones come after them."""
    before = [item[key] for item in live.get(field) or []]
    if field in target:
        target[field] = sorted(
            target[field],
            key=lambda item: before.index(item[key]) if item[key] in before else len(before),
        )
