"""The JSON-shape helper the OpenAI-compatibility tests compare with: the order of a
stream's chunks and what their tokens happen to be must not change its shape (CI saw a
stream of the same shape judged different: `logprobs` null, then objects, one token of
no bytes), while a missing field or a changed type must."""
from __future__ import annotations

import itertools

from tests.support.json_shape import shape, stream_shape

TOKEN = {"token": "a", "logprob": -0.1, "bytes": [97]}
NO_BYTES = {"token": "", "logprob": -2.0, "bytes": []}
CHUNKS = [
    {"choices": [{"delta": {"role": "assistant"}, "logprobs": None}]},
    {"choices": [{"delta": {"content": "a"}, "logprobs": {"content": [TOKEN]}}]},
    {"choices": [{"delta": {"content": ""}, "logprobs": {"content": [NO_BYTES, TOKEN]}}]},
]


def test_a_streams_shape_does_not_depend_on_the_order_of_its_chunks() -> None:
    orders = itertools.permutations(CHUNKS)
    assert all(stream_shape(list(order)) == stream_shape(CHUNKS) for order in orders)


def test_a_token_of_no_bytes_has_the_shape_of_one_with_bytes() -> None:
    assert shape([NO_BYTES, TOKEN]) == shape([TOKEN]) == shape([TOKEN, NO_BYTES])


def test_a_missing_field_or_a_changed_type_changes_the_shape() -> None:
    assert shape({"a": 1}) != shape({"a": "1"})
    assert shape({"a": 1}) != shape({"a": 1, "b": None})
    assert stream_shape(CHUNKS) != stream_shape(CHUNKS[1:])
    assert stream_shape(CHUNKS) != stream_shape([*CHUNKS, {"choices": [], "usage": {}}])
