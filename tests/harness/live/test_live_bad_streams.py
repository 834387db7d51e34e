"""Streams a server should not send: events whose JSON is not the protocol's, and more tokens
than a request asked for.

Issue cases (review of the live client): a server that streamed
``data: {"id":"x","choices":"oops"}`` then ``[DONE]`` (or no ``choices`` at all, or
``"text": 5``) had its requests counted completed, with 0 output tok/s and exit 0; one that
streamed 12 tokens for ``max_tokens`` 4 gave ``fraction_reached_target: 1.0``, no warning, and
three times the throughput the trace asks for.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from harness.cli import main
from harness.cli.common import print_live_headline
from harness.live.protocols import parse_stream
from harness.metrics import summarize
from harness.timeline import RequestTimeline

Events = Callable[[dict[str, Any]], list[Any]]  # request body -> the events to stream


def sse(events: list[Any], *, done: bool = True) -> bytes:
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    return body + (b"data: [DONE]\n\n" if done else b"")


class _FakeServer(ThreadingHTTPServer):
    daemon_threads = True
    events: Events


class _Handler(BaseHTTPRequestHandler):
    """Answers every POST with the events its server's ``events`` gives for the body, as one
    SSE body; every GET (the replay's /version and /info probes) with 404."""

    protocol_version = "HTTP/1.1"
    server: _FakeServer

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        body = sse(self.server.events(request))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture()
def serve() -> Iterator[Callable[[Events], str]]:
    """Start a fake server streaming ``events``; its URL. Stopped after the test."""
    servers: list[_FakeServer] = []

    def start(events: Events) -> str:
        server = _FakeServer(("127.0.0.1", 0), _Handler)
        server.events = events
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def replay(url: str, out: Path, *extra: str) -> list[str]:
    return ["replay", "--target", url, "--model", "m", "--trace", "synthetic",
            "--num-requests", "3", "--prompt-tokens", "4", "--output-tokens", "4",
            "--rate", "inf", "--out", str(out), *extra]


# ---------------------------------------------------------------- malformed events


BAD_OPENAI = [
    ("openai", {"id": "x", "choices": "oops"}, "choices is not a list"),
    ("openai", {"id": "x"}, "no choices list"),
    ("openai", {"id": "x", "choices": [{"text": 5}]}, "choices[0].text is not a string"),
    ("openai", {"id": "x", "choices": ["a"]}, "choices[0] is not an object"),
    ("openai-chat", {"choices": [{"delta": "a"}]}, "choices[0].delta is not an object"),
    ("openai-chat", {"choices": [{"delta": {"content": 5}}]},
     "choices[0].delta.content is not a string"),
    ("openai-chat", {"choices": [{"delta": {"content": "a", "reasoning_content": ["b"]}}]},
     "choices[0].delta.reasoning_content is not a string"),
]


@pytest.mark.parametrize(("protocol", "event", "said"), BAD_OPENAI)
def test_an_openai_event_of_the_wrong_shape_fails_its_request(
        protocol: Any, event: dict[str, Any], said: str) -> None:
    good = ({"choices": [{"delta": {"content": "a"}}]} if protocol == "openai-chat"
            else {"choices": [{"text": "a"}]})
    out = parse_stream(protocol, [sse([good, event, good])])
    assert out.error_kind == "protocol_error" and not out.completed
    assert said in out.error_message and json.dumps(event)[:20] in out.error_message
    assert out.chunk_num_tokens == (1,)  # the chunk before it is kept; nothing after is read


BAD_TGI = [
    ({"token": "oops", "generated_text": None, "details": None}, "token is not an object"),
    ({"token": {"id": 1, "text": 5, "special": False}}, "token.text is not a string"),
    ({"token": {"id": 1, "text": "a"}, "generated_text": 5}, "generated_text is not a string"),
    ({"token": {"id": 1, "text": "a"}, "generated_text": "a", "details": "x"},
     "details is not an object"),
    ({"index": 3}, "no token, generated_text or details"),
]


@pytest.mark.parametrize(("event", "said"), BAD_TGI)
def test_a_tgi_event_of_the_wrong_shape_fails_its_request(event: dict[str, Any],
                                                          said: str) -> None:
    good = {"token": {"id": 1, "text": "a", "special": False}, "generated_text": None}
    out = parse_stream("tgi", [sse([good, event], done=False)])
    assert out.error_kind == "protocol_error" and said in out.error_message
    assert out.chunk_num_tokens == (1,)


GOOD = [  # legitimate events around one token "a": each stream completes with one chunk
    ("openai", [{"choices": [{"text": "a"}]}, {"choices": [{"text": ""}]},
                {"choices": [{"text": None, "finish_reason": "length"}]},
                {"choices": [], "usage": {"completion_tokens": 1, "prompt_tokens": 3}}]),
    ("openai", [{"choices": [{"text": "a", "finish_reason": "length"}]},
                {"usage": {"completion_tokens": 1}}]),  # a trailer without choices
    ("openai", [{"choices": [{"text": "a", "finish_reason": "length"}]},
                {"timings": {"predicted_n": 1}}]),
    ("openai-chat", [{"choices": [{"delta": {"role": "assistant", "content": None}}]},
                     {"choices": [{"delta": {"role": "assistant", "content": ""}}]},
                     {"choices": [{"delta": {"content": "a", "reasoning_content": None}}]},
                     {"choices": [{"delta": {}, "finish_reason": "length"}]},
                     {"choices": [], "usage": {"completion_tokens": 1}}]),
    ("openai-chat", [{"choices": [{"delta": {"reasoning": "a"}}]},
                     {"choices": [{"delta": None, "finish_reason": "stop"}]}]),
]


@pytest.mark.parametrize(("protocol", "events"), GOOD)
def test_legitimate_events_stay_accepted(protocol: Any, events: list[Any]) -> None:
    body = b": keep-alive\n\n" + sse(events)
    out = parse_stream(protocol, [body])
    assert out.error_kind is None and out.completed, out.error_message
    assert out.num_chunk_tokens == 1


def test_tgi_special_tokens_and_the_final_event_stay_accepted() -> None:
    events = [{"index": 1, "token": {"id": 1, "text": "a", "special": False},
               "generated_text": None, "details": None},
              {"index": 2, "token": {"id": 2, "text": None, "special": True},
               "generated_text": "a", "details": {"finish_reason": "eos_token",
                                                  "generated_tokens": 2}}]
    out = parse_stream("tgi", [sse(events, done=False)])
    assert out.error_kind is None and out.completed and out.usage_num_output_tokens == 2


@pytest.mark.parametrize("event", [{"id": "x", "choices": "oops"}, {"id": "x"},
                                   {"id": "x", "choices": [{"text": 5}]}])
@pytest.mark.parametrize("http_client", ["lean", "httpx"])
def test_a_server_of_malformed_events_completes_no_request(
        serve: Callable[[Events], str], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        event: dict[str, Any], http_client: str) -> None:
    url = serve(lambda _request: [event])
    out = tmp_path / "run"
    assert main(replay(url, out, "--http-client", http_client)) == 1
    err = capsys.readouterr().err
    assert "none of the 3 requests completed" in err and "protocol_error" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_completed"] == 0 and summary["failures"] == {"protocol_error": 3}


# ---------------------------------------------------------------- over-generation


def _over_generating(request: dict[str, Any]) -> list[Any]:
    """Three times ``max_tokens`` tokens, with vLLM's running usage (an exact count)."""
    n = 3 * int(request["max_tokens"])
    return [{"id": "x", "choices": [{"index": 0, "text": " t",
                                     "finish_reason": "length" if i == n - 1 else None}],
             "usage": {"prompt_tokens": 4, "completion_tokens": i + 1}} for i in range(n)]


def test_a_server_that_ignores_max_tokens_is_counted_and_warned_of(
        serve: Callable[[Events], str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(replay(serve(_over_generating), out)) == 0  # measured; said, not failed
    fidelity = json.loads((out / "summary.json").read_text())["output_length_fidelity"]
    assert fidelity["num_over_target"] == 3 and fidelity["num_reached_target"] == 3
    assert fidelity["num_over_target_client_counted"] == 0
    err = capsys.readouterr().err
    assert ("warning: 3 of 3 completed requests returned more output tokens than the trace "
            "asks (by the server's own count): the server did not honour max_tokens") in err


def _timeline(i: int, num_output: int, source: str) -> RequestTimeline:
    return RequestTimeline(f"r{i}", 0.0, 4, 4, chunk_times_s=(0.1,), chunk_num_tokens=(1,),
                           finished_s=0.2, num_output_tokens=num_output,
                           token_count_source=source)


def test_over_generation_is_counted_apart_by_who_counted() -> None:
    timelines = [_timeline(0, 12, "usage"), _timeline(1, 5, "usage_total"),
                 _timeline(2, 6, "tokenizer"), _timeline(3, 9, "chunks"),
                 _timeline(4, 4, "usage"), _timeline(5, 2, "usage")]
    fidelity = summarize(timelines)["output_length_fidelity"]
    assert fidelity == {"num_reached_target": 5, "fraction_reached_target": 5 / 6,
                        "num_over_target": 2, "num_over_target_client_counted": 2}


def test_the_headline_says_how_over_generation_was_counted(
        capsys: pytest.CaptureFixture[str]) -> None:
    print_live_headline(summarize([_timeline(0, 6, "tokenizer"), _timeline(1, 4, "usage")]))
    err = capsys.readouterr().err
    assert "1 of 2 completed requests returned more output tokens than the trace asks as " \
           "the client counted them" in err
    assert "by the server's own count" not in err
    print_live_headline(summarize([_timeline(0, 4, "usage")]))
    assert "more output tokens" not in capsys.readouterr().err
