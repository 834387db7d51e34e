"""``replay --workers N`` stopped by a signal: every worker records its requests in flight as
``not_finished``, and the run's counts add up, whichever process the signal reached and
whatever signals the run inherited ignored."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from harness.live.recorder import RECORDS_FILE, read_records
from harness.live.testing import server_process

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 90.0  # generous: the machine is shared; no assertion depends on speed
NUM_REQUESTS = 3000  # at 20/s, minutes of arrivals: a run that ends on its own failed the test


@pytest.fixture(scope="module")
def loopback() -> Iterator[str]:
    """The loopback server, streams of 0.8 s: a replay has requests in flight at any time."""
    with server_process("--ttft-s", "0.01", "--itl-s", "0.02") as server:
        yield server.url


def _command(url: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "harness.cli", "replay", "--target", url, "--trace",
            "synthetic", "--num-requests", str(NUM_REQUESTS), "--rate", "20",
            "--prompt-tokens", "8", "--output-tokens", "40", "--workers", "2",
            "--out", str(out)]


def _wait_for(condition: Callable[[], Any], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def _rows_in(path: Path) -> int:
    return len(read_records(path)) if path.exists() else 0  # finished ones, not just sent


def _stopped(command: list[str], out: Path, stop: Callable[[subprocess.Popen[str]], None],
             ) -> tuple[int, str]:
    """Start the replay in a process group of its own, ``stop`` it once each worker has
    recorded three requests; its exit status and stderr."""
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        _wait_for(lambda: all(_rows_in(out / "workers" / w / RECORDS_FILE) >= 3
                              for w in ("w0", "w1")), "three requests recorded by each worker")
        stop(proc)
        _, err = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, err


def _check_interrupted(out: Path) -> None:
    """Both workers stopped as on Ctrl-C, and every request sent is a row, once."""
    manifest = json.loads((out / "manifest.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    assert manifest["status"] == summary["status"] == "interrupted"
    rows = 0
    for w in ("w0", "w1"):
        worker = json.loads((out / "workers" / w / "manifest.json").read_text())
        recorded = read_records(out / "workers" / w / RECORDS_FILE)
        assert worker["status"] == "interrupted"
        assert worker["num_sent"] == worker["num_recorded"] == len(recorded)
        assert any(r.error_kind == "not_finished" for r in recorded), "in flight: rows too"
        rows += len(recorded)
    assert manifest["num_sent"] == manifest["num_recorded"] == summary["num_requests"] == rows
    assert manifest["num_planned"] == NUM_REQUESTS
    assert manifest["num_recorded"] + manifest["num_not_sent"] == NUM_REQUESTS
    assert summary["failures"]["not_finished"] >= 2
    assert pq.read_table(out / "requests.parquet").num_rows == rows
    assert [w["status"] for w in summary["workers"]] == ["interrupted", "interrupted"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_the_process_group_loses_no_request(tmp_path: Path, loopback: str,
                                                        sig: signal.Signals) -> None:
    """Issue case: `timeout` (and systemd) signal the whole group. The workers died of the
    signal: their requests in flight became "never sent" (num_sent 0), no not_finished row,
    their manifests stayed "running"."""
    out = tmp_path / "run"
    code, err = _stopped(_command(loopback, out), out, lambda p: os.killpg(p.pid, sig))
    assert code == 128 + sig, err
    assert f"interrupted by {sig.name}" in err and "Traceback" not in err
    _check_interrupted(out)


def test_a_parent_started_with_sigint_ignored_still_stops_its_workers(
        tmp_path: Path, loopback: str) -> None:
    """Issue case: started with `&` from a script (SIGINT ignored, inherited by the workers)
    and sent SIGTERM, the parent passed SIGINT on to its workers, which ignored it: the run
    went on to its end, then said "interrupted"."""
    out = tmp_path / "run"
    command = ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *_command(loopback, out)]
    code, err = _stopped(command, out, lambda p: p.send_signal(signal.SIGTERM))
    assert code == 128 + signal.SIGTERM, err
    _check_interrupted(out)
    assert json.loads((out / "summary.json").read_text())["num_requests"] < NUM_REQUESTS
