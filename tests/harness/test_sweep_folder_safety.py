"""Sweeps and capacity searches remove a cell's or probe's folder only when everything in it is
batchlab's and no other process writes it, and one sweep or search writes its folder at a time
(harness.runfolder: remove_run_dir, holding_dir).

Issue cases: a sweep or a capacity search run again without --resume deleted the notes.txt
and mydata/ a user had put in a cell or probe folder, and a cell folder another process was
running; two capacity searches into one --out at once both ran, the first then citing probe
folders the second had deleted; a search killed mid-way left the previous search's report.md,
its SLO and answers, with nothing saying it was out of date."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import harness.capacity.run as capacity_run
from harness import scenario as sc
from harness.capacity import ProbeOutcome, SearchSpec, run_probe, run_search, single_setting
from harness.cli import main as cli_main
from harness.metrics import Slo
from harness.runfolder import (
    LOCK_FILE,
    RunDirError,
    RunIdentity,
    claim_run_dir,
    foreign_names,
    hold_dir,
    release_run_dir,
    remove_run_dir,
)
from harness.target import TargetSpec

REPO = Path(__file__).resolve().parents[2]
SMALL = REPO / "tests" / "data" / "scenario_small.yaml"  # 4 cells of 40 requests
CELL = "static__max_num_seqs-4"
SIM = RunIdentity("simulated", "a" * 64, engine="reference")


def quiet() -> sc.SweepProgress:
    return sc.SweepProgress(4, stream=io.StringIO(), tty=False)


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def _add_users_files(folder: Path) -> None:
    (folder / "notes.txt").write_text("my notes\n")
    (folder / "mydata").mkdir()
    (folder / "mydata" / "f").write_text("mine\n")


@contextlib.contextmanager
def held_elsewhere(folder: Path) -> Iterator[int]:
    """Another batchlab process holds ``folder`` (as a sweep, search or run writing it) until
    the block ends; yields its pid."""
    code = ("import sys\n"
            "from harness.runfolder import hold_dir\n"
            f"hold_dir({str(folder)!r})\n"
            "print('held', flush=True)\n"
            "sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        yield proc.pid
    finally:
        if proc.stdin is not None:
            proc.stdin.close()  # its work is over: it lets go and ends
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _another_process_tries(folder: Path) -> str:
    """What another batchlab process is told when it tries to write ``folder`` now."""
    code = ("import sys\n"
            "from harness.runfolder import RunDirError, hold_dir\n"
            "try:\n"
            f"    hold_dir({str(folder)!r})\n"
            "    print('held')\n"
            "except RunDirError as exc:\n"
            "    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=True)
    return done.stdout.strip()


def _refused(what: str, folder: Path, pid: int) -> str:
    """The one line (a pattern) that refuses ``folder`` while process ``pid`` holds it."""
    return (rf"^{re.escape(f'{what} {folder}')}: is being written by another batchlab process "
            rf"\(pid {pid}\); wait for it or choose another --out$")


# ---------------------------------------------------------------- remove_run_dir


def _batchlab_folder(folder: Path) -> None:
    """A folder of nothing but batchlab's files: a run's, a sweep's markers, temporaries."""
    claim_run_dir(folder, SIM)
    for name in ("requests.parquet", "summary.json", "vllm-server.stderr.log",
                 "requests.parquet.tmp", "cell.json", "status.json", "status.json.tmp"):
        (folder / name).write_text("x")
    (folder / "workers" / "w0").mkdir(parents=True)
    (folder / "workers" / "w0" / "records.jsonl").write_text("x")
    release_run_dir(folder)


def test_a_folder_of_batchlabs_files_is_removed(tmp_path: Path) -> None:
    folder = tmp_path / "rate-4"
    _batchlab_folder(folder)
    (folder / LOCK_FILE).write_text("12345\n")  # left by a holder killed outright
    assert foreign_names(folder) == []
    remove_run_dir(folder, "probe folder")
    assert not folder.exists()
    remove_run_dir(folder, "probe folder")  # not there: nothing to do


def test_a_folder_with_the_users_files_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    folder = tmp_path / "rate-4"
    _batchlab_folder(folder)
    _add_users_files(folder)
    before = _files(folder)
    with pytest.raises(RunDirError) as caught:
        remove_run_dir(folder, "probe folder")
    assert str(caught.value) == (f"probe folder {folder}: holds files batchlab did not write "
                                 "(mydata/, notes.txt); move them, or choose another --out")
    assert _files(folder) == before  # and no lock file left behind either


