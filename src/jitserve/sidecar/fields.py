"""Which body fields the sidecar takes, and what it does with each (owner: sidecar).

- :data:`PASSTHROUGH`: sampling parameters sent with the token-id path;
- :data:`FORWARDED`: fields only vLLM's own endpoints honour (structured outputs, tools,
  logprobs, ``n``, chat template options...): a request using one at a value other than
  its neutral one is forwarded as sent (:func:`forward_body`);
- accepted metadata (``user``...), and fields jitserve sets itself (``priority``,
  ``request_id``: refused, they would be silently replaced);
- anything else: refused with a 400 naming it (:func:`check_fields`).
"""

from __future__ import annotations

from typing import Any

from jitserve.sidecar.errors import bad_request

# Sampling parameters forwarded to vLLM as they are (OpenAI + vLLM extensions).
PASSTHROUGH = (
    "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "skip_special_tokens",
    "spaces_between_special_tokens", "include_stop_str_in_output",
)
# Fields vLLM's own endpoints take that the token-id path cannot honour (structured
# outputs, tools, logprobs, several choices, chat template options...): a request using
# one (at a value other than its neutral one) is forwarded to vLLM as sent, not preempted.
FORWARDED: dict[str, tuple[object, ...]] = {
    "response_format": (None,), "structured_outputs": (None,), "guided_json": (None,),
    "guided_regex": (None,), "guided_choice": (None,), "guided_grammar": (None,),
    "guided_decoding_backend": (None,), "guided_whitespace_pattern": (None,),
    "logprobs": (None, False), "top_logprobs": (None,), "prompt_logprobs": (None,),
    "n": (None, 1), "best_of": (None, 1), "echo": (None, False), "suffix": (None,),
    "logit_bias": (None,), "tools": (None,), "tool_choice": (None,),
    "parallel_tool_calls": (None,), "chat_template": (None,), "chat_template_kwargs": (None,),
    "add_generation_prompt": (None,), "continue_final_message": (None,), "documents": (None,),
    "reasoning_effort": (None,), "include_reasoning": (None,), "bad_words": (None,),
    "allowed_token_ids": (None,), "truncate_prompt_tokens": (None,),
    "add_special_tokens": (None,), "use_beam_search": (None, False),
    "length_penalty": (None,), "mm_processor_kwargs": (None,), "vllm_xargs": (None,),
}
# Accepted and not sent to vLLM: request metadata with no effect on the output.
_IGNORED = ("user", "metadata", "store", "service_tier")
# Fields jitserve sets itself: a client value is refused (it would be silently replaced).
_OWNED = {
    "priority": "jitserve sets vLLM's priority from the scheduler; give an SLO (slo, "
                "x-slo-class) instead",
    "request_id": "send the X-Request-Id header instead",
}
_BODY_FIELDS = frozenset({
    "model", "stream", "stream_options", "max_tokens", "min_tokens", "slo", "app",
    "return_token_ids", "prompt", "messages", "max_completion_tokens",
    *PASSTHROUGH, *FORWARDED, *_IGNORED,
})


def check_fields(raw: dict[str, Any]) -> bool:
    """Refuse unknown fields and the ones jitserve sets (400 naming them); True when the
    request uses a field only vLLM's own endpoint honours (it is then forwarded)."""
    unknown = sorted(k for k in raw if k not in _BODY_FIELDS and k not in _OWNED)
    if unknown:
        names = ", ".join(str(k)[:64] for k in unknown[:10])
        raise bad_request(str(unknown[0])[:64], f"unknown field(s) {names}: not an OpenAI or "
                          "vLLM request field jitserve forwards", code="unknown_field")
    for name, why in _OWNED.items():
        if raw.get(name) is not None:
            raise bad_request(name, why, code="unsupported")
    return any(name in raw and _neutral(raw[name], neutral) is False
               for name, neutral in FORWARDED.items())


def _neutral(value: object, neutral: tuple[object, ...]) -> bool:
    return any(value is n or (type(value) is type(n) and value == n) for n in neutral)


def forward_body(raw: dict[str, Any]) -> dict[str, Any]:
    """What vLLM gets of a forwarded request: the client's body less jitserve's fields."""
    return {k: v for k, v in raw.items() if k not in ("slo", "app") and k not in _IGNORED}


def choices(raw: dict[str, Any]) -> int:
    n = raw.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 128 else 1
