"""Sidecar settings, the hot-reloaded policy file and tenant API keys (owner: sidecar).

- :class:`SidecarSettings`: process settings (ports, backend URL, batch size, limits),
  from the command line; they need a restart.
- :class:`ConfigWatcher`: the ``SLOPolicy`` spec file (the ConfigMap the operator mounts
  at ``/etc/jitserve/policy.yaml``), validated by :func:`jitserve.policy.load_policy_file`
  and polled every ``reload_interval_s``; a valid change is applied within seconds
  without a restart (``p``, ``f``, SLO defaults, tenant weights, admission limits), an
  invalid file keeps the last good spec and logs why.
- :class:`TenantKeys`: API key -> tenant. Keys come from ``--api-key TENANT=KEY``, from a
  YAML/JSON file ``{tenant: key | [keys]}``, and from mounted Secrets: for each tenant
  in the policy with ``apiKeySecret: NAME``, the file ``KEYS_DIR/NAME`` (the operator's
  one keys Secret) or ``KEYS_DIR/NAME/api-key`` (a Secret per tenant). Keys are re-read
  every reload interval. With no key configured, keys are off and the tenant comes from
  the ``x-tenant`` header.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

from jitserve.policy import PolicyError, SLOPolicySpec, load_policy_file

log = logging.getLogger("jitserve.sidecar.config")


class SidecarSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend_url: str = Field(default="http://127.0.0.1:8000",
                             description="The vLLM OpenAI server.")
    host: str = "0.0.0.0"
    port: int = Field(default=8080, ge=0, le=65535)
    config_path: Path | None = Field(default=None,
                                     description="SLOPolicy spec file (YAML or JSON).")
    max_running: int = Field(default=16, ge=1, le=4096,
                             description="B: vLLM's batch slots (its --max-num-seqs).")
    engine_queue: int | None = Field(
        default=None, ge=0, le=4096,
        description="Requests kept queued inside vLLM beyond its B slots, so a freed slot is "
                    "refilled in vLLM's next step (default: B/2, at least 2; 0: none).")
    max_body_bytes: int = Field(default=1 << 20, ge=1024, le=1 << 30)
    default_max_tokens: int = Field(default=256, ge=1)
    reload_interval_s: float = Field(default=1.0, gt=0, le=300)
    health_interval_s: float = Field(default=0.5, gt=0, le=60)
    min_frame_s: float = Field(default=0.02, gt=0)
    max_frame_s: float = Field(default=1.0, gt=0)
    api_keys: dict[str, str] = Field(default_factory=dict, description="API key -> tenant.")
    api_keys_file: Path | None = None
    keys_dir: Path | None = None
    analyzer: str | None = Field(default=None,
                                 description="host:port of the analyzer's gRPC service.")


class ConfigWatcher:
    """Polls the policy file; calls ``on_change(spec)`` with each new valid spec."""

    def __init__(self, path: Path | None, on_change: Callable[[SLOPolicySpec], None],
                 on_result: Callable[[str], None], interval_s: float = 1.0) -> None:
        self.path = path
        self.on_change = on_change
        self.on_result = on_result
        self.interval_s = interval_s
        self.last_error: str | None = None
        self._digest: bytes | None = None
        self.spec = self.load_initial()

    def load_initial(self) -> SLOPolicySpec:
        """The spec at start; an invalid file here is an error (there is no last good)."""
        if self.path is None:
            return SLOPolicySpec()
        self._digest = self._read_digest()
        return load_policy_file(self.path)

    def _read_digest(self) -> bytes | None:
        assert self.path is not None
        try:
            return hashlib.sha256(self.path.read_bytes()).digest()
        except OSError:
            return None

    def poll(self) -> bool:
        """Check the file once; True when a new spec was applied."""
        if self.path is None:
            return False
        digest = self._read_digest()
        if digest is None or digest == self._digest:
            if digest is None and self.last_error is None:
                self.last_error = f"cannot read {self.path}; keeping the last good policy"
                log.warning("%s", self.last_error)
            return False
        self._digest = digest
        try:
            spec = load_policy_file(self.path)
        except PolicyError as err:
            self.last_error = f"invalid policy file, keeping the last good one: {err}"
            log.error("%s", self.last_error)
            self.on_result("error")
            return False
        self.last_error = None
        if spec == self.spec:
            return False
        self.spec = spec
        self.on_change(spec)
        self.on_result("ok")
        log.info("policy reloaded from %s: policy=%s cutoff=%s/%s f=%s", self.path,
                 spec.scheduler.policy, spec.scheduler.cutoff.mode.value,
                 spec.scheduler.cutoff.value, spec.fairness.weight)
        return True


class TenantKeys:
    """API key -> tenant, rebuilt when the policy's tenants change."""

    def __init__(self, settings: SidecarSettings) -> None:
        self.settings = settings
        self.keys: dict[str, str] = {}
        self._missing: set[str] = set()

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    def rebuild(self, spec: SLOPolicySpec) -> None:
        keys = dict(self.settings.api_keys)
        path = self.settings.api_keys_file
        if path is not None:
            doc = yaml.safe_load(path.read_text()) or {}
            if not isinstance(doc, dict):
                raise ValueError(f"{path}: expected a mapping tenant -> key or list of keys")
            for tenant, value in doc.items():
                for key in value if isinstance(value, list) else [value]:
                    keys[str(key)] = str(tenant)
        if self.settings.keys_dir is not None:
            for tenant in spec.fairness.tenants:
                if tenant.api_key_secret:
                    # the operator's one Secret: KEYS_DIR/<name>; a Secret per tenant
                    # mounted at KEYS_DIR/<name>/: its api-key file
                    key_file = self.settings.keys_dir / tenant.api_key_secret
                    if key_file.is_dir():
                        key_file = key_file / "api-key"
                    try:
                        keys[key_file.read_text().strip()] = tenant.name
                    except OSError as err:
                        if tenant.name not in self._missing:
                            log.error("tenant %s: cannot read its key %s: %s",
                                      tenant.name, key_file, err)
                            self._missing.add(tenant.name)
        self.keys = {k: t for k, t in keys.items() if k}

    def tenant_of(self, key: str) -> str | None:
        return self.keys.get(key)