def test_a_link_or_a_file_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    _batchlab_folder(elsewhere)
    (tmp_path / "rate-4").symlink_to(elsewhere)
    with pytest.raises(RunDirError, match="rate-4: is a link, not a folder batchlab made"):
        remove_run_dir(tmp_path / "rate-4", "probe folder")
    (tmp_path / "rate-8").write_text("mine")
    with pytest.raises(RunDirError, match="rate-8: is a file, not a folder"):
        remove_run_dir(tmp_path / "rate-8", "probe folder")
    assert elsewhere.is_dir() and (tmp_path / "rate-8").read_text() == "mine"


def test_a_folder_another_process_holds_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "cell"
    _batchlab_folder(folder)
    before = _files(folder)
    with held_elsewhere(folder) as pid:
        with pytest.raises(RunDirError, match=_refused("cell folder", folder, pid)):
            remove_run_dir(folder, "cell folder")
        assert {k: v for k, v in _files(folder).items() if k != LOCK_FILE} == before
    remove_run_dir(folder, "cell folder")  # its holder has let go
    assert not folder.exists()


def test_a_folder_this_process_holds_is_removed_and_let_go(tmp_path: Path) -> None:
    folder = tmp_path / "cell"
    claim_run_dir(folder, SIM)  # held, as by a run in this process that did not let go
    remove_run_dir(folder, "cell folder")
    assert not folder.exists()
    assert hold_dir(folder)  # a hold of its own again: the old one went with the folder
    release_run_dir(folder)


# ---------------------------------------------------------------- scenario sweeps


def test_a_sweep_refuses_a_cell_folder_with_the_users_files(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = ["run", str(SMALL), "--only", CELL, "--out", str(tmp_path)]
    assert cli_main(run) == 0
    scenario_dir = tmp_path / "small"
    _add_users_files(scenario_dir / CELL)
    before = _files(scenario_dir)
    capsys.readouterr()
    assert cli_main(run) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"batchlab run: error: cell folder {scenario_dir / CELL}: holds files "
                   "batchlab did not write (mydata/, notes.txt); move them, or choose another "
                   "--out")
    # refused before anything was written: the cell, the user's files, scenario.json and
    # report.md as they were
    assert _files(scenario_dir) == before


def test_a_sweep_names_every_cell_folder_in_the_way_at_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two cell folders with the user's files: the refusal named the first only, and the
    rerun after moving those was refused again for the second."""
    run = ["run", str(SMALL), "--out", str(tmp_path)]
    assert cli_main(run) == 0
    scenario_dir = tmp_path / "small"
    cells = sorted(p.name for p in scenario_dir.iterdir() if (p / "cell.json").exists())
    assert len(cells) >= 2
    for cell in cells[:2]:
        _add_users_files(scenario_dir / cell)
    before = _files(scenario_dir)
    capsys.readouterr()
    assert cli_main(run) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err.startswith("batchlab run: error: 2 folders are in the way: cell folder ")
    for cell in cells[:2]:
        assert (f"cell folder {scenario_dir / cell}: holds files batchlab did not write "
                "(mydata/, notes.txt)") in err
    assert _files(scenario_dir) == before


def test_a_sweep_refuses_a_cell_another_process_is_running(tmp_path: Path) -> None:
    scenario = sc.load_scenario(SMALL)
    sc.run_scenario(scenario, tmp_path, only=CELL, progress=quiet())
    cell_dir = tmp_path / "small" / CELL
    before = _files(cell_dir)
    with held_elsewhere(cell_dir) as pid:
        with pytest.raises(RunDirError, match=_refused("cell folder", cell_dir, pid)):
            sc.run_scenario(scenario, tmp_path, only=CELL, progress=quiet())
        assert {k: v for k, v in _files(cell_dir).items() if k != LOCK_FILE} == before


@pytest.mark.parametrize("use_ray", [False, True])
def test_two_sweeps_into_one_folder_at_once_the_second_is_refused(
        tmp_path: Path, use_ray: bool) -> None:
    scenario = sc.load_scenario(SMALL)
    sc.run_scenario(scenario, tmp_path, only=CELL, progress=quiet())
    scenario_dir = tmp_path / "small"
    before = _files(scenario_dir)
    with held_elsewhere(scenario_dir) as pid:
        with pytest.raises(RunDirError, match=_refused("--out", scenario_dir, pid)):
            sc.run_scenario(scenario, tmp_path, only=CELL, use_ray=use_ray, progress=quiet())
        assert {k: v for k, v in _files(scenario_dir).items() if k != LOCK_FILE} == before


def test_the_command_line_refuses_the_second_sweep_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario_dir = tmp_path / "small"
    with held_elsewhere(scenario_dir) as pid:
        assert cli_main(["run", str(SMALL), "--only", CELL, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and f"(pid {pid})" in err
        assert [p.name for p in scenario_dir.iterdir()] == [LOCK_FILE]  # nothing of it got in


class _Watching:
    """The real cell runner, asking meanwhile what another process is told of the folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.told: list[str] = []

    def __call__(self, job: sc.CellJob, out_dir: Path, progress: sc.ProgressFn
                 ) -> Mapping[str, Any]:
        self.told.append(_another_process_tries(self.folder))
        return sc.run_cell(job, out_dir, progress)


