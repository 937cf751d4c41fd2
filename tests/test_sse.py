"""The one SSE reader and writer: events end at a blank line whatever the line ends, data
lines join, comments carry no data, an event cut by a read waits for its end; what the
writer frames, the reader reads back (a JSON event, an error ending, the last event)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from jitserve import sse


def test_events_and_their_data() -> None:
    events, rest = sse.split(b'data: {"a": 1}\n\n: keep-alive\n\ndata: [DONE]\n\ndata: {"b"')
    assert [sse.data(e) for e in events] == [b'{"a": 1}', None, sse.DONE]
    assert rest == b'data: {"b"'


def test_crlf_and_multi_line_data() -> None:
    events, rest = sse.split(b"event: x\r\ndata: one\r\ndata:two\r\n\r\n")
    assert [sse.data(e) for e in events] == [b"one\ntwo"] and rest == b""


@given(payloads=st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",),
                                                       blacklist_characters="\r\n"),
                                 max_size=20), min_size=1, max_size=5),
       cuts=st.lists(st.integers(0, 400), max_size=6))
def test_reads_cut_anywhere_give_the_same_events(payloads: list[str], cuts: list[int]) -> None:
    stream = "".join(sse.event(p) for p in payloads).encode()
    got: list[bytes | None] = []
    rest, at = b"", 0
    for cut in [*sorted(c for c in cuts if c < len(stream)), len(stream)]:
        events, rest = sse.split(rest + stream[at:cut])
        got += [sse.data(e) for e in events]
        at = cut
    assert got == [p.encode() for p in payloads] and rest == b""


def test_what_the_writer_frames_the_reader_reads() -> None:
    error = {"error": {"message": "a\nb", "code": 502}}
    stream = (sse.json_event({"text": "x\n\ny"}) + sse.error_ending(error)).encode()
    events, rest = sse.split(stream)
    payloads = [sse.data(e) for e in events]
    assert rest == b"" and payloads[-1] == sse.DONE and sse.LAST.encode() == events[-1] + b"\n\n"
    assert [json.loads(p or b"") for p in payloads[:-1]] == [{"text": "x\n\ny"}, error]
    assert sse.HEADERS["Content-Type"] == "text/event-stream"
