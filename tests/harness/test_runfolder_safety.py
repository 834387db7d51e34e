"""A run folder is never emptied of files batchlab did not write, and one process writes it at a
time (harness.runfolder).

Issue cases: `--overwrite` into a run folder deleted the user's notes.txt and mydata/ beside
the run; two runs into the same --out at once left one folder holding the manifest of one run
and the results of the other."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.cli import main as cli_main
from harness.runfolder import (
    LOCK_FILE,
    MARKERS,
    RUN_FILES,
    WORKERS_DIR,
    RunDirError,
    RunIdentity,
    claim_run_dir,
    foreign_names,
    release_run_dir,
)

REPO = Path(__file__).resolve().parents[2]
EXCERPT = REPO / "harness" / "data" / "azure_conv_excerpt.csv"
SIM = RunIdentity("simulated", "a" * 64, engine="reference")
OTHER = RunIdentity("simulated", "b" * 64, engine="reference")


def _simulate(out: Path, limit: int, *extra: str) -> int:
    return cli_main(["simulate", "--trace", str(EXCERPT), "--limit", str(limit), "--no-report",
                     "--out", str(out), *extra])


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes, but the lock (held while this process
    lives)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != LOCK_FILE}


# ---------------------------------------------------------------- files batchlab did not write


def test_overwrite_refuses_a_folder_with_the_users_files_and_deletes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ow1"
    assert _simulate(out, 20) == 0
    (out / "notes.txt").write_text("notes\n")
    (out / "mydata").mkdir()
    (out / "mydata" / "important.csv").write_text("")
    before = _files(out)
    capsys.readouterr()
    assert _simulate(out, 21, "--overwrite") == 2  # another run (another trace digest)
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert f"--out {out}: holds files batchlab did not write (mydata/, notes.txt)" in err
    assert _files(out) == before  # the earlier run and the user's files, byte for byte


def test_the_same_run_again_is_refused_too_when_the_user_added_files(tmp_path: Path) -> None:
    claim_run_dir(tmp_path, SIM)
    (tmp_path / "summary.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("mine")
    for overwrite in (False, True):
        with pytest.raises(RunDirError, match=r"batchlab did not write \(notes.txt\)"):
            claim_run_dir(tmp_path, SIM, overwrite=overwrite)
    assert (tmp_path / "summary.json").exists() and (tmp_path / "notes.txt").exists()


@pytest.mark.parametrize("name", ["data.parquet", "notes.log", "plot.png", "draft.tmp",
                                  "requests.parquet.bak", "summary.json.tmp.old"])
def test_a_users_file_that_looks_like_a_run_file_is_not_batchlabs(
        tmp_path: Path, name: str) -> None:
    """Suffixes say nothing: only the exact names batchlab writes are its own."""
    claim_run_dir(tmp_path, SIM)
    (tmp_path / name).write_text("mine")
    with pytest.raises(RunDirError, match=rf"batchlab did not write \({name}\)"):
        claim_run_dir(tmp_path, OTHER, overwrite=True)
    assert (tmp_path / name).read_text() == "mine"


def test_links_and_unknown_folders_are_not_batchlabs(tmp_path: Path) -> None:
    claim_run_dir(tmp_path, SIM)
    target = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    target.mkdir()
    (target / "precious.csv").write_text("x")
    (tmp_path / "requests.parquet").symlink_to(target / "precious.csv")
    (tmp_path / "plots").mkdir()
    (tmp_path / WORKERS_DIR / "w0").mkdir(parents=True)
    (tmp_path / WORKERS_DIR / "w0" / "mine.txt").write_text("x")
    (tmp_path / WORKERS_DIR / "scratch").mkdir()
    assert foreign_names(tmp_path) == ["plots/", "requests.parquet", "workers/scratch/",
                                       "workers/w0/mine.txt"]
    with pytest.raises(RunDirError, match=r"did not write \(plots/, requests.parquet, "
                                          r"workers/scratch/, \.\.\.\)"):
        claim_run_dir(tmp_path, OTHER, overwrite=True)
    assert (target / "precious.csv").read_text() == "x"
    assert (tmp_path / WORKERS_DIR / "w0" / "mine.txt").exists()


def test_everything_batchlab_writes_is_replaced_and_the_markers_kept(tmp_path: Path) -> None:
    claim_run_dir(tmp_path, SIM)
    written = [*sorted(RUN_FILES), "vllm-server.stdout.log", "reference-server.stderr.log",
               "requests.parquet.tmp", "vllm-server.stdout.log.scrub.tmp", "report.md.tmp"]
    for name in written:
        (tmp_path / name).write_text("old")
    for name in MARKERS:
        (tmp_path / name).write_text("{}")
    for w in ("w0", "w1"):
        (tmp_path / WORKERS_DIR / w).mkdir(parents=True)
        for name in ("requests.parquet", "records.jsonl", "manifest.json"):
            (tmp_path / WORKERS_DIR / w / name).write_text("old")
    assert foreign_names(tmp_path) == []
    claim_run_dir(tmp_path, OTHER, overwrite=True)
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {*MARKERS, "manifest.json", LOCK_FILE}
    assert json.loads((tmp_path / "manifest.json").read_text())["identity"] == OTHER.as_dict()


def test_the_names_known_are_the_names_written() -> None:
    """The list in harness.runfolder follows the modules that write the files."""
    from adapters.process import ServerProcess
    from adapters.trtllm import CONFIG_FILE
    from harness.capacity.probe import PROBE_FILE
    from harness.live.telemetry import TELEMETRY_FILE
    from harness.live.workers import WORKERS_DIR as WORKERS
    from harness.report.render import RUN_FIGURES
    from harness.runfolder import _run_file_name
    from harness.scenario.status import CELL_FILE, ERROR_FILE, STATUS_FILE

    assert {f.png for f in RUN_FIGURES} <= RUN_FILES
    assert {TELEMETRY_FILE, CONFIG_FILE} <= RUN_FILES
    assert {CELL_FILE, STATUS_FILE, ERROR_FILE, PROBE_FILE} == MARKERS
    assert WORKERS == WORKERS_DIR
    for engine in ("vllm", "tgi", "trtllm", "llamacpp", "reference"):
        server = ServerProcess(["true"], log_dir=Path("/nonexistent"), name=f"{engine}-server")
        assert _run_file_name(server.stdout_path.name) and _run_file_name(server.stderr_path.name)


def test_a_real_simulation_with_its_report_writes_only_names_batchlab_knows(
        tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert cli_main(["simulate", "--trace", str(EXCERPT), "--limit", "20",
                     "--out", str(out)]) == 0
    assert (out / "report.md").exists() and any(out.glob("*.png"))
    assert foreign_names(out) == []


def test_a_refused_claim_leaves_the_folder_as_it_was(tmp_path: Path) -> None:
    (tmp_path / "thesis.tex").write_text("do not delete")
    with pytest.raises(RunDirError):
        claim_run_dir(tmp_path, SIM, overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == ["thesis.tex"]  # no lock file left either


# ---------------------------------------------------------------- one process at a time


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    """Another process that has claimed ``tmp_path / "run"`` and holds it until its stdin
    closes."""
    out = tmp_path / "run"
    code = ("import sys\n"
            "from harness.runfolder import RunIdentity, claim_run_dir\n"
            f"claim_run_dir({str(out)!r}, RunIdentity('live', 'c' * 64, target='http://x'))\n"
            "print('claimed', flush=True)\n"
            "sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "claimed"
        yield out, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)


def test_a_folder_another_process_writes_is_refused(
        holder: tuple[Path, subprocess.Popen[str]],
        capsys: pytest.CaptureFixture[str]) -> None:
    out, proc = holder
    before = _files(out)
    for overwrite in (False, True):
        with pytest.raises(RunDirError, match=rf"{out}: is being written by another batchlab "
                                              rf"process \(pid {proc.pid}\); wait for it or "
                                              r"choose another --out"):
            claim_run_dir(out, SIM, overwrite=overwrite)
    capsys.readouterr()
    assert _simulate(out, 20, "--overwrite") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"(pid {proc.pid})" in err
    assert _files(out) == before  # nothing of this run got in

    assert proc.stdin is not None
    proc.stdin.close()  # the holder ends (its run is over): the folder is free again
    assert proc.wait(timeout=60) == 0
    assert not (out / LOCK_FILE).exists()
    claim_run_dir(out, SIM, overwrite=True)
    release_run_dir(out)


def test_a_holder_killed_outright_does_not_keep_the_folder(
        holder: tuple[Path, subprocess.Popen[str]]) -> None:
    out, proc = holder
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert (out / LOCK_FILE).exists()  # left behind, but no process holds it any more
    claim_run_dir(out, SIM, overwrite=True)
    assert (out / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    release_run_dir(out)
    assert not (out / LOCK_FILE).exists()


def test_the_holding_process_may_claim_its_folder_again(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A rerun with --overwrite in the same process (tests, a sweep's retry) is no second
    writer."""
    out = tmp_path / "run"
    assert _simulate(out, 20) == 0
    assert _simulate(out, 21) == 2
    assert "holds another run" in capsys.readouterr().err
    assert _simulate(out, 21, "--overwrite") == 0
    first = claim_run_dir(out, SIM, overwrite=True)
    assert claim_run_dir(out, SIM) != first
    release_run_dir(out)