def test_a_sweep_holds_its_folder_while_it_runs_and_writes_only_batchlabs_files(
        tmp_path: Path) -> None:
    scenario_dir = tmp_path / "small"
    runner = _Watching(scenario_dir)
    result = sc.run_scenario(sc.load_scenario(SMALL), tmp_path, only="static*", runner=runner,
                             progress=quiet())
    assert [o.state for o in result.outcomes if o.state != "not_run"] == ["done", "done"]
    assert len(runner.told) == 2
    for told in runner.told:
        assert told.startswith(f"--out {scenario_dir}: is being written by another batchlab "
                               f"process (pid {os.getpid()})")
    assert not (scenario_dir / LOCK_FILE).exists()  # let go at the end
    assert _another_process_tries(scenario_dir) == "held"
    for cell in ("static__max_num_seqs-4", "static__max_num_seqs-8"):
        assert foreign_names(scenario_dir / cell) == []  # a rerun may remove it


# ---------------------------------------------------------------- capacity searches

KNOBS = {"policy": "fcfs", "max_num_seqs": 8}
TRACE = {"num_requests": 40, "arrival": "constant", "prompt_tokens": 512, "output_tokens": 16}
SPEC = SearchSpec(kind="rate", start=4.0, max_probes=2)
SLO = Slo(ttft_s=0.1)
OTHER_SLO = Slo(ttft_s=0.5)


def setting(slo: Slo = SLO) -> capacity_run.Setting:
    from adapters.knobs import Knobs

    spec = TargetSpec("reference", "simulate", knobs=Knobs.from_mapping(KNOBS))
    return single_setting(spec, name="fcfs", trace_path="synthetic", trace_options=TRACE,
                          kind="rate", target=0.99, slo=slo, knobs=KNOBS)


def _search(out: Path, slo: Slo = SLO, **kw: Any) -> list[capacity_run.SettingResult]:
    return capacity_run.run_capacity([setting(slo)], SPEC, out, name="cap", **kw)


@pytest.mark.parametrize("full", [False, True])
def test_a_search_started_over_refuses_a_probe_folder_with_the_users_files(
        tmp_path: Path, full: bool) -> None:
    """Also a confirming run's folder (``rate-X-full``)."""
    out = tmp_path / "cap"
    _search(out)
    search_dir = out / "fcfs"
    probe = search_dir / "rate-4"
    if full:
        probe = search_dir / "rate-200-full"
        run_probe(setting().plan, 200.0, probe, full=True)
        assert foreign_names(probe) == []
    _add_users_files(probe)
    before = _files(out)
    with pytest.raises(RunDirError) as caught:
        _search(out, slo=OTHER_SLO)
    assert str(caught.value) == (f"probe folder {probe}: holds files batchlab did not write "
                                 "(mydata/, notes.txt); move them, or choose another --out")
    # refused before anything was written: every probe, capacity.json and report.md kept
    assert _files(out) == before
    # nor does a search of that one setting remove it, or any other probe beside it
    with pytest.raises(RunDirError, match=r"did not write \(mydata/, notes.txt\)"):
        run_search(setting(), SPEC, search_dir)
    assert _files(out) == before


def test_a_search_started_over_refuses_a_probe_another_process_writes(tmp_path: Path) -> None:
    out = tmp_path / "cap"
    _search(out)
    probe = out / "fcfs" / "rate-4"
    before = _files(probe)
    with held_elsewhere(probe) as pid:
        with pytest.raises(RunDirError, match=_refused("probe folder", probe, pid)):
            _search(out, slo=OTHER_SLO)
        assert {k: v for k, v in _files(probe).items() if k != LOCK_FILE} == before


