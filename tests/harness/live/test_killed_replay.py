"""A replay killed outright (SIGKILL: no handler of its own runs) loses no request it sent:
each is on disk (``records.jsonl``) from the moment it goes out, so ``batchlab summarize``
makes the ones in flight ``not_finished`` rows and says how much of the trace was never sent.
Under ``--workers``, the workers of a parent killed outright record theirs and say why they
stopped, and a worker killed outright is named, with how it died, in the run's error."""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import harness.live.workers as workers
from harness.cli import main as cli_main
from harness.live.config import ReplayConfig
from harness.live.recorder import (
    RECORDS_FILE,
    RecordWriter,
    SentRecord,
    load_records,
    read_records,
    record_to_timeline,
)
from harness.live.rundir import rebuild_summary
from harness.live.testing import FullAfter, ScheduledStreamServer, server_in_thread
from harness.live.wire import MemoryWire, Reply
from harness.runfolder import RunWriteError
from harness.traces import Trace, TraceRequest

REPO = Path(__file__).resolve().parents[3]
WAIT_S = 90.0  # generous: the machine is shared; no assertion depends on speed
NUM_REQUESTS = 40
GAP_S = 0.1  # between arrivals
SHORT = 3  # output tokens: such a request ends within a tenth of a second
LONG = 100_000  # output tokens: such a request cannot end while a test runs


@pytest.fixture(scope="module")
def server() -> Iterator[ScheduledStreamServer]:
    """The loopback server on a thread of its own (replay processes reach it over TCP)."""
    with server_in_thread(ttft_s=0.01, itl_s=0.02) as srv:
        yield srv


