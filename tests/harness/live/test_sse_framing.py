"""SSE framing: linear in the bytes fed, one size cap per event, any split of the bytes.

No timed assertions: linearity is checked by the decoder's own count of bytes searched
(``bench/sse_parse.py`` prints the speeds).
"""

from __future__ import annotations

import random

import pytest

from harness.live.protocols import parse_stream
from harness.live.sse_framing import SseDecoder, SseEvent


def events_of(decoder: SseDecoder, pieces: list[bytes]) -> list[SseEvent]:
    return [event for piece in pieces for event in decoder.feed(piece)]


def split(data: bytes, rng: random.Random, max_piece: int) -> list[bytes]:
    pieces, i = [], 0
    while i < len(data):
        n = rng.randint(1, max_piece)
        pieces.append(data[i:i + n])
        i += n
    return pieces


def test_many_small_pieces_are_searched_once() -> None:
    # 2 MiB of one event, then 2,000 small events, fed 100 bytes at a time (~42,000 feeds):
    # the old decoder rescanned (and copied) the whole open event on every feed
    body = b"data: " + b"x" * (2 << 20) + b"\n\n" + b"data: {}\n\n" * 2000
    pieces = [body[i:i + 100] for i in range(0, len(body), 100)]
    decoder = SseDecoder(max_event_bytes=None)
    events = events_of(decoder, pieces)
    assert len(events) == 2001 and len(events[0].data) == 2 << 20
    # each byte searched once, plus the one byte a feed re-reads (a "\n" pairs across feeds)
    assert decoder.num_bytes_scanned <= len(body) + len(pieces)


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n", b"\r"])
def test_any_split_gives_the_same_events(line_end: bytes) -> None:
    text = (b": keep-alive\n\nevent: error\ndata: a\ndata:b\n\nid: 3\nretry: 5\n\n"
            b"data: {\"x\": 1}\n\n" + b"data: last\n\n")
    raw = text.replace(b"\n", line_end)
    whole = SseDecoder().feed(raw)
    assert whole == [SseEvent("a\nb", "error"), SseEvent('{"x": 1}'), SseEvent("last")]
    rng = random.Random(7)
    for _ in range(50):
        assert events_of(SseDecoder(), split(raw, rng, 9)) == whole
    assert events_of(SseDecoder(), [raw[i:i + 1] for i in range(len(raw))]) == whole


def test_an_event_over_the_cap_stops_the_decoder() -> None:
    decoder = SseDecoder(max_event_bytes=1000)
    assert decoder.feed(b"data: ok\n\ndata: " + b"x" * 600) == [SseEvent("ok")]
    assert decoder.error is None
    assert decoder.feed(b"y" * 600) == []  # 1,206 bytes open: over the cap before its end
    assert decoder.error is not None and "1000 bytes" in decoder.error
    assert decoder.feed(b"\n\ndata: later\n\n") == []  # nothing after the error


def test_a_whole_event_over_the_cap_in_one_read_is_refused_too() -> None:
    decoder = SseDecoder(max_event_bytes=100)
    events = decoder.feed(b"data: a\n\ndata: " + b"z" * 200 + b"\n\ndata: b\n\n")
    assert events == [SseEvent("a")] and decoder.error is not None


def test_parse_stream_reports_the_cap_as_protocol_error() -> None:
    first = b'data: {"choices":[{"text":"a"}]}\n\n'
    giant = b'data: {"choices":[{"text":"' + b"x" * 5000 + b'"}]}\n\n'
    out = parse_stream("openai", [first, giant[:3000], giant[3000:]], max_event_bytes=4096)
    assert out.error_kind == "protocol_error" and "4096 bytes" in out.error_message
    assert out.chunk_num_tokens == (1,)  # what came before it is kept
