"""A small typed client for the few resources the operator touches (dicts in, dicts out).

:class:`Kube` is the interface the reconciler uses; :class:`RestKube` talks to an API
server through the official ``kubernetes`` client's configuration, auth and HTTP layer;
tests use an in-memory fake of the same interface.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from typing import Any, Protocol

from jitserve.operator import constants as c

JSON = dict[str, Any]
APPLY_PATCH = "application/apply-patch+yaml"

# (apiVersion, kind) -> (path prefix, plural)
RESOURCES: dict[tuple[str, str], tuple[str, str]] = {
    ("v1", "ConfigMap"): ("/api/v1", "configmaps"),
    ("v1", "Service"): ("/api/v1", "services"),
    ("v1", "PersistentVolumeClaim"): ("/api/v1", "persistentvolumeclaims"),
    ("v1", "Pod"): ("/api/v1", "pods"),
    ("v1", "Secret"): ("/api/v1", "secrets"),
    ("v1", "Event"): ("/api/v1", "events"),
    ("apps/v1", "Deployment"): ("/apis/apps/v1", "deployments"),
    ("networking.k8s.io/v1", "Ingress"): ("/apis/networking.k8s.io/v1", "ingresses"),
    ("networking.k8s.io/v1", "NetworkPolicy"): ("/apis/networking.k8s.io/v1", "networkpolicies"),
    (c.API_VERSION, c.KIND): (f"/apis/{c.API_VERSION}", c.PLURAL),
}


class KubeError(Exception):
    """An API call failed; ``status`` is the HTTP status (0: no response)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class Kube(Protocol):
    def get(self, api_version: str, kind: str, namespace: str, name: str) -> JSON | None: ...

    def list(
        self, api_version: str, kind: str, namespace: str, selector: str = ""
    ) -> list[JSON]: ...

    def create(self, obj: JSON) -> JSON: ...

    def apply(self, obj: JSON) -> JSON:
        """Server-side apply of ``obj`` as the operator's field manager (forced)."""
        ...

    def merge_patch(
        self, api_version: str, kind: str, namespace: str, name: str, patch: JSON
    ) -> JSON: ...

    def patch_status(
        self, api_version: str, kind: str, namespace: str, name: str, status: JSON
    ) -> JSON: ...

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None: ...


def resource_path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    try:
        prefix, plural = RESOURCES[(api_version, kind)]
    except KeyError:
        raise KubeError(0, f"unsupported resource {api_version} {kind}") from None
    path = f"{prefix}/namespaces/{namespace}/{plural}"
    return f"{path}/{name}" if name else path


def _ident(obj: JSON) -> tuple[str, str, str, str]:
    meta = obj["metadata"]
    return obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"]


