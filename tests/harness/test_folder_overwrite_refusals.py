"""Commands that write a folder or file of results refuse one that holds other results, before
they write or delete anything; ``summarize`` refuses a malformed records.jsonl by its line, and
reads a summary.json that is no summary as none (harness.runfolder.refuse_results_folder,
folder_above).

Issue cases: `compare A B --json A/summary.json` replaced the run's summary with the
comparison (the report then said "Served 0 of 0 requests"); `run` into a folder whose
<scenario> folder was a simulate run's added cell folders to it and deleted its report.md and
figures; `capacity --out` a replay run's folder wrote its search into it; `summarize` crashed
with a traceback on a records.jsonl row that was a JSON list or had a list for request_id, and
on a summary.json that was a JSON list."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from harness.cli import main as cli_main
from harness.live.recorder import RECORDS_FILE, RecordWriter, load_records
from harness.manifest import update_manifest
from harness.results import read_summary
from harness.runfolder import LOCK_FILE, RunIdentity, claim_run_dir, release_run_dir
from harness.timeline import RequestTimeline

REPO = Path(__file__).resolve().parents[2]
TRACE = str(REPO / "harness" / "data" / "azure_conv_excerpt.csv")
SCENARIO = """\
name: base
question: Does a sweep keep out of a run's folder?
trace: {path: azure_conv_excerpt.csv, limit: 10}
model: llama-3.1-8b
gpu: h100-sxm
engines:
  - {name: fcfs, engine: reference}
