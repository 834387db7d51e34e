"""How fast the SSE decoder frames a stream, for small events and for one giant event.

Feeds ``harness.live.sse_framing.SseDecoder`` (no size cap here) the same total of bytes two
ways, in 64 KiB reads as a socket delivers them:

- 16,384 events of 1 KiB each (a stream of ordinary token events);
- one event of 16 MiB (what a runaway or hostile server can send).

and prints MB/s for each, and the giant/small ratio: a linear decoder keeps it near 1. The
baseline is the decoder batchlab had before (copied below as ``QuadraticDecoder``): it joined
the whole unfinished buffer with each read and rescanned it, so one 16 MiB event cost it
O(size² / read size); the script prints the new decoder's speed-up over it on both streams.

First both decoders decode both streams once and must return the same events (exit status 1
if not). Then each is timed ``--repeat`` times on each stream, the two taking turns so that
drift in the machine's speed hits both, and the best run of each is compared.

    .venv/bin/python bench/sse_parse.py [--mib 16] [--read-kib 64] [--repeat 3]

Takes about 11 s with the defaults, almost all of it the baseline on the giant event (four
times 2.5 s: the check, then three timed runs).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence

from harness.live.sse_framing import SseDecoder, SseEvent, _parse_block


class QuadraticDecoder:
    """The decoder before the rewrite (harness/live/protocols.py at commit 6e57adf), verbatim
    but for the name: the baseline."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[SseEvent]:
        buf = self._buffer + data if self._buffer else data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        events: list[SseEvent] = []
        start = 0
        while True:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            event = _parse_block(buf[start:end])
            if event is not None:
                events.append(event)
            start = end + 2
        self._buffer = buf[start:]
        return events


def stream(event_bytes: int, total_bytes: int) -> bytes:
    """``total_bytes`` of ``data: xxx…\\n\\n`` events, each ``event_bytes`` long."""
    payload = b"data: " + b"x" * (event_bytes - 8) + b"\n\n"
    return payload * (total_bytes // event_bytes)


def reads(body: bytes, read_bytes: int) -> list[bytes]:
    return [body[i:i + read_bytes] for i in range(0, len(body), read_bytes)]


def decode_once_s(make: Callable[[], object], pieces: Sequence[bytes]) -> float:
    """Seconds to feed every piece to a fresh decoder, once."""
    feed = make().feed  # type: ignore[attr-defined]
    t0 = time.perf_counter()
    n = 0
    for piece in pieces:
        n += len(feed(piece))
    seconds = time.perf_counter() - t0
    assert n > 0
    return seconds


def decoded(make: Callable[[], object], pieces: Sequence[bytes]) -> list[SseEvent]:
    """Every event a fresh decoder returns for ``pieces``, in order."""
    feed = make().feed  # type: ignore[attr-defined]
    return [event for piece in pieces for event in feed(piece)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=16, help="bytes of each stream, in MiB")
    p.add_argument("--read-kib", type=int, default=64, help="bytes per socket read, in KiB")
    p.add_argument("--repeat", type=int, default=3,
                   help="timed runs of each decoder on each stream, best of N (3)")
    args = p.parse_args()
    if min(args.mib, args.read_kib, args.repeat) < 1:
        p.error("--mib, --read-kib and --repeat must each be at least 1")
    total = args.mib << 20
    read = args.read_kib << 10
    cases = {"1 KiB events": reads(stream(1 << 10, total), read),
             f"one {args.mib} MiB event": reads(stream(total, total), read)}
    decoders: dict[str, Callable[[], object]] = {
        "linear (now)": lambda: SseDecoder(max_event_bytes=None),
        "quadratic (before)": QuadraticDecoder,
    }
    now, before = decoders
    print(f"{args.mib} MiB fed in {args.read_kib} KiB reads")
    for cname, pieces in cases.items():  # the speeds mean nothing if the events differ
        events = {dname: decoded(make, pieces) for dname, make in decoders.items()}
        same = events[now] == events[before]
        print(f"{cname}: {len(events[now]):,} events now, {len(events[before]):,} before; "
              f"identical events: {same}", flush=True)
        if not same:
            print(f"the two decoders disagree on {cname}: no timing", file=sys.stderr)
            return 1
    seconds: dict[tuple[str, str], list[float]] = {(d, c): [] for d in decoders for c in cases}
    for i in range(args.repeat):
        # Both decoders run the same number of times, taking turns to go first, so that drift
        # in the machine's speed hits both; a shared machine's noise only ever adds time.
        order = list(decoders) if i % 2 == 0 else list(decoders)[::-1]
        for cname, pieces in cases.items():
            for dname in order:
                seconds[dname, cname].append(decode_once_s(decoders[dname], pieces))
    print(f"\nbest of {args.repeat} runs for each decoder, the two taking turns")
    print(f"{'decoder':<20}{'stream':<22}{'seconds':>9}{'MB/s':>10}   every run (s)")
    mbs: dict[tuple[str, str], float] = {}
    for dname in decoders:
        for cname in cases:
            best = min(seconds[dname, cname])
            mbs[dname, cname] = total / best / 1e6
            runs = " ".join(f"{t:.3f}" for t in seconds[dname, cname])
            print(f"{dname:<20}{cname:<22}{best:9.3f}{mbs[dname, cname]:10.0f}   {runs}")
    small, giant = cases
    print(f"\ngiant/small speed ratio: now {mbs[now, giant] / mbs[now, small]:.2f}, before "
          f"{mbs[before, giant] / mbs[before, small]:.4f} (1.0 = the same speed for any size)")
    print(f"speed-up over the quadratic baseline: {mbs[now, small] / mbs[before, small]:.2f}x "
          f"on 1 KiB events, {mbs[now, giant] / mbs[before, giant]:.0f}x on the giant event")
    return 0


if __name__ == "__main__":
    sys.exit(main())