def _wait_for(condition: Callable[[], Any], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def _mixed_trace_file(path: Path) -> Path:
    """An Azure-format trace, one request every ``GAP_S``: even ones short, odd ones endless
    (so under --workers 2, worker 0 gets the short ones and worker 1 the endless ones)."""
    start = datetime(2024, 1, 1)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i in range(NUM_REQUESTS):
        at = start + timedelta(seconds=i * GAP_S)
        lines.append(f"{at:%Y-%m-%d %H:%M:%S.%f}0,8,{SHORT if i % 2 == 0 else LONG}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _mixed_trace() -> Trace:
    reqs = tuple(TraceRequest(f"r{i}", i * GAP_S, 8, SHORT if i % 2 == 0 else LONG)
                 for i in range(NUM_REQUESTS))
    return Trace(reqs, source="test", format="test", digest="d" * 64)


def _finished_and_in_flight(records: Path, num_finished: int, num_in_flight: int) -> bool:
    """``records`` holds ``num_finished`` finished requests and ``num_in_flight`` sent ones
    with no row yet."""
    if not records.exists():
        return False
    read = load_records(records)
    return (sum(tl.ok for tl in read.rows) >= num_finished
            and len(read.unrecorded) >= num_in_flight)


def _start_replay(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "harness.cli", "replay", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _children_of(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True,
                         text=True, check=False).stdout
    return {int(p) for p in out.split()}


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _kill(proc: subprocess.Popen[str], others: Iterable[int] = ()) -> None:
    """What a failed test left running (only processes it started)."""
    if proc.poll() is None:
        proc.kill()
        proc.communicate(timeout=WAIT_S)
    for pid in others:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------- one process


def test_a_replay_killed_outright_keeps_the_requests_it_had_in_flight(
        server: ScheduledStreamServer, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue case: SIGKILL of the replay lost its requests in flight (records.jsonl held
    finished requests only): summarize said every request sent had completed, num_planned and
    num_not_sent stayed empty although the manifest knew the trace, and the report said the
    figures covered the requests the run sent."""
    out = tmp_path / "run"
    proc = _start_replay("--target", server.url, "--trace",
                         str(_mixed_trace_file(tmp_path / "trace.csv")), "--out", str(out))
    try:
        _wait_for(lambda: _finished_and_in_flight(out / RECORDS_FILE, 2, 2),
                  "two requests finished and two in flight")
        proc.kill()
        proc.communicate(timeout=WAIT_S)
    finally:
        _kill(proc)
    on_disk = load_records(out / RECORDS_FILE)
    in_flight = {tl.request_id for tl in on_disk.unrecorded}
    assert len(in_flight) >= 2 and on_disk.sends_recorded

    capsys.readouterr()
    assert cli_main(["summarize", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    sent = len(on_disk.rows) + len(in_flight)
    assert (f"it sent; the {len(in_flight)} in flight when it stopped are rows as "
            f"not_finished, and {NUM_REQUESTS - sent} were never sent"
            in capsys.readouterr().err)
    assert summary["num_requests"] == sent
    assert summary["num_completed"] >= 2
    assert summary["failures"]["not_finished"] == summary["num_sent_unrecorded"] == len(in_flight)
    assert summary["status"] == "running"  # nothing said how it ended
    assert summary["num_planned"] == NUM_REQUESTS
    assert summary["num_not_sent"] == NUM_REQUESTS - sent
    rows = pq.read_table(out / "requests.parquet").to_pylist()
    cut = [r for r in rows if r["error_kind"] == "not_finished"]
    assert {r["request_id"] for r in cut} == in_flight
    assert all("killed before this request finished" in r["error_message"]
               and r["sent_s"] is not None for r in cut)
    # the manifest has the counts the run never wrote (what the report says), not a status
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "running"
    assert (manifest["num_planned"], manifest["num_not_sent"], manifest["num_sent"]) == (
        NUM_REQUESTS, NUM_REQUESTS - sent, sent)
    from harness.report import load_run

    ended = load_run(out).ended_early or ""
    assert "killed while it ran" in ended
    assert f"with {len(in_flight)} requests in flight (rows as not_finished)" in ended
    if sent < NUM_REQUESTS:
        assert f"{NUM_REQUESTS - sent} requests of the trace were never sent" in ended
    assert not load_run(out).in_flight_lost  # the report's "figures cover what it sent"


def test_records_from_before_sent_records_summarize_as_they_did(tmp_path: Path) -> None:
    """A records.jsonl without sent records (header version 1, finished requests only) of a
    run killed outright: rebuilt from its rows alone, nothing guessed about what was in flight
    or never sent, and its manifest left as it was."""
    trace = Trace(tuple(TraceRequest(f"r{i}", i * 0.01, 8, 3) for i in range(4)),
                  source="test", format="test", digest="e" * 64)
    config = ReplayConfig(target_url="http://memory", protocol="openai", model="m")
    asyncio.run(_memory_replay(trace, config, tmp_path))
    records = tmp_path / RECORDS_FILE
    lines = records.read_text().splitlines()
    old = [lines[0].replace('"batchlab_records": 2', '"batchlab_records": 1')]
    old += [line for line in lines[1:] if '"batchlab_sent"' not in line]
    # and one request cut in flight by the kill: an older file has nothing of it
    old = old[:-1]
    records.write_text("\n".join(old) + "\n")
    for name in ("summary.json", "requests.parquet", "chunks.parquet"):
        (tmp_path / name).unlink()
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    for key in ("num_planned", "num_not_sent", "num_sent", "num_recorded"):
        del manifest[key]
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, "status": "running"}))
    before = (tmp_path / "manifest.json").read_bytes()
    summary = rebuild_summary(tmp_path)
    assert summary["num_requests"] == summary["num_completed"] == 3
    for key in ("num_planned", "num_not_sent", "num_sent_unrecorded"):
        assert key not in summary
    assert not load_records(records).sends_recorded
    assert (tmp_path / "manifest.json").read_bytes() == before
    from harness.report import load_run

    # what it cannot know, the report does not claim: its figures lack what was in flight
    cell = load_run(tmp_path)
    assert cell.in_flight_lost
    assert "the requests in flight then are not among its figures" in (cell.ended_early or "")


async def _memory_replay(trace: Trace, config: ReplayConfig, out: Path) -> dict[str, Any]:
    """A whole replay over an in-memory wire (every request answered at once)."""
    from harness.live.replay import replay

    def reply(req: TraceRequest, body: bytes) -> Reply:
        event = {"id": "c", "object": "text_completion", "model": "m",
                 "choices": [{"index": 0, "text": "t", "finish_reason": "length"}],
                 "usage": {"prompt_tokens": 8, "completion_tokens": 3, "total_tokens": 11}}
        return [(0.001, b"data: " + json.dumps(event).encode() + b"\n\n"),
                (0.0, b"data: [DONE]\n\n")]

    return await replay(trace, config, out, wire=MemoryWire(reply))


def test_a_sent_record_is_the_requests_row_until_its_own_comes() -> None:
    """What a sent record says, to this reader and to one that knows nothing of them."""
    req = TraceRequest('r"1', 0.5, 8, 3, priority=2)
    line = SentRecord(req).line(0.5, 0.625, 0.6251)
    row = json.loads(line)
    assert row["batchlab_sent"] == 1
    del row["batchlab_sent"]
    tl = record_to_timeline(row)  # an older reader: a not_finished row, then its own wins
    assert (tl.request_id, tl.arrival_s, tl.scheduled_s, tl.sent_s) == ('r"1', 0.5, 0.625,
                                                                         0.6251)
    assert (tl.priority, tl.error_kind, tl.ok) == (2, "not_finished", False)


def test_a_sent_record_the_disk_refuses_stops_the_run_as_a_refused_row_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk met by a sent record: the run stops there (nothing more is sent), the
    request it was for is a row of the summary, and the error says where it stopped."""
    original = RecordWriter.__init__

    def init(self: RecordWriter, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self._file = FullAfter(self._file, 0)  # after the header, nothing fits

    monkeypatch.setattr(RecordWriter, "__init__", init)
    trace = Trace(tuple(TraceRequest(f"r{i}", float(i), 8, 3) for i in range(5)),
                  source="test", format="test", digest="f" * 64)
    wire = MemoryWire(lambda req, body: [(30.0, b"data: [DONE]\n\n")])
    config = ReplayConfig(target_url="http://memory", protocol="openai", model="m")
    from harness.live.replay import replay

    with pytest.raises(RunWriteError, match=r"No space left on device.* 0 of 1 requests"):
        asyncio.run(replay(trace, config, tmp_path, wire=wire))
    assert wire.sent == ["r0"]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["status"] == "failed"
    assert (manifest["num_sent"], manifest["num_recorded"], manifest["num_not_sent"]) == (1, 1, 4)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["failures"] == {"not_finished": 1}
    assert read_records(tmp_path / RECORDS_FILE) == []


# ---------------------------------------------------------------- --workers


def test_workers_whose_parent_is_killed_record_their_requests_in_flight(
        server: ScheduledStreamServer, tmp_path: Path) -> None:
    """Issue case: with --workers, SIGKILL of the parent made each worker exit at once: its
    requests in flight were never written as not_finished, summarize counted only finished
    requests, and every worker's manifest stayed "running"."""
    out = tmp_path / "run"
    proc = _start_replay("--target", server.url, "--trace",
                         str(_mixed_trace_file(tmp_path / "trace.csv")), "--workers", "2",
                         "--out", str(out))
    children: set[int] = set()
    try:
        w0, w1 = (out / "workers" / w / RECORDS_FILE for w in ("w0", "w1"))
        _wait_for(lambda: _finished_and_in_flight(w0, 2, 0)
                  and _finished_and_in_flight(w1, 0, 2),
                  "worker 0 with finished requests, worker 1 with requests in flight")
        children = _children_of(proc.pid)
        assert len(children) >= 2
        proc.kill()
        proc.communicate(timeout=WAIT_S)
        _wait_for(lambda: not any(_alive(pid) for pid in children), "the workers to exit")
    finally:
        _kill(proc, {pid for pid in children if _alive(pid)})
    for w in ("w0", "w1"):
        manifest = json.loads((out / "workers" / w / "manifest.json").read_text())
        assert manifest["status"] == "interrupted", w
        assert "parent process" in manifest["error"] and "killed" in manifest["error"]
        assert not load_records(out / "workers" / w / RECORDS_FILE).unrecorded  # rows, each
    cut = [tl for path in (w0, w1) for tl in read_records(path)
           if tl.error_kind == "not_finished"]
    assert len(cut) >= 2  # worker 1's endless requests, at least

    assert cli_main(["summarize", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failures"]["not_finished"] == len(cut)
    assert summary["num_completed"] >= 2
    assert summary["num_planned"] == NUM_REQUESTS
    assert summary["num_not_sent"] == NUM_REQUESTS - summary["num_requests"]


def _kill_worker_1_with_requests_in_flight(out: Path) -> Callable[[int], None]:
    """An ``on_t0`` for ``replay_workers`` that SIGKILLs worker 1 (as the OOM killer would)
    once it has two requests in flight."""
    def on_t0(_t0_ns: int) -> None:
        proc = next(p for p in mp.active_children() if p.name == "batchlab-replay-w1")
        records = out / "workers" / "w1" / RECORDS_FILE

        def watch() -> None:
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline and not _finished_and_in_flight(records, 0, 2):
                time.sleep(0.02)
            assert proc.pid is not None
            os.kill(proc.pid, signal.SIGKILL)

        threading.Thread(target=watch, daemon=True).start()

    return on_t0


def test_a_worker_killed_outright_is_named_in_the_runs_error(
        server: ScheduledStreamServer, tmp_path: Path) -> None:
    """Issue case: a --workers run that failed because a worker was SIGKILLed had a manifest
    saying "failed" with no error, so its report said only that it had failed."""
    out = tmp_path / "run"
    with pytest.raises(workers.WorkerError) as info:
        workers.replay_workers(_mixed_trace(), ReplayConfig(target_url=server.url), out,
                               num_workers=2, on_t0=_kill_worker_1_with_requests_in_flight(out))
    summary = info.value.summary
    assert summary is not None
    dead = summary["workers"][1]
    assert dead["status"] == "died" and dead["num_sent_unrecorded"] >= 2
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "failed"
    error = manifest["error"]
    assert error.startswith("worker 1 was killed by SIGKILL")
    assert f"{dead['num_sent_unrecorded']} were in flight (rows as not_finished)" in error
    assert f"{summary['num_not_sent']} were never sent" in error
    worker = json.loads((out / "workers" / "w1" / "manifest.json").read_text())
    assert worker["status"] == "failed" and "SIGKILL" in worker["error"]
    assert f"{dead['num_sent_unrecorded']} requests it had in flight" in worker["error"]
    from harness.report import load_run

    assert (load_run(out).ended_early or "").startswith("worker 1 was killed by SIGKILL")