def test_two_searches_into_one_out_at_once_the_second_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "cap"
    _search(out)
    before = _files(out)
    with held_elsewhere(out) as pid:
        for resume in (False, True):
            with pytest.raises(RunDirError, match=_refused("--out", out, pid)):
                _search(out, slo=OTHER_SLO, resume=resume)
        assert {k: v for k, v in _files(out).items() if k != LOCK_FILE} == before
    with held_elsewhere(tmp_path / "new") as pid:  # a search's first run into it too
        with pytest.raises(RunDirError, match=_refused("--out", tmp_path / "new", pid)):
            _search(tmp_path / "new")
        assert [p.name for p in (tmp_path / "new").iterdir()] == [LOCK_FILE]


def test_a_search_holds_its_out_while_it_runs_and_writes_only_batchlabs_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "cap"
    told: list[str] = []
    real_probe = capacity_run.run_probe

    def watching(plan: Any, load: float, out_dir: Path, **kw: Any) -> ProbeOutcome:
        told.append(_another_process_tries(out))
        return real_probe(plan, load, out_dir, **kw)

    monkeypatch.setattr(capacity_run, "run_probe", watching)
    [result] = _search(out)
    assert result.result is not None and len(told) == len(result.result.probes) == 2
    for said in told:
        assert said.startswith(f"--out {out}: is being written by another batchlab process "
                               f"(pid {os.getpid()})")
    assert not (out / LOCK_FILE).exists()  # let go at the end
    probes = [p for p in (out / "fcfs").iterdir() if p.is_dir()]
    assert len(probes) == 2
    for probe in probes:
        assert foreign_names(probe) == []  # a search started over may remove it


class _Killed(BaseException):
    """A process killed outright: nothing after the point it died at runs."""


def test_a_search_killed_mid_way_or_in_its_report_leaves_no_report_of_the_last_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "cap"
    _search(out, write_report=True)
    assert (out / "report.md").exists()

    def killed(*_args: Any, **_kwargs: Any) -> Any:
        raise _Killed

    with monkeypatch.context() as patch:  # killed at its first probe
        patch.setattr(capacity_run, "run_probe", killed)
        with pytest.raises(_Killed):
            _search(out, slo=OTHER_SLO, write_report=True)
    assert not (out / "report.md").exists()

    _search(out, write_report=True)
    assert (out / "report.md").exists()
    import harness.report as report_module

    monkeypatch.setattr(report_module, "render_scenario_report", killed)  # killed writing it
    with pytest.raises(_Killed):
        _search(out, slo=OTHER_SLO, write_report=True)
    assert not (out / "report.md").exists()
    assert not (out / LOCK_FILE).exists()


def test_the_command_line_refuses_the_second_search_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A search into an --out another process holds: one line, exit 2 (it was a traceback),
    nothing printed of a search."""
    out = tmp_path / "cap"
    out.mkdir()
    with held_elsewhere(out) as pid:
        assert cli_main(["capacity", "--trace", "synthetic", "--num-requests", "10",
                         "--prompt-tokens", "8", "--output-tokens", "4", "--slo", "ttft_s=0.1",
                         "--out", str(out)]) == 2
        said = capsys.readouterr()
        assert said.err.strip().count("\n") == 0 and f"(pid {pid})" in said.err
        assert "capacity search (" not in said.out
        assert [p.name for p in out.iterdir()] == [LOCK_FILE]


def test_a_sweep_stopped_early_leaves_no_cell_of_the_last_one_as_its_own(
        tmp_path: Path) -> None:
    """A full rerun (no --resume) interrupted at its first cell: the cells it did not reach
    are not run, not last night's results read as tonight's; no figure of the last report
    outlives it."""
    sc.run_scenario(sc.load_scenario(SMALL), tmp_path, progress=quiet())
    scenario_dir = tmp_path / "small"
    assert (scenario_dir / "latency_cdf.png").exists()

    def stopped(job: sc.CellJob, out_dir: Path, progress: Any) -> Mapping[str, Any]:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sc.run_scenario(sc.load_scenario(SMALL), tmp_path, progress=quiet(), runner=stopped,
                        write_report=False)
    from harness.report.runs import load_scenario_dir

    _, cells = load_scenario_dir(scenario_dir)
    assert cells and not any(c.state == "done" for c in cells)
    assert not any((scenario_dir / name).exists()
                   for name in ("report.md", "latency_cdf.png", "engine_state.png",
                                "throughput.png", "batch_size.png"))


# ---------------------------------------------------------------- batchlab report


def _simulated_run(folder: Path) -> None:
    assert cli_main(["simulate", "--trace", "synthetic", "--rate", "4", "--num-requests", "12",
                     "--prompt-tokens", "16", "--output-tokens", "4", "--out", str(folder),
                     "--no-report"]) == 0


def test_a_report_of_a_folder_another_process_writes_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`batchlab report` of a run (or sweep) folder while a run or sweep writes it read last
    night's summary beside tonight's tables, and wrote report.md into the folder mid-run:
    refused in one line naming the process, exit 2, nothing written; into another -o as well
    (it would read the folder halfway). Once the writer has ended, the report is made."""
    run = tmp_path / "run"
    _simulated_run(run)
    capsys.readouterr()
    before = _files(run)
    with held_elsewhere(run) as pid:
        for argv in (["report", str(run)],
                     ["report", str(run), "-o", str(tmp_path / "elsewhere" / "report.md")]):
            assert cli_main(argv) == 2
            said = capsys.readouterr()
            assert said.err.strip().count("\n") == 0
            assert f"is being written by another batchlab process (pid {pid})" in said.err
            assert "wait for it to end" in said.err and said.err.count("wait") == 1
        assert not (tmp_path / "elsewhere").exists()
        assert {k: v for k, v in _files(run).items() if k != LOCK_FILE} == before
    assert cli_main(["report", str(run)]) == 0
    assert (run / "report.md").exists() and not (run / LOCK_FILE).exists()


