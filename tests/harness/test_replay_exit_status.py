"""How ``batchlab replay`` ends when its run fails mid-way: a ``--workers`` process that dies
is a failed run (exit 1) with what the others measured summarised, and a manifest that cannot
be written at the end never hides the error that stopped the run."""

from __future__ import annotations

import errno
import json
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import harness.cli.live as cli_live
import harness.live.workers as workers
import harness.manifest
from harness.cli import main as cli_main
from harness.live.config import ReplayConfig
from harness.live.recorder import RECORDS_FILE, RecordWriter, read_records
from harness.live.testing import FullAfter, ScheduledStreamServer, server_in_thread
from harness.traces import Trace, TraceRequest

WAIT_S = 90.0  # generous: the machine is shared; no assertion depends on speed


@pytest.fixture()
def server() -> Iterator[ScheduledStreamServer]:
    """The loopback server on its own event loop thread (worker processes reach it over TCP),
    streams of 1.5 s: a worker has requests in flight at any time."""
    with server_in_thread(ttft_s=0.01, itl_s=0.05) as srv:
        yield srv


def _trace(n: int) -> Trace:
    reqs = tuple(TraceRequest(f"r{i}", i * 0.05, 8, 30) for i in range(n))
    return Trace(reqs, source="test", format="test", digest="c" * 64)


def _kill_worker_once_it_recorded(out: Path, worker: int, num_rows: int) -> Any:
    """An ``on_t0`` for ``replay_workers`` that SIGKILLs worker ``worker`` (as the OOM killer
    would) once its records.jsonl holds ``num_rows`` requests."""
    def on_t0(_t0_ns: int) -> None:
        proc = next(p for p in mp.active_children() if p.name == f"batchlab-replay-w{worker}")
        records = out / "workers" / f"w{worker}" / RECORDS_FILE

        def watch() -> None:
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline:
                if records.exists() and len(read_records(records)) >= num_rows:
                    break
                time.sleep(0.02)
            assert proc.pid is not None
            os.kill(proc.pid, signal.SIGKILL)

        threading.Thread(target=watch, daemon=True).start()

    return on_t0


def test_a_worker_that_dies_keeps_the_others_results_and_its_requests_in_flight(
        server: ScheduledStreamServer, tmp_path: Path) -> None:
    """Issue case: a killed worker's requests in flight were counted as never sent
    (num_sent 30, num_recorded 31, and the two did not add up to the plan)."""
    out = tmp_path / "run"
    trace = _trace(120)
    with pytest.raises(workers.WorkerError, match="worker 1 was killed by SIGKILL") as info:
        workers.replay_workers(trace, ReplayConfig(target_url=server.url), out, num_workers=2,
                               on_t0=_kill_worker_once_it_recorded(out, 1, 2))
    summary = info.value.summary
    assert summary is not None
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == summary["status"] == "failed"
    assert "worker 1 was killed by SIGKILL" in manifest["errors"][0]
    # every request sent is a row, and the plan is what was recorded plus what was not sent
    assert manifest["num_sent"] == manifest["num_recorded"] == summary["num_requests"]
    assert manifest["num_planned"] == manifest["num_recorded"] + manifest["num_not_sent"] == 120
    table = pq.read_table(out / "requests.parquet").to_pydict()
    assert set(server.stats.request_ids) <= set(table["request_id"])  # none "never sent"
    survivor, dead = summary["workers"]
    assert survivor["status"] == "finished" and survivor["num_requests"] == 60
    assert dead["status"] == "died"
    recorded = read_records(out / "workers" / "w1" / RECORDS_FILE)
    lost = [(rid, kind, message) for rid, kind, message in zip(
        table["request_id"], table["error_kind"], table["error_message"], strict=True)
        if message and "worker 1 was killed by SIGKILL" in message]
    assert len(lost) == dead["num_sent_unrecorded"] >= 1
    assert all(kind == "not_finished" for _, kind, _ in lost)
    assert dead["num_requests"] == len(recorded) + len(lost)
    assert summary["failures"]["not_finished"] >= len(lost)
    dead_manifest = json.loads((out / "workers" / "w1" / "manifest.json").read_text())
    assert dead_manifest["status"] == "failed" and "SIGKILL" in dead_manifest["error"]


