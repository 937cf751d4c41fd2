"""``jitserve operator``: run the SLOPolicy operator (kopf)."""

from __future__ import annotations

import argparse
import logging
import os

from pydantic import ValidationError

from jitserve.envflags import from_environment
from jitserve.errors import CLIError, flag_error
from jitserve.operator.builders import OperatorSettings

FAULT_ENV = "JITSERVE_OPERATOR_FAULT_EXIT_AFTER_WRITES"
ENV_PREFIX = "JITSERVE_"
"""``--sidecar-image`` is also ``JITSERVE_SIDECAR_IMAGE``, and so on (``jitserve.envflags``)."""

FLAGS = {
    "sidecar_image": "--sidecar-image", "analyzer_image": "--analyzer-image",
    "image_pull_policy": "--image-pull-policy", "analyzer_storage": "--analyzer-storage",
    "analyzer_storage_class": "--analyzer-storage-class",
    "status_interval_seconds": "--status-interval",
}
"""OperatorSettings field -> the flag that sets it (errors name the flag)."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    defaults = OperatorSettings()
    p = subparsers.add_parser(
        "operator",
        help="run the SLOPolicy Kubernetes operator",
        description="Watch SLOPolicy objects and manage their vLLM + sidecar Deployments, "
        "Services, ConfigMaps, Ingresses and the per-namespace analyzer. Uses the in-cluster "
        "service account inside a pod, else KUBECONFIG / ~/.kube/config.",
    )
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="namespace to watch (exact name; repeatable); default: all",
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch all namespaces")
    p.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: KUBECONFIG)")
    p.add_argument(
        "--sidecar-image",
        default=defaults.sidecar_image,
        help="the scheduler sidecar's image",
    )
    p.add_argument(
        "--analyzer-image",
        default=defaults.analyzer_image,
        help="the per-namespace analyzer's image",
    )
    p.add_argument(
        "--image-pull-policy",
        default=defaults.image_pull_policy,
        choices=["Always", "IfNotPresent", "Never"],
        help="imagePullPolicy of the pods the operator makes",
    )
    p.add_argument(
        "--analyzer-storage",
        default=defaults.analyzer_storage,
        metavar="QUANTITY",
        help="size of the analyzer's checkpoint volume, e.g. 1Gi",
    )
    p.add_argument(
        "--analyzer-storage-class",
        default=None,
        help="StorageClass of that volume (none: the cluster's default)",
    )
    p.add_argument(
        "--status-interval",
        type=float,
        default=defaults.status_interval_seconds,
        metavar="SECONDS",
        help="seconds between status refreshes (metrics scrape, drift check)",
    )
    p.add_argument(
        "--monitoring-namespace",
        default=defaults.monitoring_namespace,
        help="namespace of Prometheus: the serving pods' NetworkPolicy admits it (and the "
        "operator's own namespace, POD_NAMESPACE) to the admin and vLLM ports "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--liveness",
        default=None,
        metavar="URL",
        help="serve a liveness endpoint, e.g. http://0.0.0.0:8081/healthz",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="serve the operator's Prometheus metrics on this port (0: off)",
    )
    p.add_argument("--metrics-addr", default="0.0.0.0", help="address of the metrics endpoint")
    hook = p.add_argument_group(
        "validating webhook", "refuse cross-field violations at kubectl apply time"
    )
    hook.add_argument(
        "--webhook-port",
        type=int,
        default=0,
        help="serve the admission webhook (HTTPS) on this port (0: off)",
    )
    hook.add_argument("--webhook-addr", default="0.0.0.0", help="address of the webhook server")
    hook.add_argument(
        "--webhook-cert", default=None, help="TLS certificate (PEM)"
    )
    hook.add_argument(
        "--webhook-key", default=None, help="TLS private key (PEM)"
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG")
    p.set_defaults(handler=run)
    from_environment(p, ENV_PREFIX)


def api_server_has_cel(kube: object) -> bool:
    """Whether the API server evaluates CRD CEL rules (on by default from Kubernetes 1.25;
    1.20 drops the field). Unknown (no /version): assume not, so the webhook checks all."""
    import re

    request = getattr(kube, "request", None)
    try:
        version = request("GET", "/version") if request else None
    except Exception:
        return False
    if not version:
        return False
    major = re.match(r"\d+", str(version.get("major", "")))
    minor = re.match(r"\d+", str(version.get("minor", "")))
    if major is None or minor is None:
        return False
    return (int(major.group()), int(minor.group())) >= (1, 25)


def run(args: argparse.Namespace) -> int:
    try:
        settings = OperatorSettings(
            sidecar_image=args.sidecar_image,
            analyzer_image=args.analyzer_image,
            image_pull_policy=args.image_pull_policy,
            analyzer_storage=args.analyzer_storage,
            analyzer_storage_class=args.analyzer_storage_class,
            status_interval_seconds=args.status_interval,
            monitoring_namespace=args.monitoring_namespace,
            operator_namespace=os.environ.get("POD_NAMESPACE") or None,
        )
    except ValidationError as err:
        raise flag_error(err.errors(), FLAGS) from err
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("kopf.objects", "kopf._core", "kopf.activities"):
        logging.getLogger(noisy).setLevel(logging.INFO if args.verbose else logging.WARNING)

    import kopf

    from jitserve.operator.handlers import Controller, WebhookSettings, make_registry
    from jitserve.operator.kube import ExitAfterWrites, Kube, KubeError, RestKube
    from jitserve.operator.metrics import OperatorMetrics

    try:
        kube: Kube = RestKube.from_environment(args.kubeconfig)
    except Exception as err:  # kubeconfig missing or unreadable
        raise CLIError(f"cannot load Kubernetes credentials: {err}") from err
    settings = settings.model_copy(update={"api_server_cel": api_server_has_cel(kube)})
    fault = os.environ.get(FAULT_ENV)
    if fault:
        kube = ExitAfterWrites(kube, int(fault))
    webhook = None
    if args.webhook_port:
        if not (args.webhook_cert and args.webhook_key):
            raise CLIError("--webhook-port needs --webhook-cert and --webhook-key (PEM files)")
        webhook = WebhookSettings(
            args.webhook_port, args.webhook_cert, args.webhook_key, args.webhook_addr
        )
    metrics = OperatorMetrics()
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, addr=args.metrics_addr, registry=metrics.registry)
    controller = Controller(kube, settings, metrics=metrics)
    registry = make_registry(controller, webhook)
    namespaces = list(args.namespace)
    try:
        kopf.run(
            registry=registry,
            standalone=True,
            clusterwide=not namespaces,
            namespaces=namespaces,
            liveness_endpoint=args.liveness,
        )
    except KubeError as err:
        raise CLIError(str(err)) from err
    return 0