"""
CELL = "fcfs"
CAPACITY = ["capacity", "--trace", TRACE, "--limit", "60", "--slo", "ttft_s=0.5,tpot_s=0.05",
            "--max-probes", "2"]


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes (the lock aside)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != LOCK_FILE}


def _simulate(out: Path) -> Path:
    assert cli_main(["simulate", "--trace", TRACE, "--limit", "20", "--no-report", "--out",
                     str(out)]) == 0
    (out / "report.md").write_text("the run's own report\n")
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("runs")
    return _simulate(root / "sim1"), _simulate(root / "sim2")


def _refused(capsys: pytest.CaptureFixture[str], command: str) -> str:
    """The one line of a refusal, without its ``batchlab COMMAND: error:`` prefix."""
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    prefix = f"batchlab {command}: error: "
    assert err.startswith(prefix), err
    return err.removeprefix(prefix)


# ---------------------------------------------------------------- compare --json


@pytest.mark.parametrize("name", ["summary.json", "records.jsonl", "requests.parquet",
                                  "sub/compare.json"])
def test_compare_json_in_a_compared_runs_folder_is_refused(
        runs: tuple[Path, Path], name: str, capsys: pytest.CaptureFixture[str]) -> None:
    sim1, sim2 = runs
    before = _files(sim1)
    capsys.readouterr()
    out = sim1 / name
    assert cli_main(["compare", str(sim1), str(sim2), "--json", str(out)]) == 2
    said = _refused(capsys, "compare")
    if name.startswith("sub/"):
        assert said.startswith(f"--json {out}: {out.parent} is inside ")
        assert said.endswith(", the run folder of a simulate run (manifest.json): write the "
                             "comparison to a file of its own, e.g. --json "
                             "reports/compare.json")
    else:
        assert said == (f"--json {out}: {sim1} is the run folder of a simulate run "
                        "(manifest.json): write the comparison to a file of its own, e.g. "
                        "--json reports/compare.json")
    assert _files(sim1) == before  # the run's summary and tables, byte for byte
    assert not (sim1 / "sub").exists()


@pytest.mark.parametrize(("marker", "doc", "what"), [
    ("scenario.json", {"name": "nightly"}, "the folder of scenario nightly (scenario.json)"),
    ("capacity.json", {}, "the folder of a capacity search (capacity.json)"),
    ("cell.json", {}, "a cell of a scenario sweep or capacity search (cell.json)"),
])
def test_compare_json_in_a_scenario_or_capacity_folder_is_refused(
        runs: tuple[Path, Path], tmp_path: Path, marker: str, doc: dict[str, str], what: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "sweep"
    folder.mkdir()
    (folder / marker).write_text(json.dumps(doc))
    out = folder / "compare.json"
    assert cli_main(["compare", str(runs[0]), str(runs[1]), "--json", str(out)]) == 2
    assert _refused(capsys, "compare").startswith(f"--json {out}: {folder} is {what}: ")
    assert not out.exists()


def test_compare_json_replaces_only_an_earlier_comparison(
        runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": 1}\n')
    assert cli_main(["compare", str(runs[0]), str(runs[1]), "--json", str(notes)]) == 2
    assert _refused(capsys, "compare") == (
        f"--json {notes}: a file is there that is not a comparison batchlab wrote (format "
        "batchlab-compare); remove it, or choose another file name")
    assert notes.read_text() == '{"mine": 1}\n'
    out = tmp_path / "ci" / "compare.json"
    for _ in range(2):  # written, then its own earlier comparison replaced
        assert cli_main(["compare", str(runs[0]), str(runs[1]), "--json", str(out)]) == 0
        assert json.loads(out.read_text())["format"] == "batchlab-compare"


def test_a_summary_without_any_summary_field_reads_as_none(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"format": "batchlab-compare", "version": 2, "pairs": []}))
    assert read_summary(path) == {}
    path.write_text(json.dumps({"num_requests": 3, "num_failed": 0}))
    assert read_summary(path) == {"num_requests": 3, "num_failed": 0}


# ---------------------------------------------------------------- run and capacity --out


@pytest.fixture()
def scenario_file(tmp_path: Path) -> Path:
    path = tmp_path / "base.yaml"
    path.write_text(SCENARIO)
    return path


def test_run_refuses_a_scenario_folder_that_is_a_run_folder(
        runs: tuple[Path, Path], scenario_file: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ow4"
    shutil.copytree(runs[0], out / "base")
    before = _files(out)
    capsys.readouterr()
    assert cli_main(["run", str(scenario_file), "--out", str(out)]) == 2
    assert _refused(capsys, "run") == (f"--out {out / 'base'}: is the run folder of a simulate "
                                       "run (manifest.json): choose another --out")
    assert _files(out) == before  # its report.md too: nothing written, nothing deleted
    assert sorted(p.name for p in (out / "base").iterdir()) == sorted(
        p.name for p in runs[0].iterdir())


def test_run_refuses_an_out_inside_a_run_folder(
        runs: tuple[Path, Path], scenario_file: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "sim"
    shutil.copytree(runs[0], run)
    assert cli_main(["run", str(scenario_file), "--out", str(run)]) == 2
    said = _refused(capsys, "run")
    assert said.startswith(f"--out {run / 'base'}: is inside ")
    assert said.endswith(", the run folder of a simulate run (manifest.json): choose another "
                         "--out")
    assert not (run / "base").exists()


def test_run_refuses_a_cell_folder_that_is_another_run_and_names_it(
        runs: tuple[Path, Path], scenario_file: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ow5"
    shutil.copytree(runs[0], out / "base" / CELL)
    before = _files(out)
    capsys.readouterr()
    assert cli_main(["run", str(scenario_file), "--out", str(out)]) == 2
    assert _refused(capsys, "run") == (
        f"cell folder {out / 'base' / CELL}: is the run folder of a simulate run "
        "(manifest.json): move it, or choose another --out")
    assert _files(out) == before  # no scenario.json either


def test_run_refuses_a_capacity_searchs_folder(
        scenario_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "out" / "base"
    folder.mkdir(parents=True)
    (folder / "capacity.json").write_text("{}")
    assert cli_main(["run", str(scenario_file), "--out", str(tmp_path / "out")]) == 2
    assert _refused(capsys, "run") == (f"--out {folder}: is the folder of a capacity search "
                                       "(capacity.json): choose another --out")
    assert [p.name for p in folder.iterdir()] == ["capacity.json"]


def test_a_scenario_folder_of_its_own_is_still_run_again_and_resumed(
        scenario_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = ["run", str(scenario_file), "--out", str(tmp_path)]
    for extra in ([], [], ["--resume"]):
        assert cli_main([*run, *extra]) == 0
    assert (tmp_path / "base" / CELL / "cell.json").is_file()


def _as_replay_run(folder: Path) -> None:
    """``folder``'s manifest made a live run's (a replay run folder)."""
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["kind"] = "live"
    manifest.pop("identity", None)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_capacity_refuses_a_replay_run_folder(
        runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rp1"
    shutil.copytree(runs[0], out)
    _as_replay_run(out)
    before = _files(out)
    capsys.readouterr()
    for resume in ([], ["--resume"]):
        assert cli_main([*CAPACITY, "--out", str(out), *resume]) == 2
        assert _refused(capsys, "capacity") == (
            f"--out {out}: is the run folder of a replay run (manifest.json): choose another "
            "--out")
    assert _files(out) == before


def test_capacity_refuses_a_scenario_folder_and_a_setting_folder_that_is_a_run(
        runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "scenario.json").write_text(json.dumps({"name": "nightly"}))
    assert cli_main([*CAPACITY, "--out", str(sweep)]) == 2
    assert _refused(capsys, "capacity") == (
        f"--out {sweep}: is the folder of scenario nightly (scenario.json): choose another "
        "--out")
    assert [p.name for p in sweep.iterdir()] == ["scenario.json"]
    out = tmp_path / "cap"
    shutil.copytree(runs[0], out / "reference")  # where the setting's search goes
    before = _files(out)
    assert cli_main([*CAPACITY, "--out", str(out)]) == 2
    assert _refused(capsys, "capacity") == (
        f"setting folder {out / 'reference'}: is the run folder of a simulate run "
        "(manifest.json): move it, or choose another --out")
    assert _files(out) == before


def test_capacity_into_its_own_folder_again_and_resumed_still_runs(tmp_path: Path) -> None:
    out = tmp_path / "cap"
    for extra in ([], [], ["--resume"]):
        assert cli_main([*CAPACITY, "--out", str(out), *extra]) == 0
    assert (out / "capacity.json").is_file()


# ---------------------------------------------------------------- summarize


def _live_run(folder: Path, num: int = 5) -> Path:
    """A replay run's folder as a crash leaves it: its manifest and records.jsonl."""
    run_id = claim_run_dir(folder, RunIdentity("live", "c" * 64, target="http://127.0.0.1:1"))
    update_manifest(folder, {"status": "finished"})
    writer = RecordWriter(folder / RECORDS_FILE, run_id=run_id)
    for i in range(num):
        writer.write(RequestTimeline(
            request_id=str(i), arrival_s=0.1 * i, num_prompt_tokens=8,
            num_target_output_tokens=2, sent_s=0.1 * i, chunk_times_s=(0.1 * i + 0.01,
                                                                        0.1 * i + 0.02),
            chunk_num_tokens=(1, 1), finished_s=0.1 * i + 0.02, finish_reason="length"))
    writer.close()
    release_run_dir(folder)
    return folder


