"""What a replay's exit status and warnings say about a run that partly failed or got short
answers: a nightly job must be able to fail on either."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from harness.cli import main
from harness.live.testing import ScheduledStreamServer

REPO = Path(__file__).resolve().parents[3]
TRACE = str(REPO / "harness" / "data" / "azure_conv_excerpt.csv")


@contextmanager
def serving(**kw: Any) -> Iterator[str]:
    """The stand-in server on its own event loop in a thread; its URL."""
    started, stop = threading.Event(), threading.Event()
    url: list[str] = []

    async def run() -> None:
        async with ScheduledStreamServer(ttft_s=0.005, itl_s=0.001, **kw) as server:
            url.append(server.url)
            started.set()
            while not stop.is_set():
                await asyncio.sleep(0.02)

    thread = threading.Thread(target=asyncio.run, args=(run(),), daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield url[0]
    finally:
        stop.set()
        thread.join(10)


def replay(url: str, out: Path, *extra: str) -> list[str]:
    return ["replay", "--target", url, "--trace", TRACE, "--limit", "10", "--time-scale",
            "0.001", "--output-tokens", "6", "--out", str(out), *extra]


def test_max_failed_turns_partial_failure_into_a_failing_exit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with serving(faults={"0": "500", "1": "500"}) as url:
        assert main(replay(url, tmp_path / "default")) == 0  # 2 of 10 failed: said, exit 0
        assert main(replay(url, tmp_path / "strict", "--max-failed", "0.1")) == 1
        assert main(replay(url, tmp_path / "loose", "--max-failed", "0.2")) == 0
    err = capsys.readouterr().err
    assert ("error: 2 of 10 requests failed (20.0%), more than --max-failed 0.1 "
            "(failures: {'http_error': 2})") in err
    assert (tmp_path / "strict" / "requests.parquet").exists()  # the results are kept
    with pytest.raises(SystemExit) as refused:
        main(["replay", "--target", "http://127.0.0.1:9", "--trace", TRACE,
              "--max-failed", "2", "--out", str(tmp_path / "x")])
    assert refused.value.code == 2
    assert "--max-failed: expected a fraction in [0, 1], got '2'" in capsys.readouterr().err


def test_short_answers_are_warned_about(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    # a server that stops at 2 tokens when not told to ignore EOS
    with serving(eos_after_tokens=2) as url:
        assert main(replay(url, tmp_path / "run", "--length-control", "max_tokens")) == 0
    err = capsys.readouterr().err
    assert ("warning: 10 of 10 completed requests returned fewer output tokens than the trace "
            "asks: the server stopped them early") in err