def test_a_worker_that_dies_is_a_failed_run_on_the_command_line(
        server: ScheduledStreamServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue case: exit 2 ("bad input") and no headline."""
    out = tmp_path / "run"
    real = workers.replay_workers

    def replay_workers(*args: Any, **kwargs: Any) -> dict[str, Any]:
        return real(*args, **kwargs, on_t0=_kill_worker_once_it_recorded(out, 1, 2))

    monkeypatch.setattr(workers, "replay_workers", replay_workers)
    code = cli_main(["replay", "--target", server.url, "--trace", "synthetic",
                     "--num-requests", "80", "--rate", "20", "--prompt-tokens", "8",
                     "--output-tokens", "30", "--workers", "2", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 1, captured.err
    assert "requests completed" in captured.out  # the headline of what was measured
    assert "error: replay --workers failed: worker 1 was killed by SIGKILL" in captured.err
    assert "Traceback" not in captured.err


# ---------------------------------------------------------------- a full disk




def _manifest_refused(run_dir: Path, fields: Any) -> None:
    path = run_dir / "manifest.json"
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


@pytest.fixture()
def full_disk_at_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """records.jsonl fills after 3 rows, and any manifest update of the server's record after
    that finds no room either (a server that answers ``/version``)."""
    original = RecordWriter.__init__
    full: list[bool] = []
    update = harness.manifest.update_manifest

    def init(self: RecordWriter, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self._file = FullAfter(self._file, 3, on_full=lambda: full.append(True))

    def update_unless_full(run_dir: Path, fields: Any) -> None:
        if full:
            _manifest_refused(run_dir, fields)
        update(run_dir, fields)

    monkeypatch.setattr(RecordWriter, "__init__", init)
    monkeypatch.setattr(cli_live, "_who_answers", lambda url: {"name": "x", "base_url": url})
    monkeypatch.setattr(harness.manifest, "update_manifest", update_unless_full)


def _replay(url: str, out: Path) -> list[str]:
    return ["replay", "--target", url, "--trace", "synthetic", "--num-requests", "40",
            "--rate", "50", "--prompt-tokens", "8", "--output-tokens", "4", "--out", str(out)]


def test_a_full_disk_is_said_even_when_the_manifest_cannot_be_updated_after_it(
        server: ScheduledStreamServer, tmp_path: Path, full_disk_at_the_end: None,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue case: the replay stopped on a full disk (records.jsonl, where, how many rows),
    and the manifest update of the server's record after it failed too: only "[Errno 28] No
    space left on device" was said, naming no file. The record is now written before the
    first request, while there is room: the run's own error is said, and the record kept."""
    out = tmp_path / "run"
    assert cli_main(_replay(server.url, out)) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    error = next(line for line in err.splitlines() if "error:" in line)
    assert "records.jsonl" in error and "3 of" in error  # the run's own error, not replaced
    assert "could not be updated" not in err
    assert len(read_records(out / RECORDS_FILE)) == 3
    assert json.loads((out / "manifest.json").read_text())["engine"]["name"] == "x"


def test_a_manifest_that_cannot_be_updated_after_a_good_run_is_an_error(
        server: ScheduledStreamServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """With no error on its way out, the manifest's failure is the run's: exit 1, named."""
    monkeypatch.setattr(cli_live, "_who_answers", lambda url: {"name": "x", "base_url": url})
    monkeypatch.setattr(harness.manifest, "update_manifest", _manifest_refused)
    out = tmp_path / "run"
    assert cli_main(_replay(server.url, out)) == 1
    err = capsys.readouterr().err
    assert f"error: {out / 'manifest.json'}: No space left on device" in err
