"""Kubernetes operator for ``SLOPolicy`` (kopf).

Layout: ``crd`` generates the CustomResourceDefinition from :mod:`jitserve.policy`;
``builders`` are pure functions from a policy to each child object; ``status`` turns
child state and sidecar metrics into the policy's status; ``reconcile`` applies the
desired children through a small client (``kube``); ``handlers`` are the kopf entry
points, and ``cli`` the ``jitserve operator`` / ``jitserve crd`` subcommands.
"""
