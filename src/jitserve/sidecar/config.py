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
  every reload interval. Whether keys are on is decided by configuration, never by what
  loaded: keys are on when ``--api-key`` or ``--api-keys-file`` is given, or when
  ``--keys-dir`` is given and a policy tenant names an ``apiKeySecret``. Keys on and none
  loadable (an emptied or corrupt file, missing Secrets) means every request is refused
  (503 ``auth_unavailable``) and ``/ready`` says why: auth fails closed, never open.
  With no key configured, the tenant comes from the ``x-tenant`` header.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
    engine_queue_unstarted: bool = Field(
        default=False,
        description="The engine queue bounds the dispatched requests that have no token yet "
                    "(waiting in vLLM or in their prefill), not those beyond B (an experiment: "
                    "docs/benchmarks.md, the engine queue's cost).")
    max_body_bytes: int = Field(default=1 << 20, ge=1024, le=1 << 30)
    default_max_tokens: int | None = Field(
        default=None, ge=1,
        description="max_tokens of a request that gives none (default: as vLLM, the rest of "
                    "the model's context).")
    reload_interval_s: float = Field(default=1.0, gt=0, le=300)
    health_interval_s: float = Field(default=0.5, gt=0, le=60)
    min_frame_s: float = Field(default=0.02, gt=0)
    max_frame_s: float = Field(default=1.0, gt=0)
    api_keys: dict[str, str] = Field(default_factory=dict, description="API key -> tenant.")
    api_keys_file: Path | None = None
    keys_dir: Path | None = None
    analyzer: str | None = Field(default=None,
                                 description="host:port of the analyzer's gRPC service.")
    admin_port: int | None = Field(
        default=None, ge=0, le=65535,
        description="Serve /metrics and /debug/scheduler (and the probes) on this port only, "
        "without a key; the API port then answers 404 for them.")
    reasoning_parser: str | None = Field(
        default=None, max_length=64,
        description="The --reasoning-parser vLLM runs with: chat requests then go to vLLM's "
        "chat endpoint, which splits the reasoning from the content (not preemptible).")
    policy_name: str = Field(
        default="", max_length=253,
        description="The SLOPolicy this sidecar serves: the policy label of "
        "jitserve_build_info.")
    admin_keys: list[str] = Field(
        default_factory=list,
        description="Keys for /metrics and /debug/scheduler on the API port when tenant keys "
        "are on (without an admin port).")
    stall_timeout_s: float = Field(
        default=30.0, ge=0, le=3600,
        description="A running vLLM stream silent this long fails its request (0: never).")
    header_timeout_s: float = Field(
        default=10.0, gt=0, le=600,
        description="A connection must send a request's headers within this (and idle "
        "keep-alive connections close after it).")
    body_timeout_s: float = Field(default=30.0, gt=0, le=600,
                                  description="A request body must arrive within this.")
    max_json_depth: int = Field(default=32, ge=4, le=512,
                                description="Deepest nesting of arrays/objects in a body.")
    max_buffered_tokens: int = Field(
        default=4096, ge=16, le=1 << 20,
        description="Tokens a stream may hold unsent for a slow reader before it is aborted.")
    access_log: bool = Field(default=False,
                             description="A JSON line per answered request on stdout.")
    engine_profile: str = Field(
        default="a100-llama3-8b", min_length=1, max_length=4096,
        description="The engine model scheduler.policy auto replays on, unless the policy's "
        "scheduler.auto.profile names one: a bundled profile or a jitserve calibrate file.")


class ConfigWatcher:
    """Polls the policy file; calls ``on_change(spec)`` with each new valid spec.

    ``validate(spec)`` checks what the schema cannot (the scheduler name exists) and
    raises ``ValueError``. A rejected file (unreadable, not UTF-8, invalid, unknown
    scheduler, or empty: an emptied ConfigMap is a mistake, not "use the defaults")
    keeps the last good spec, sets ``last_error`` and counts ``on_result("error")``; an
    empty or missing file is judged only when it is still so at the next poll."""

    def __init__(self, path: Path | None, on_change: Callable[[SLOPolicySpec], None],
                 on_result: Callable[[str], None], interval_s: float = 1.0,
                 validate: Callable[[SLOPolicySpec], Any] | None = None) -> None:
        self.path = path
        self.on_change = on_change
        self.on_result = on_result
        self.interval_s = interval_s
        self.validate = validate
        self.last_error: str | None = None
        self._digest: bytes | None = None
        self._suspect = False
        self.spec = self.load_initial()

    def load_initial(self) -> SLOPolicySpec:
        """The spec at start; an invalid file here is an error (there is no last good)."""
        if self.path is None:
            return SLOPolicySpec()
        self._digest = self._read_digest()
        spec = self._load()
        if self._digest == _EMPTY:
            self.last_error = f"{self.path} is empty: serving with the default policy"
            log.warning("%s", self.last_error)
        return spec

    def _load(self) -> SLOPolicySpec:
        assert self.path is not None
        try:
            spec = load_policy_file(self.path)
            if self.validate is not None:
                self.validate(spec)
        except PolicyError:
            raise
        except (ValueError, RecursionError) as err:
            raise PolicyError(f"{self.path}: {err}") from err
        return spec

    def _read_digest(self) -> bytes | None:
        assert self.path is not None
        try:
            raw = self.path.read_bytes()
        except OSError:
            return None
        return _EMPTY if not raw.strip() else hashlib.sha256(raw).digest()

    def _reject(self, message: str) -> bool:
        self.last_error = message
        log.error("%s", message)
        self.on_result("error")
        return False

    def poll(self) -> bool:
        """Check the file once; True when a new spec was applied."""
        if self.path is None:
            return False
        digest = self._read_digest()
        if digest == self._digest:
            return False
        if digest in (None, _EMPTY) and not self._suspect:
            # an editor or `write_text` truncates before it writes: judge an empty or
            # vanished file on the next poll, not mid-write
            self._suspect = True
            return False
        self._suspect = False
        self._digest = digest
        if digest is None:
            return self._reject(f"cannot read {self.path}; keeping the last good policy")
        if digest == _EMPTY:
            return self._reject(f"{self.path} is empty; keeping the last good policy")
        try:
            spec = self._load()
        except PolicyError as err:
            return self._reject(f"invalid policy file, keeping the last good one: {err}")
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


