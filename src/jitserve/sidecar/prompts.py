"""What a request's prompt is to vLLM: served model, token ids, room left (owner: sidecar).

- :func:`served_model`: the model a request names (404 if not served), or the first one;
- :class:`PromptReader`: token ids of a prompt or chat messages (vLLM's ``/tokenize``,
  chat template applied) and the model's context length, from which a request that
  gives no ``max_tokens`` gets vLLM's default: the rest of the context.
"""

from __future__ import annotations

from jitserve.sidecar.api import ParsedRequest
from jitserve.sidecar.backend import VLLMBackend
from jitserve.sidecar.errors import APIError, backend_down, backend_rejected
from jitserve.sidecar.upstream import BackendError, BackendUnavailable


def served_model(parsed: ParsedRequest, models: list[str]) -> str:
    if parsed.model is None:
        if not models:
            raise backend_down(message="the model backend is unavailable (no model list yet)")
        return models[0]
    if models and parsed.model not in models:
        raise APIError(404, f"model {parsed.model[:256]!r} is not served here (serving: "
                       f"{', '.join(models)})", param="model", code="model_not_found")
    return parsed.model


class PromptReader:
    def __init__(self, backend: VLLMBackend) -> None:
        self.backend = backend
        self._context: dict[str, int | None] = {}

    async def context_len(self, model: str) -> int | None:
        """The model's context length from vLLM's model list (cached)."""
        if model not in self._context:
            try:
                doc = await self.backend.models()
            except BackendUnavailable:
                return None
            for entry in doc.get("data", []):
                if isinstance(entry, dict) and isinstance(entry.get("max_model_len"), int):
                    self._context[str(entry.get("id"))] = int(entry["max_model_len"])
            self._context.setdefault(model, None)  # not listed: not asked again per request
        return self._context.get(model)

    async def tokenize(self, parsed: ParsedRequest, model: str) -> tuple[list[int], int | None]:
        prompt_param = "messages" if parsed.endpoint == "chat" else "prompt"
        try:
            return await self.backend.tokenize(model, prompt=parsed.prompt,
                                               messages=parsed.messages)
        except BackendUnavailable as err:
            raise backend_down(message=f"the model backend is unavailable: {err}") from err
        except BackendError as err:
            param = prompt_param if err.param in (None, "prompt", "messages") else err.param
            raise backend_rejected(err.status, err.message, param) from err

    async def max_tokens(self, parsed: ParsedRequest, model: str, prompt_len: int,
                         max_len: int | None, cap: int | None) -> int:
        """The request's ``max_tokens``; none given: as vLLM, the rest of the context
        (at most ``cap``, the sidecar's ``--default-max-tokens``). 400 if the prompt and
        ``max_tokens`` do not fit."""
        if max_len is None:
            max_len = await self.context_len(model)
        max_tokens = parsed.max_tokens
        if max_tokens is None:
            rest = max(1, max_len - prompt_len) if max_len is not None else None
            max_tokens = min(x for x in (cap, rest, 1 << 20) if x is not None)
        if max_len is not None and prompt_len + max_tokens > max_len:
            raise APIError(400, f"max_tokens: prompt ({prompt_len} tokens) + max_tokens "
                           f"({max_tokens}) exceeds the model's context of {max_len} tokens",
                           param="max_tokens", code="invalid_value")
        return max_tokens
