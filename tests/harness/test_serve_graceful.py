"""SIGTERM to `batchlab serve reference`: new connections are refused at once, the requests
already open keep streaming for up to the graceful period (5 s) and finish normally when they
can, and those still open then end with the engine's shutdown error, not a cut connection.

Issue case: the server ended every open stream the moment it got SIGTERM, though
docs/reference-server.md says it lets them finish for up to 5 s."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 120.0  # generous: the machine is shared; nothing below depends on speed
# About 23 ms a step: a 40-token request needs about 1 s, well inside the 5 s grace; a
# 5000-token one about two minutes, well past it.
SHORT, LONG = 40, 5000


@pytest.fixture
def served() -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`batchlab serve reference` in a process of its own on a free port; its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "serve", "reference", "--model", "llama-3.1-70b",
         "--gpu", "a100-80gb", "--tensor-parallel-size", "4", "--port", "0"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on " in line, line + (proc.stderr.read() if proc.stderr else "")
        yield line.split("listening on ")[1].split()[0], proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=WAIT_S)


class _Stream(threading.Thread):
    """One streamed /v1/completions request, read to its end on a thread of its own."""

    def __init__(self, url: str, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.url, self.max_tokens = url, max_tokens
        self.events: list[str] = []
        self.first_token = threading.Event()
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.stream("POST", self.url + "/v1/completions", trust_env=False,
                              timeout=WAIT_S, json={"prompt": "hi", "stream": True,
                                                    "max_tokens": self.max_tokens}) as response:
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line.removeprefix("data: "))
                        self.first_token.set()
        except BaseException as exc:  # a cut connection: the test says so below
            self.failure = exc
        finally:
            self.first_token.set()

    def tokens(self) -> list[dict[str, object]]:
        return [json.loads(e) for e in self.events if e != "[DONE]" and '"error"' not in e]


def _refused(url: str) -> bool:
    """Whether a new request is turned away: its connection refused, or (caught in the
    listener's backlog as it closed) closed without an answer."""
    try:
        httpx.get(url + "/health", trust_env=False, timeout=WAIT_S)
    except (httpx.NetworkError, httpx.RemoteProtocolError):
        return True
    return False


def test_sigterm_lets_open_streams_finish_and_ends_the_rest(
        served: tuple[str, subprocess.Popen[str]]) -> None:
    url, proc = served
    short, long = _Stream(url, SHORT), _Stream(url, LONG)
    long.start()
    short.start()
    assert short.first_token.wait(WAIT_S) and long.first_token.wait(WAIT_S)
    assert short.failure is None and long.failure is None

    proc.send_signal(signal.SIGTERM)
    # no new connection is admitted...
    deadline = time.monotonic() + WAIT_S  # bounds a hang; no assertion on how fast
    while not _refused(url):
        assert proc.poll() is None and time.monotonic() < deadline, "never refused"
        time.sleep(0.05)
    seen_when_refused = len(long.events)
    short.join(WAIT_S)
    long.join(WAIT_S)
    assert not short.is_alive() and not long.is_alive()

    # ... while the open ones went on: the short one to its normal end
    assert short.failure is None, short.failure
    assert short.events[-1] == "[DONE]"
    tokens = short.tokens()
    assert len(tokens) == SHORT
    assert tokens[-1]["choices"][0]["finish_reason"] == "length"  # type: ignore[index]
    assert not any('"error"' in e for e in short.events)

    # the long one kept streaming after the server stopped taking connections, then was
    # ended by the engine (an error event and [DONE]), not cut
    assert long.failure is None, long.failure
    assert len(long.events) > seen_when_refused + 1
    assert long.events[-1] == "[DONE]"
    assert json.loads(long.events[-2])["error"]["message"] == "the server is shutting down"
    assert len(long.tokens()) < LONG

    assert proc.wait(timeout=WAIT_S) == 0
    assert proc.stderr is not None
    assert "Traceback" not in proc.stderr.read()


def test_sigterm_with_nothing_open_stops_at_once(
        served: tuple[str, subprocess.Popen[str]]) -> None:
    """No stream to wait for: nothing holds the shutdown (the generous timeout only bounds a
    hang)."""
    url, proc = served
    with httpx.Client(trust_env=False, timeout=WAIT_S) as client:  # an idle keep-alive one
        assert client.get(url + "/health").status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT_S) == 0