def test_a_report_refused_as_it_takes_the_folder_says_so_in_the_same_words(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that takes the folder between the report's look (``writer_of``) and its hold is
    refused in the same one instruction, to wait, not "wait for it or run the report again
    once it has ended" (two ways of saying wait)."""
    import harness.runfolder as runfolder

    run = tmp_path / "run"
    _simulated_run(run)
    capsys.readouterr()
    before = _files(run)
    with held_elsewhere(run) as pid:
        monkeypatch.setattr(runfolder, "writer_of", lambda folder: None)  # looked too early
        assert cli_main(["report", str(run)]) == 2
        said = capsys.readouterr().err.strip()
        assert said.count("\n") == 0 and said.count("wait") == 1
        assert (f"{run}: is being written by another batchlab process (pid {pid}); a report "
                "of it now would mix its old and new results: wait for it to end") in said
        assert {k: v for k, v in _files(run).items() if k != LOCK_FILE} == before


def test_what_a_report_raises_while_it_holds_its_folder_is_not_taken_for_a_refusal(
        tmp_path: Path) -> None:
    """Only the taking of the folder is turned into a one-line refusal; a RunDirError raised
    while the report is written goes up as it is, and the folder is let go."""
    from harness.cli.common import holding_folder

    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(RunDirError, match=r"^inside$"), holding_folder(run, "a report"):
        assert (run / LOCK_FILE).exists()
        raise RunDirError("inside")
    assert not (run / LOCK_FILE).exists()


def test_a_report_written_into_a_folder_holds_it_while_it_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While `batchlab report RUN_DIR` writes the folder's report.md and figures, a run into
    the folder is refused as a second writer is; the report lets go when it is done."""
    import harness.report as report

    run = tmp_path / "run"
    _simulated_run(run)
    told: list[str] = []
    render = report.render_run_report

    def render_and_try(run_dir: Path, **kwargs: Any) -> Path:
        told.append(_another_process_tries(run_dir))
        return render(run_dir, **kwargs)

    monkeypatch.setattr(report, "render_run_report", render_and_try)
    assert cli_main(["report", str(run)]) == 0
    assert told == [f"--out {run}: is being written by another batchlab process "
                    f"(pid {os.getpid()}); wait for it or choose another --out"]
    assert not (run / LOCK_FILE).exists()
    assert _another_process_tries(run) == "held"


def test_a_summary_of_a_folder_another_process_writes_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`batchlab summarize` rewrote summary.json and report.md in a folder a run was writing
    (while report refused it). Refused in the same words; once the
    writer has ended, it summarizes (and holds the folder meanwhile)."""
    run = tmp_path / "run"
    _simulated_run(run)
    capsys.readouterr()
    before = _files(run)
    with held_elsewhere(run) as pid:
        assert cli_main(["summarize", str(run)]) == 2
        said = capsys.readouterr().err.strip()
        assert said.count("\n") == 0
        assert (f"{run}: is being written by another batchlab process (pid {pid}); a summary "
                "of it now would mix its old and new results: wait for it to end") in said
        assert {k: v for k, v in _files(run).items() if k != LOCK_FILE} == before
    assert cli_main(["summarize", str(run)]) == 0
    assert not (run / LOCK_FILE).exists()