class RestKube:
    """:class:`Kube` over the ``kubernetes`` package's ApiClient (kubeconfig or in-cluster)."""

    def __init__(self, api_client: Any, timeout_s: float = 30.0) -> None:
        self._api = api_client
        self._timeout = timeout_s

    @classmethod
    def from_environment(
        cls, kubeconfig: str | None = None, context: str | None = None
    ) -> RestKube:
        """In-cluster config inside a pod, else the kubeconfig (``KUBECONFIG`` / ~/.kube/config)."""
        from kubernetes import client, config

        configuration = client.Configuration()
        if (
            kubeconfig is None
            and os.environ.get("KUBERNETES_SERVICE_HOST")
            and not os.environ.get("KUBECONFIG")
        ):
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, context=context, client_configuration=configuration
            )
        if not configuration.verify_ssl:  # the kubeconfig asked for it; say so once, not per call
            import urllib3

            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        return cls(client.ApiClient(configuration))

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        query: dict[str, str] | None = None,
        accept: str = "application/json",
    ) -> JSON | None:
        """One API call; JSON out, None for a GET of something absent; KubeError otherwise.

        Uses the client's configuration (server, TLS, token refresh) and its urllib3 pool,
        which every ``kubernetes`` release has, not the generated ``ApiClient`` call
        methods, whose signatures changed between releases (``param_serialize`` is 37+)."""
        configuration = self._api.configuration
        headers = {"Accept": accept, "Content-Type": content_type}
        for auth in configuration.auth_settings().values():
            if auth.get("in") == "header" and auth.get("value"):
                headers[str(auth["key"])] = str(auth["value"])
        url = configuration.host.rstrip("/") + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None if body is None else json.dumps(body)
        try:
            response = self._api.rest_client.pool_manager.request(
                method,
                url,
                body=data,
                headers=headers,
                timeout=self._timeout,
                retries=False,
                preload_content=True,
            )
            status = int(response.status)
            raw: bytes = response.data or b""
        except Exception as err:  # connection refused, TLS, timeouts
            raise KubeError(0, f"{method} {path}: {err}") from err
        if status == 404 and method == "GET":
            return None
        if status >= 400:
            try:
                message = str(json.loads(raw).get("message", raw.decode(errors="replace")))
            except ValueError:
                message = raw.decode(errors="replace")
            raise KubeError(status, f"{method} {path}: {message}")
        if not raw:
            return {}
        result: JSON = json.loads(raw)
        return result

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> JSON | None:
        return self.request("GET", resource_path(api_version, kind, namespace, name))

    def list(self, api_version: str, kind: str, namespace: str, selector: str = "") -> list[JSON]:
        query = {"labelSelector": selector} if selector else None
        result = self.request("GET", resource_path(api_version, kind, namespace), query=query) or {}
        items: list[JSON] = result.get("items") or []
        for item in items:  # list items carry no apiVersion/kind
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
        return items

    def create(self, obj: JSON) -> JSON:
        # by metadata.namespace, not _ident: an Event has generateName, no name yet
        api_version, kind, namespace = obj["apiVersion"], obj["kind"], obj["metadata"]["namespace"]
        query = {"fieldManager": c.FIELD_MANAGER}
        return (
            self.request("POST", resource_path(api_version, kind, namespace), obj, query=query)
            or {}
        )

    def apply(self, obj: JSON) -> JSON:
        api_version, kind, namespace, name = _ident(obj)
        query = {"fieldManager": c.FIELD_MANAGER, "force": "true"}
        path = resource_path(api_version, kind, namespace, name)
        # JSON is YAML: the body goes as is, with the apply patch content type.
        return self.request("PATCH", path, obj, APPLY_PATCH, query) or {}

    def merge_patch(
        self, api_version: str, kind: str, namespace: str, name: str, patch: JSON
    ) -> JSON:
        path = resource_path(api_version, kind, namespace, name)
        query = {"fieldManager": c.FIELD_MANAGER}
        return self.request("PATCH", path, patch, "application/merge-patch+json", query) or {}

    def patch_status(
        self, api_version: str, kind: str, namespace: str, name: str, status: JSON
    ) -> JSON:
        path = resource_path(api_version, kind, namespace, name) + "/status"
        query = {"fieldManager": c.FIELD_MANAGER}
        return (
            self.request("PATCH", path, {"status": status}, "application/merge-patch+json", query)
            or {}
        )

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        path = resource_path(api_version, kind, namespace, name)
        try:
            self.request("DELETE", path, {"propagationPolicy": "Background"})
        except KubeError as err:
            if err.status != 404:
                raise


class ExitAfterWrites:
    """Fault injection for the restart test: the process dies (like ``kill -9``) right
    after the N-th successful write. Enabled only by the environment variable
    ``JITSERVE_OPERATOR_FAULT_EXIT_AFTER_WRITES``."""

    def __init__(self, inner: Kube, writes: int) -> None:
        self._inner = inner
        self._left = writes

    def _wrote(self) -> None:
        self._left -= 1
        if self._left <= 0:
            os._exit(137)

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> JSON | None:
        return self._inner.get(api_version, kind, namespace, name)

    def list(self, api_version: str, kind: str, namespace: str, selector: str = "") -> list[JSON]:
        return self._inner.list(api_version, kind, namespace, selector)

    def create(self, obj: JSON) -> JSON:
        result = self._inner.create(obj)
        self._wrote()
        return result

    def apply(self, obj: JSON) -> JSON:
        result = self._inner.apply(obj)
        self._wrote()
        return result

    def merge_patch(
        self, api_version: str, kind: str, namespace: str, name: str, patch: JSON
    ) -> JSON:
        result = self._inner.merge_patch(api_version, kind, namespace, name, patch)
        self._wrote()
        return result

    def patch_status(
        self, api_version: str, kind: str, namespace: str, name: str, status: JSON
    ) -> JSON:
        return self._inner.patch_status(api_version, kind, namespace, name, status)

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        self._inner.delete(api_version, kind, namespace, name)
        self._wrote()