def test_a_folder_emptied_or_made_anew_while_held_is_claimed_afresh(tmp_path: Path) -> None:
    """A sweep removes a cell's folder before running the cell again: the lock this process
    held there went with it, and the next claim takes a new one."""
    out = tmp_path / "cell"
    claim_run_dir(out, SIM)
    shutil.rmtree(out)
    out.mkdir()
    claim_run_dir(out, SIM)
    assert (out / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    release_run_dir(out)
    assert not (out / LOCK_FILE).exists()


def _claim_in_child(out: str, answers: Any) -> None:
    try:
        claim_run_dir(out, SIM, overwrite=True)
        answers.put("claimed")
    except RunDirError as exc:
        answers.put(str(exc))


def test_a_forked_child_is_another_process(tmp_path: Path) -> None:
    """A child forked by the holder shares its open files, not its right to write."""
    out = tmp_path / "run"
    claim_run_dir(out, SIM)
    ctx = mp.get_context("fork")
    answers = ctx.Queue()
    child = ctx.Process(target=_claim_in_child, args=(str(out), answers))
    child.start()
    said = answers.get(timeout=60)
    child.join(60)
    assert f"is being written by another batchlab process (pid {os.getpid()})" in said
    assert (out / LOCK_FILE).exists()  # the child removed nothing of its parent's
    release_run_dir(out)


def test_the_lock_is_a_temporary_a_sweeps_digests_leave_out(tmp_path: Path) -> None:
    """A scenario cell's status records a digest of every file; the lock, gone once its
    process ends, must not be one of them, or `--resume` would take the cell for damaged."""
    from harness.scenario.status import file_digests

    claim_run_dir(tmp_path, SIM)
    assert (tmp_path / LOCK_FILE).exists()
    assert set(file_digests(tmp_path)) == {"manifest.json"}
    release_run_dir(tmp_path)
