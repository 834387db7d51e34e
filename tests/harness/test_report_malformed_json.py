"""A run folder whose summary.json or manifest.json has a field of another type than batchlab
writes there (an edit, another tool's file) is read as far as it can be, never a traceback.

A manifest with `[1]` for its objects stopped `report`, `summarize` and `compare` with an
AttributeError; a summary with `"failures": [1]` stopped `report` with a TypeError, and one with
`"num_requests": "x"` with "Cannot specify ',' with 's'.", naming neither file nor field.
Now the fields read are checked once, where the folder is loaded (``runs.SUMMARY_FIELDS``,
``MANIFEST_FIELDS``, ``CELL_FIELDS``): a summary with a wrong-typed field is a failed cell that
says which and how to rebuild it, a manifest's is read as absent and said."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from harness.cli import main
from harness.compare import compare
from harness.report.runs import (
    MANIFEST_FIELDS,
    SUMMARY_FIELDS,
    WrongType,
    check_fields,
    load_run,
    without,
)

REPO = Path(__file__).resolve().parents[2]
EXCERPT = REPO / "harness" / "data" / "azure_conv_excerpt.csv"


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("malformed") / "sim"
    assert main(["simulate", "--trace", str(EXCERPT), "--limit", "20", "--no-report",
                 "--out", str(run)]) == 0
    return run


def damaged(sim: Path, to: Path, file: str, change: dict[str, Any]) -> Path:
    """A copy of ``sim`` with ``change`` written over the top-level fields of ``file``."""
    shutil.copytree(sim, to)
    record = json.loads((to / file).read_text())
    record.update(change)
    (to / file).write_text(json.dumps(record))
    return to


def every_object_a_list(sim: Path, to: Path) -> Path:
    manifest = json.loads((sim / "manifest.json").read_text())
    return damaged(sim, to, "manifest.json",
                   {k: [1] for k, v in manifest.items() if isinstance(v, dict)})


def test_a_whole_run_folder_reads_as_written(sim: Path) -> None:
    cell = load_run(sim)
    assert cell.ok and cell.unread == ()


@pytest.mark.parametrize(("change", "said"), [
    ({"failures": [1]}, "failures: expected an object, got a list"),
    ({"num_requests": "x"}, "num_requests: expected a number, got a string"),
])
def test_a_summary_with_a_field_of_another_type_is_a_failed_cell_that_says_which(
        sim: Path, tmp_path: Path, change: dict[str, Any], said: str) -> None:
    bad = damaged(sim, tmp_path / "bad", "summary.json", change)
    assert main(["report", str(bad)]) == 0
    text = (bad / "report.md").read_text()
    reason = (f"summary.json: {said}; `batchlab summarize {bad}` rebuilds it from the run's "
              "requests")
    assert f"`bad` did not finish: {reason}." in text
    assert f"| failed: {reason} |" in text
    # and the command it names does rebuild it
    assert main(["summarize", str(bad)]) == 0
    assert load_run(bad).ok


def test_the_other_cells_of_a_report_still_render(sim: Path, tmp_path: Path) -> None:
    bad = damaged(sim, tmp_path / "bad", "summary.json",
                  {"ttft_s": {"p90": "slow"}, "by_priority": {"0": {"failures": 3}}})
    out = tmp_path / "report.md"
    assert main(["report", str(sim), str(bad), "-o", str(out)]) == 0
    text = out.read_text()
    assert ("failed: summary.json: ttft_s.p90: expected a number, got a string; "
            "by_priority.0.failures: expected an object, got a number; `batchlab summarize") in text
    assert "| `sim` | 10.4 ms |" in text  # the whole cell's latency row


def test_a_manifest_field_of_another_type_is_read_as_absent_and_said(
        sim: Path, tmp_path: Path) -> None:
    bad = every_object_a_list(sim, tmp_path / "bad")
    assert main(["report", str(bad)]) == 0
    text = (bad / "report.md").read_text()
    assert ("- In `bad`, fields of another type than batchlab writes there were read as absent "
            "(what they record is not known here): manifest.json: engine: expected an object, "
            "got a list; knobs: expected an object, got a list; trace: expected an object, got "
            "a list; load: expected an object, got a list; roofline: expected an object, got "
            "a list.") in text
    assert "every knob was applied as given" not in text
    assert "| `bad` | 10.4 ms |" in text  # its figures, from its whole summary
    # summarize draws its report again from the manifest: it stopped there too
    assert main(["summarize", str(bad)]) == 0


def test_compare_says_a_side_whose_manifest_cannot_be_read_and_claims_no_difference(
        sim: Path, tmp_path: Path) -> None:
    bad = every_object_a_list(sim, tmp_path / "bad")
    assert main(["compare", str(sim), str(bad)]) == 0
    found = compare(sim, bad)
    said = {d.aspect: d.text for d in found.differences}
    assert said == {"manifest": "after's manifest.json: engine: expected an object, got a "
                                "list; knobs: expected an object, got a list; trace: expected "
                                "an object, got a list; load: expected an object, got a list; "
                                "roofline: expected an object, got a list: read as absent, so "
                                "what it recorded is not known"}
    assert [c.judgement for p in found.pairs for c in p.changes if c.judgement != "n/a"] == [
        "same"] * 12  # (goodput: no SLO)


def test_compare_of_a_summary_of_another_type_names_it(sim: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    bad = damaged(sim, tmp_path / "bad", "summary.json", {"num_requests": "x"})
    assert main(["compare", str(sim), str(bad), "--fail-if", "ttft_s.p90=10"]) == 1
    assert "num_requests: expected a number, got a string" in capsys.readouterr().out


def test_a_cell_json_field_of_another_type_is_read_as_absent(sim: Path, tmp_path: Path
                                                             ) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(sim, bad)
    (bad / "cell.json").write_text(json.dumps({"knobs": ["x"], "load": {"kind": "rate",
                                                                       "value": "fast"}}))
    cell = load_run(bad)
    assert [str(w) for w in cell.unread] == [
        "cell.json: knobs: expected an object, got a list",
        'cell.json: load.value: expected a number or "inf", got a string']
    assert cell.knobs["max_num_seqs"] == 256  # its manifest's
    assert main(["report", str(bad)]) == 0


def test_a_prediction_record_field_of_another_type_is_read_as_absent(
        sim: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(sim, bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest["engine"]["prediction"]["accuracy"]["by_kind"]["TTFT"]["num_rows"] = "29"
    (bad / "manifest.json").write_text(json.dumps(manifest))
    cell = load_run(bad)
    assert [str(w) for w in cell.unread] == [
        "manifest.json: engine.prediction.accuracy.by_kind.TTFT.num_rows: expected a number, "
        "got a string"]
    assert "num_rows" not in cell.manifest["engine"]["prediction"]["accuracy"]["by_kind"]["TTFT"]
    assert json.loads((bad / "manifest.json").read_text()) == manifest  # the file untouched
    assert main(["report", str(bad)]) == 0


def test_check_fields_reads_null_as_not_recorded_and_a_boolean_as_no_number() -> None:
    summary: dict[str, Any] = {"num_requests": None, "num_failed": True,
                               "failures": {"timeout": "2"}, "by_priority": {"1": {"ttft_s": []}}}
    assert [str(w) for w in check_fields(summary, SUMMARY_FIELDS, "summary.json")] == [
        "summary.json: num_failed: expected a number, got true",
        "summary.json: failures.timeout: expected a number, got a string",
        "summary.json: by_priority.1.ttft_s: expected an object, got a list"]
    manifest = {"command": ["batchlab", 3], "knobs": {"policy": "fcfs", "extra_args": [1]}}
    wrong = check_fields(manifest, MANIFEST_FIELDS, "manifest.json")
    assert wrong == [WrongType("manifest.json", ("command",), "a list of strings",
                               "a list holding a number")]
    assert without(manifest, wrong) == {"knobs": {"policy": "fcfs", "extra_args": [1]}}


def test_a_parquet_column_of_another_type_is_bad_input_naming_the_file_and_column(
        sim: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """requests.parquet whose latency column holds text: `report` exits 2 naming the file and
    the column, no traceback."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    run = tmp_path / "run"
    shutil.copytree(sim, run)
    table = pq.read_table(run / "requests.parquet")
    table = table.set_column(table.schema.get_field_index("ttft_s"), "ttft_s",
                             pa.array(["x"] * table.num_rows))
    pq.write_table(table, run / "requests.parquet")
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"{run / 'requests.parquet'}: column ttft_s: not a numeric column: string" in err
    assert "Traceback" not in err


def test_a_summary_replaced_by_another_document_is_no_summary(
        sim: Path, tmp_path: Path) -> None:
    """A JSON object with none of a summary's fields (a comparison written over it) is not a
    run that served nothing: the cell says its summary cannot be read and how to rebuild it."""
    run = tmp_path / "run"
    shutil.copytree(sim, run)
    (run / "summary.json").write_text(json.dumps({"format": "batchlab-compare", "pairs": []}))
    cell = load_run(run)
    assert cell.state == "failed" and "cannot be read as a summary" in cell.reason
    assert "batchlab summarize" in cell.reason