def _with_line_4(folder: Path, line: str) -> None:
    path = folder / RECORDS_FILE
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join([*lines[:3], line + "\n", *lines[3:]]))


@pytest.mark.parametrize(("line", "why"), [
    ("[1, 2]", "a JSON list, not an object"),
    ('{"request_id": [1], "arrival_s": 0.0, "num_prompt_tokens": 1, '
     '"num_target_output_tokens": 1}', "request_id is [1], not a string"),
    ('{"request_id": "9", "arrival_s": "soon", "num_prompt_tokens": 1, '
     '"num_target_output_tokens": 1}', 'arrival_s is "soon", not a number'),
    ('{"request_id": "9", "arrival_s": 0.0}', "no num_prompt_tokens, num_target_output_tokens"),
])
def test_summarize_refuses_a_row_that_is_not_a_request_record_by_its_line(
        tmp_path: Path, line: str, why: str, capsys: pytest.CaptureFixture[str]) -> None:
    run = _live_run(tmp_path / "rp")
    _with_line_4(run, line)
    with pytest.raises(ValueError, match=r"records\.jsonl:4: not a request record"):
        load_records(run / RECORDS_FILE)
    before = _files(run)
    capsys.readouterr()
    assert cli_main(["summarize", str(run)]) == 2
    assert _refused(capsys, "summarize") == (
        f"{run / RECORDS_FILE}:4: not a request record ({why})")
    assert _files(run) == before  # the records, as measured


@pytest.mark.parametrize("text", ["[1, 2]", '{"format": "batchlab-compare", "pairs": []}'])
def test_summarize_reads_a_summary_that_is_no_summary_as_none_and_says_so(
        tmp_path: Path, text: str, caplog: pytest.LogCaptureFixture,
        capsys: pytest.CaptureFixture[str]) -> None:
    run = _live_run(tmp_path / "rp")
    assert cli_main(["summarize", str(run)]) == 0  # the parquet files and a summary
    assert (run / "requests.parquet").is_file()
    (run / "summary.json").write_text(text)
    with caplog.at_level(logging.WARNING):
        assert cli_main(["summarize", str(run)]) == 0
    assert f"warning: {run / 'summary.json'}: not a" in caplog.text
    assert "read as no earlier summary" in caplog.text
    summary = json.loads((run / "summary.json").read_text())
    assert summary["num_requests"] == 5
    assert "format" not in summary and "pairs" not in summary  # none of its keys kept


def test_summarize_reads_a_manifest_that_is_no_object_as_none(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run = _live_run(tmp_path / "rp")
    (run / "manifest.json").write_text("[1]")
    with caplog.at_level(logging.WARNING):
        assert cli_main(["summarize", str(run)]) == 0
    assert f"warning: {run / 'manifest.json'}: not a JSON object ([1]): read as no " \
           "manifest" in caplog.text
    assert json.loads((run / "summary.json").read_text())["num_requests"] == 5


def test_summarize_refuses_a_manifest_slo_that_is_no_slo_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _live_run(tmp_path / "rp")
    update_manifest(run, {"slo": [1, 2]})
    before = _files(run)
    capsys.readouterr()
    assert cli_main(["summarize", str(run)]) == 2
    assert _refused(capsys, "summarize") == (
        f"{run / 'manifest.json'}: slo is not an SLO ([1, 2]); pass --slo")
    assert _files(run) == before
    assert cli_main(["summarize", str(run), "--slo", "ttft_s=0.5"]) == 0
