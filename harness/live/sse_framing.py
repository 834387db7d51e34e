"""Server-sent events framing: raw bytes in, ``SseEvent`` records out, in linear time.

The SSE format (https://html.spec.whatwg.org/multipage/server-sent-events.html, "Parsing an
event stream"): lines end with CRLF, LF or CR; a blank line ends an event; ``data:`` lines are
joined with newlines; ``event:`` names it; lines starting with ``:`` are comments (keep-alives).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_EVENT_BYTES = 1 << 20  # 1 MiB: a token event is a few hundred bytes


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One server-sent event: its ``data`` lines joined by newlines, and its ``event`` name."""

    data: str
    event: str = ""


class SseDecoder:
    """Incremental SSE framing over raw bytes: ``feed`` returns the events completed so far.

    Accepts ``data:`` with or without the space (TGI sends none), CR, LF or CRLF line ends,
    ``:`` comment lines (keep-alives), multi-line data. An event still open when the bytes end
    is incomplete and never returned: the stream was cut inside it.

    Linear in the bytes fed, however they are split: each byte is appended to the open event
    once and searched for the event's end once (``num_bytes_scanned`` counts the bytes
    searched). An event larger than ``max_event_bytes`` (None: no cap) stops the decoder:
    ``error`` says why, and ``feed`` returns nothing more.
    """

    __slots__ = ("_buf", "_cr", "_scan_from", "error", "max_event_bytes", "num_bytes_scanned")

    def __init__(self, max_event_bytes: int | None = DEFAULT_MAX_EVENT_BYTES) -> None:
        self.max_event_bytes = max_event_bytes
        self.error: str | None = None
        self.num_bytes_scanned = 0
        self._buf = bytearray()  # the open event, line ends normalised to LF
        self._scan_from = 0  # where the search for the event's end ("\n\n") resumes
        self._cr = False  # the last byte fed was a CR: an LF first in the next feed is its pair

    @property
    def pending(self) -> bool:
        """Whether bytes of an unfinished event are waiting."""
        return bool(self._buf.strip())

    def feed(self, data: bytes) -> list[SseEvent]:
        if self.error is not None:
            return []
        if self._cr and data[:1] == b"\n":
            data = data[1:]
        self._cr = data[-1:] == b"\r"
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = self._buf
        buf += data
        cap = self.max_event_bytes
        events: list[SseEvent] = []
        start = 0
        scan = self._scan_from
        while True:
            end = buf.find(b"\n\n", scan)
            self.num_bytes_scanned += (len(buf) if end < 0 else end + 2) - scan
            if end < 0:
                break
            if cap is not None and end - start > cap:
                return self._overflow(events, end - start)
            event = _parse_block(bytes(buf[start:end]))
            if event is not None:
                events.append(event)
            start = scan = end + 2
        if start:
            del buf[:start]  # (from the front of a bytearray: no copy of the rest)
        self._scan_from = max(len(buf) - 1, 0)  # a "\n" last may pair with one first next time
        if cap is not None and len(buf) > cap:
            return self._overflow(events, len(buf))
        return events

    def _overflow(self, events: list[SseEvent], size: int) -> list[SseEvent]:
        self.error = (f"an SSE event of more than {self.max_event_bytes} bytes "
                      f"({size} bytes so far; the cap is max_event_bytes)")
        self._buf = bytearray()
        return events


def _parse_block(block: bytes) -> SseEvent | None:
    data_lines: list[str] = []
    name = ""
    for raw in block.decode("utf-8", errors="replace").split("\n"):
        if not raw or raw.startswith(":"):
            continue
        field, _, value = raw.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            data_lines.append(value)
        elif field == "event":
            name = value
        # id: and retry: carry nothing we use
    if not data_lines and not name:
        return None
    return SseEvent(data="\n".join(data_lines), event=name)
