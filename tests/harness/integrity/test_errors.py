"""Errors, not tracebacks: an unwritable --out, a full disk mid-replay, a closed stdout."""

from __future__ import annotations

import asyncio
import errno
import gc
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from harness.cli import main as cli_main
from harness.live.recorder import RECORDS_FILE, RecordWriter, read_records
from harness.live.replay import ReplayConfig, replay
from harness.live.testing import FullAfter, ScheduledStreamServer
from harness.runfolder import RunWriteError
from harness.traces import Trace, TraceRequest

SMALL = ["--trace", "synthetic", "--num-requests", "3", "--rate", "20", "--prompt-tokens", "8",
         "--output-tokens", "4"]


def _one_line_error(capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and err.count("\n") == 0, err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.mark.parametrize("command", [["simulate", *SMALL],
                                     ["replay", "--target", "http://127.0.0.1:9", *SMALL]])
def test_out_that_is_a_file_or_under_one(tmp_path: Path, command: list[str],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    assert cli_main([*command, "--out", str(a_file)]) == 2
    _one_line_error(capsys, str(a_file), "is a file, not a folder")
    assert cli_main([*command, "--out", str(a_file / "sub")]) == 2
    _one_line_error(capsys, str(a_file / "sub"), "cannot write there")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_out_in_a_read_only_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        assert cli_main(["simulate", *SMALL, "--out", str(locked / "run")]) == 2
        _one_line_error(capsys, str(locked / "run"), "cannot write there")
    finally:
        locked.chmod(0o700)


def test_run_and_report_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    scenario = Path(__file__).resolve().parents[3] / "scenarios" / "quickstart.yaml"
    assert cli_main(["run", str(scenario), "--out", str(a_file)]) == 2
    _one_line_error(capsys, str(a_file), "cannot write there")
    run = tmp_path / "run"
    assert cli_main(["simulate", *SMALL, "--out", str(run)]) == 0
    capsys.readouterr()
    assert cli_main(["report", str(run), "-o", str(a_file / "report.md")]) == 2
    _one_line_error(capsys, str(a_file / "report.md"), "cannot write there")
    assert cli_main(["report", str(run), "-o", str(tmp_path)]) == 2
    _one_line_error(capsys, str(tmp_path), "is a folder, not a file")
    other = tmp_path / "other"
    assert cli_main(["simulate", *SMALL, "--out", str(other)]) == 0
    capsys.readouterr()
    assert cli_main(["report", str(run), "-o", str(other / "cmp.md")]) == 2
    _one_line_error(capsys, "is another run's folder")


# ---------------------------------------------------------------- a full disk




@pytest.fixture
def disk_fills_after_3_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    original = RecordWriter.__init__

    def init(self: RecordWriter, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self._file = FullAfter(self._file, 3)  # after the header: 3 rows

    monkeypatch.setattr(RecordWriter, "__init__", init)


def _trace(n: int) -> Trace:
    reqs = tuple(TraceRequest(f"r{i}", i * 0.02, 8, 30) for i in range(n))
    return Trace(reqs, source="test", format="test", digest="1" * 64)


def test_a_full_disk_stops_the_replay_cleanly(tmp_path: Path, disk_fills_after_3_rows: None,
                                              capfd: pytest.CaptureFixture[str],
                                              caplog: pytest.LogCaptureFixture) -> None:
    """Issue case: a full disk dropped rows with "Task exception never retrieved" noise, then
    ended in a traceback with no summary."""
    async def go() -> None:
        async with ScheduledStreamServer(ttft_s=0.01, itl_s=0.01) as server:
            await replay(_trace(40), ReplayConfig(target_url=server.url), tmp_path)

    with pytest.raises(RunWriteError, match=r"No space left on device.*3 of"):
        asyncio.run(go())
    gc.collect()  # an unretrieved task exception is reported when the task is collected
    captured = capfd.readouterr()
    assert "never retrieved" not in captured.err + caplog.text
    on_disk = read_records(tmp_path / RECORDS_FILE)
    assert len(on_disk) == 3  # the rows written before the disk filled stay
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "No space left" in manifest["error"]
    assert manifest["stopped_at"]["num_recorded_on_disk"] == 3
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert "No space left" in summary["stopped_early"]
    assert summary["num_requests"] == manifest["num_recorded"] == manifest["num_sent"]
    assert summary["num_requests"] < 40  # it stopped instead of sending the rest
    assert pq.read_table(tmp_path / "requests.parquet").num_rows == summary["num_requests"]


def test_a_full_disk_on_the_command_line(tmp_path: Path, loopback: str,
                                         disk_fills_after_3_rows: None,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert cli_main(["replay", "--target", loopback, "--trace", "synthetic",
                     "--num-requests", "40", "--rate", "50", "--prompt-tokens", "8",
                     "--output-tokens", "20", "--out", str(out)]) == 1
    _one_line_error(capsys, "records.jsonl", "No space left on device", "stopped")
    assert len(read_records(out / RECORDS_FILE)) == 3


def test_tables_the_disk_refused_leave_preemptions_unknown_not_zero(
        tmp_path: Path, loopback: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tables do not fit: the summary is computed in memory, as a live run's always is,
    with the engine's preemption count (none scraped here: unknown), never the requests'
    zero."""
    import harness.live.rundir as rundir

    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "requests.parquet")

    monkeypatch.setattr(rundir, "consolidate", full)
    out = tmp_path / "run"
    assert cli_main(["replay", "--target", loopback, "--trace", "synthetic",
                     "--num-requests", "4", "--rate", "50", "--prompt-tokens", "8",
                     "--output-tokens", "4", "--out", str(out)]) == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_preemptions"] is None and summary["preemptions_from"]


# ---------------------------------------------------------------- a closed stdout


def test_a_closed_stdout_ends_quietly(bl: type) -> None:
    """`batchlab engines | head -1`: the reader is gone before batchlab writes."""
    proc = subprocess.Popen(bl.batchlab("engines"), cwd=bl.REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert err == ""
    assert proc.returncode == 141  # 128 + SIGPIPE, like any tool whose reader left


def test_a_json_file_the_disk_refused_leaves_no_tmp_file(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A summary or manifest that does not fit leaves the file as it was and nothing beside
    it (a summary.json.tmp would read as the run's)."""
    from harness.results import write_json_atomic

    target = tmp_path / "summary.json"
    target.write_text('{"before": 1}\n')

    real_write = Path.write_text

    def full(self: Path, data: str, *args: Any, **kwargs: Any) -> int:
        real_write(self, data[:5])  # what fitted
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OSError, match="No space left"):
        write_json_atomic({"after": 2}, target)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]
    assert json.loads(target.read_text()) == {"before": 1}
