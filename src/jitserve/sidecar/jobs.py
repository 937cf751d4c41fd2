"""One client request inside the sidecar (owner: sidecar): what to send to vLLM, what was
delivered, and the events its HTTP handler streams to the client.

Plain data. The request's scheduling state is its :class:`~jitserve.requests.LiveRequest`
(written only by :mod:`jitserve.serving`); the dispatcher fills the delivery fields.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from jitserve.requests import LiveRequest
from jitserve.sidecar.backend import Abortable
from jitserve.sidecar.errors import APIError


class EventKind(Enum):
    TOKENS = "tokens"
    DONE = "done"
    ERROR = "error"


@dataclass(slots=True)
class Event:
    kind: EventKind
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    error: APIError | None = None
    raw: dict[str, Any] | None = None
    """A forwarded request's chunk (or whole body) as vLLM sent it."""


@dataclass(eq=False)
class Job:
    live: LiveRequest
    model: str
    prompt_ids: list[int]
    max_tokens: int
    sampling: dict[str, Any] = field(default_factory=dict)
    min_tokens: int = 0
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    generated_ids: list[int] = field(default_factory=list)
    done: bool = False
    outcome: str | None = None
    """met | missed | retired | cancelled | ttl_expired | error (a metrics label)."""
    finish_reason: str | None = None
    dispatch: Abortable | None = None
    """The dispatch running in vLLM (its stream), if any."""
    segment: int = 0
    """Dispatches so far; a stream of an older segment is stale and ignored."""
    dispatched_s: float = 0.0
    queued_in_engine: bool = False
    """Dispatched while vLLM's slots were full: it first waited in vLLM's queue."""
    segment_tokens: int = 0
    last_token_s: float | None = None
    mark_s: float | None = None
    mark_tokens: int = 0
    vllm_priority: int = 0
    ttl_timer: asyncio.TimerHandle | None = None
    """Ends the request if it is still not dispatched when its queue TTL runs out."""
    forward: dict[str, Any] | None = None
    """A forwarded request's body, sent as is to vLLM's ``forward_path`` (plus its
    ``priority``); such a request is never preempted."""
    forward_path: str = ""

    @property
    def request_id(self) -> str:
        return self.live.req.request_id