_EMPTY = b"empty"


class TenantKeys:
    """API key -> tenant, rebuilt when the policy's tenants change. ``rebuild`` never
    raises: what could not be loaded is in ``error`` (logged once per new problem)."""

    def __init__(self, settings: SidecarSettings) -> None:
        self.settings = settings
        self.keys: dict[str, str] = {}
        self.configured = False
        self.error: str | None = None
        self._logged: set[str] = set()

    @property
    def enabled(self) -> bool:
        """Keys decide the tenant (by configuration, whether or not any loaded)."""
        return self.configured

    @property
    def unavailable(self) -> str | None:
        """Why no request can be authenticated now, or None."""
        if not self.configured or self.keys:
            return None
        return "API keys are configured but none could be loaded" + (
            f" ({self.error})" if self.error else "")

    def _configured(self, spec: SLOPolicySpec) -> bool:
        s = self.settings
        return bool(s.api_keys) or s.api_keys_file is not None or (
            s.keys_dir is not None and any(t.api_key_secret for t in spec.fairness.tenants))

    def _file_keys(self, path: Path, problems: list[str]) -> dict[str, str]:
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError) as err:
            problems.append(f"cannot read {path}: {type(err).__name__}: "
                            f"{str(err).splitlines()[0] if str(err) else ''}")
            return {}
        if doc is None:
            problems.append(f"{path} is empty")
            return {}
        if not isinstance(doc, dict):
            problems.append(f"{path}: expected a mapping tenant -> key or list of keys")
            return {}
        keys: dict[str, str] = {}
        for tenant, value in doc.items():
            for key in value if isinstance(value, list) else [value]:
                if not isinstance(key, str | int) or isinstance(key, bool) or not str(key).strip():
                    problems.append(f"{path}: tenant {tenant!r}: a key must be a non-empty string")
                    continue
                keys[str(key).strip()] = str(tenant)
        return keys

    def _secret_keys(self, spec: SLOPolicySpec, keys_dir: Path,
                     problems: list[str]) -> dict[str, str]:
        keys: dict[str, str] = {}
        for tenant in spec.fairness.tenants:
            if not tenant.api_key_secret:
                continue
            # the operator's one Secret: KEYS_DIR/<name>; a Secret per tenant mounted at
            # KEYS_DIR/<name>/: its api-key file
            key_file = keys_dir / tenant.api_key_secret
            try:
                if key_file.is_dir():
                    key_file = key_file / "api-key"
                key = key_file.read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as err:
                problems.append(f"tenant {tenant.name}: cannot read its key {key_file}: "
                                f"{type(err).__name__}")
                continue
            if not key:
                problems.append(f"tenant {tenant.name}: its key {key_file} is empty")
                continue
            keys[key] = tenant.name
        return keys

    def rebuild(self, spec: SLOPolicySpec) -> None:
        problems: list[str] = []
        keys = {k: t for k, t in self.settings.api_keys.items() if k}
        if self.settings.api_keys_file is not None:
            keys.update(self._file_keys(self.settings.api_keys_file, problems))
        if self.settings.keys_dir is not None:
            keys.update(self._secret_keys(spec, self.settings.keys_dir, problems))
        self.keys = keys
        self.configured = self._configured(spec)
        self.error = "; ".join(problems) or None
        for problem in problems:
            if problem not in self._logged:
                log.error("tenant keys: %s", problem)
        if self._logged and not problems:
            log.info("tenant keys: all configured keys loaded again")
        self._logged = set(problems)

    def tenant_of(self, key: str) -> str | None:
        return self.keys.get(key)
