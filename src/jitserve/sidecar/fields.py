"""Which body fields the sidecar takes, and what it does with each (owner: sidecar).

- :data:`PASSTHROUGH`: sampling parameters sent with the token-id path;
- :data:`FORWARDED`: fields only vLLM's own endpoints honour (structured outputs, tools,
  logprobs, ``n``, chat template options, ``kv_transfer_params``, ``cache_salt``...): a
  request using one at a value other than its neutral one is forwarded as sent
  (:func:`forward_body`);
- accepted metadata (``user``...), and fields jitserve sets itself (``priority``,
  ``request_id``: refused, they would be silently replaced);
- anything else is forwarded too, as vLLM would get it without jitserve: vLLM's request
  models take unknown fields (``extra="allow"``) and ignore them with a debug log, and a
  field of a newer vLLM than this list knows reaches it unchanged instead of being dropped
  on the token path.

Chat messages whose content has parts other than text (``image_url``, ``input_audio``,
``video_url``, ``file``...) are forwarded as well (:func:`has_media`): vLLM's chat
endpoint loads and places the media, the token path would tokenize the text alone.
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
    # vLLM's own request fields: disaggregated prefill/decode (what llm-d and Dynamo send),
    # prefix-cache isolation, structural tags, token-id output, embeddings as input...
    "kv_transfer_params": (None,), "cache_salt": (None,), "structural_tag": (None,),
    "return_tokens_as_token_ids": (None, False), "prompt_embeds": (None,),
    "media_io_kwargs": (None,), "repetition_detection": (None,),
    "thinking_token_budget": (None,),
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
    """Refuse the fields jitserve sets (400 naming them); True when the request uses a
    field the token path does not take (it is then forwarded to vLLM's own endpoint)."""
    for name, why in _OWNED.items():
        if raw.get(name) is not None:
            raise bad_request(name, why, code="unsupported")
    if any(k not in _BODY_FIELDS and k not in _OWNED and raw[k] is not None for k in raw):
        return True
    return any(name in raw and _neutral(raw[name], neutral) is False
               for name, neutral in FORWARDED.items())


def has_media(messages: list[dict[str, Any]]) -> bool:
    """A chat message with a content part other than text (an image, audio, a file...)."""
    for message in messages:
        content = message.get("content")
        if isinstance(content, list) and any(
                not isinstance(part, dict) or part.get("type") != "text" for part in content):
            return True
    return False


def _neutral(value: object, neutral: tuple[object, ...]) -> bool:
    return any(value is n or (type(value) is type(n) and value == n) for n in neutral)


def forward_body(raw: dict[str, Any]) -> dict[str, Any]:
    """What vLLM gets of a forwarded request: the client's body less jitserve's fields."""
    return {k: v for k, v in raw.items() if k not in ("slo", "app") and k not in _IGNORED}


def choices(raw: dict[str, Any]) -> int:
    n = raw.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 128 else 1
