"""SIGTERM and SIGHUP are Ctrl-C: what is in flight is recorded as not_finished, the summary
is written, the manifest says "interrupted", and the exit status is 128 + the signal."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from harness.live.recorder import RECORDS_FILE, read_records


def _stopped_replay(bl: type, loopback: str, out: Path, *signals: signal.Signals,
                    num_requests: int = 400, extra: tuple[str, ...] = (),
                    records: str = RECORDS_FILE) -> tuple[int, str]:
    """A replay against the loopback server, sent ``signals`` once ``records`` (under
    ``out``) holds three finished requests; its exit status and stderr."""
    proc = bl.start("replay", "--target", loopback, "--trace", "synthetic", "--num-requests",
                    str(num_requests), "--rate", "20", "--prompt-tokens", "8",
                    "--output-tokens", "40", *extra, "--out", str(out))
    try:
        path = out / records
        bl.wait_for(lambda: path.exists() and len(read_records(path)) >= 3,
                    "three finished requests")
        for sig in signals:
            proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_plain_replay_stopped_by_a_signal_loses_no_request(tmp_path: Path, loopback: str,
                                                              bl: type,
                                                              sig: signal.Signals) -> None:
    """Issue case: SIGTERM to a plain replay (as `timeout`, systemd or Kubernetes send it)
    lost the requests in flight; the manifest stayed "running"; the goodput denominator
    shrank."""
    out = tmp_path / "run"
    code, err = _stopped_replay(bl, loopback, out, sig)
    assert code == 128 + sig, err
    assert f"interrupted by {sig.name}; results measured so far are on disk" in err
    assert "Traceback" not in err
    manifest = bl.read_json(out / "manifest.json")
    assert manifest["status"] == "interrupted"
    rows = read_records(out / RECORDS_FILE)
    not_finished = [r for r in rows if r.error_kind == "not_finished"]
    assert not_finished, "requests in flight at the signal are rows too"
    assert manifest["num_sent"] == manifest["num_recorded"] == len(rows)
    summary = bl.read_json(out / "summary.json")
    assert summary["num_requests"] == len(rows)
    assert summary["failures"]["not_finished"] == len(not_finished)
    assert pq.read_table(out / "requests.parquet").num_rows == len(rows)


def test_simulate_stopped_by_sigterm_says_interrupted(tmp_path: Path, bl: type) -> None:
    """... and leaves no report renderer (the child process started with the run) behind."""
    out = tmp_path / "sim"
    proc = bl.start("simulate", "--trace", "synthetic", "--num-requests", "50000", "--rate",
                    "50", "--prompt-tokens", "64", "--output-tokens", "64", "--out", str(out))
    try:
        bl.wait_for(lambda: bl.read_json(out / "manifest.json").get("status")
                    in ("starting", "running"), "the run folder to be claimed")
        children = bl.wait_for(lambda: bl.children_of(proc.pid), "the report renderer")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert "Traceback" not in err
    assert bl.read_json(out / "manifest.json")["status"] == "interrupted"
    assert not bl.wait_no_survivors(children)


def test_a_signal_ignored_at_start_stays_ignored(tmp_path: Path, loopback: str,
                                                 bl: type) -> None:
    """Under `nohup` SIGHUP is ignored: batchlab must not turn it back into an interrupt."""
    out = tmp_path / "run"
    command = bl.batchlab("replay", "--target", loopback, "--trace", "synthetic",
                          "--num-requests", "30", "--rate", "20", "--prompt-tokens", "8",
                          "--output-tokens", "10", "--out", str(out))
    proc = subprocess.Popen(["nohup", *command], cwd=bl.REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        records = out / RECORDS_FILE
        bl.wait_for(lambda: records.exists() and len(read_records(records)) >= 1,
                    "a finished request")
        proc.send_signal(signal.SIGHUP)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert bl.read_json(out / "manifest.json")["status"] == "finished"


def test_replay_workers_stop_on_a_signal_to_the_parent_alone(tmp_path: Path, loopback: str,
                                                             bl: type) -> None:
    """`kill PID` (or a supervisor) signals the parent only: it must stop its workers, which
    record their requests in flight, instead of waiting for them to replay the whole trace
    (here 5 minutes of arrivals)."""
    out = tmp_path / "run"
    code, err = _stopped_replay(bl, loopback, out, signal.SIGTERM, num_requests=6000,
                                extra=("--workers", "2"),
                                records=f"workers/w0/{RECORDS_FILE}")
    assert code == 128 + signal.SIGTERM, err
    assert bl.read_json(out / "manifest.json")["status"] == "interrupted"
    for worker in ("w0", "w1"):
        assert bl.read_json(out / "workers" / worker / "manifest.json")["status"] \
            == "interrupted"
    summary = bl.read_json(out / "summary.json")
    assert summary["failures"]["not_finished"] >= 1
    assert summary["num_requests"] < 6000


def test_one_stop_sent_twice_loses_no_request(tmp_path: Path, loopback: str, bl: type) -> None:
    """`timeout` sends SIGTERM to the process and then to its process group: the second,
    handled as a second Ctrl-C, cut the recording of the requests in flight (a request in
    records.jsonl but not in requests.parquet, num_sent one more than num_recorded)."""
    out = tmp_path / "run"
    code, err = _stopped_replay(bl, loopback, out, signal.SIGTERM, signal.SIGTERM)
    assert code == 128 + signal.SIGTERM, err
    manifest = bl.read_json(out / "manifest.json")
    rows = read_records(out / RECORDS_FILE)
    assert manifest["status"] == "interrupted"
    assert manifest["num_sent"] == manifest["num_recorded"] == len(rows)
    assert pq.read_table(out / "requests.parquet").num_rows == len(rows)


def test_replay_workers_end_when_their_parent_is_killed_outright(
        tmp_path: Path, loopback: str, bl: type) -> None:
    """SIGKILL reaches the parent alone and cannot be passed on: its workers must not replay
    on (and then wait forever on a pipe to the dead parent)."""
    out = tmp_path / "run"
    proc = bl.start("replay", "--target", loopback, "--trace", "synthetic", "--num-requests",
                    "6000", "--rate", "20", "--prompt-tokens", "8", "--output-tokens", "40",
                    "--workers", "2", "--out", str(out))
    workers: set[int] = set()
    try:
        records = out / "workers" / "w0" / RECORDS_FILE
        bl.wait_for(lambda: records.exists() and len(read_records(records)) >= 3,
                    "three requests finished by a worker")
        workers = bl.children_of(proc.pid)
        assert len(workers) >= 2
        proc.kill()
        proc.wait(timeout=60)
        assert not bl.wait_no_survivors(workers)
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in workers:  # what a failure here left behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
