"""Helpers for the run-integrity tests: batchlab as a real subprocess, a loopback server, and
``ps`` to look for processes that outlived their run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.live.testing import server_process as loopback_process

REPO = Path(__file__).resolve().parents[3]
SMALL_TRACE = ("--model", "llama-3.1-8b", "--trace", "synthetic", "--num-requests", "3",
               "--rate", "20", "--prompt-tokens", "8", "--output-tokens", "4")
WAIT_S = 90.0  # generous: the machine is shared; no assertion depends on speed


def batchlab(*args: str) -> list[str]:
    return [sys.executable, "-m", "harness.cli", *args]


def run_batchlab(*args: str, cwd: Path | None = None,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(batchlab(*args), cwd=cwd or REPO, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300, check=False)


def start_batchlab(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(batchlab(*args), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


def wait_for(condition: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    """Poll ``condition`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def ps_survivors(pids: set[int], pgid: int | None = None) -> list[str]:
    """``ps`` lines of live (non-zombie) processes among ``pids`` or in group ``pgid``."""
    out = subprocess.run(["ps", "-eo", "pid=,pgid=,stat=,args="], capture_output=True,
                         text=True, check=True).stdout
    lines = []
    for line in out.splitlines():
        fields = line.split(None, 3)
        if len(fields) < 3 or fields[2].startswith("Z"):
            continue
        pid, group = int(fields[0]), int(fields[1])
        if pid in pids or (pgid is not None and group == pgid):
            lines.append(line.strip())
    return lines


def wait_no_survivors(pids: set[int], pgid: int | None = None) -> list[str]:
    """Poll ``ps`` (bounded) until none of ``pids`` / group ``pgid`` is alive; what is left."""
    deadline = time.monotonic() + WAIT_S
    left = ps_survivors(pids, pgid)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = ps_survivors(pids, pgid)
    return left


def children_of(pid: int) -> set[int]:
    """The pids of ``pid``'s child processes (``ps``)."""
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True,
                         text=True, check=False).stdout
    return {int(p) for p in out.split()}


def kill_quietly(pids: set[int]) -> None:
    """SIGKILL the process groups a failed test may have left (only ones it started)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def loopback() -> Iterator[str]:
    """The loopback test server (``harness.live.testing``) in its own process; its URL."""
    with loopback_process("--ttft-s", "0.01", "--itl-s", "0.01") as server:
        yield server.url


class Helpers:
    """The helpers above, for test modules (conftest is not importable by name)."""

    REPO = REPO
    SMALL_TRACE = SMALL_TRACE
    batchlab = staticmethod(batchlab)
    run = staticmethod(run_batchlab)
    start = staticmethod(start_batchlab)
    wait_for = staticmethod(wait_for)
    read_json = staticmethod(read_json)
    ps_survivors = staticmethod(ps_survivors)
    wait_no_survivors = staticmethod(wait_no_survivors)
    children_of = staticmethod(children_of)
    kill_quietly = staticmethod(kill_quietly)


@pytest.fixture(scope="session")
def bl() -> type[Helpers]:
    return Helpers
