"""A predicted cell whose model or GPU is none of those its prediction's accuracy was measured
on says so in the report: under the accuracy table, and in the sentence above the key findings
that says the figures are predicted. The table used to quote the measured error as if it held
for such a cell (an H100 PCIe run, or profile tgi-h100-sxm, whose held-out figures are all of
a 70B model, on an 8B one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from adapters.reference.config import ReferenceConfig
from adapters.reference.prediction import prediction_record
from harness.cli import main
from harness.prediction import coverage_note, coverage_notes, kind_coverage_note
from harness.report.predictions import predicted_text, prediction_accuracy_lines
from harness.report.runs import CellResult

REPO = Path(__file__).resolve().parents[2]
EXCERPT = REPO / "harness" / "data" / "azure_conv_excerpt.csv"
SUMMARY = {"num_requests": 10, "num_completed": 10, "num_failed": 0, "duration_s": 10.0}

SXM = ReferenceConfig(model="llama-3.1-8b", gpu="h100-sxm")
PCIE = ReferenceConfig(model="llama-3.1-8b", gpu="h100-pcie")
TGI = ReferenceConfig(model="llama-3.1-8b", gpu="h100-sxm", profile="tgi-h100-sxm")
TRT = ReferenceConfig(model="llama-3.1-8b", gpu="h100-sxm", profile="trtllm-h100-sxm")


def _note(config: ReferenceConfig) -> str:
    note = coverage_note(prediction_record(config))
    assert note is not None
    return note


def _kind_note(config: ReferenceConfig, kind: str) -> str:
    note = kind_coverage_note(prediction_record(config), kind)
    assert note is not None
    return note


def _cell(name: str, config: ReferenceConfig, *, served: bool = False) -> CellResult:
    record = prediction_record(config)
    engine: dict[str, Any] = (
        {"name": "reference", "mode": "attach", "version_probe": {"body": {
            "prediction": record, "reference": config.as_dict()}}} if served else
        {"name": "reference", "mode": "simulated", "config": config.as_dict(),
         "prediction": record})
    return CellResult(name, Path(f"/nonexistent/{name}"), "done", summary=SUMMARY,
                      manifest={"kind": "live" if served else "simulated", "engine": engine})


def test_the_records_say_what_the_accuracy_was_never_measured_on() -> None:
    assert "this GPU h100-pcie" in _note(PCIE)
    assert "this model llama-3.1-8b" in _note(TGI)
    assert coverage_note(prediction_record(SXM)) is None
    assert coverage_note(prediction_record(TRT)) is None


def test_the_accuracy_table_says_of_which_cells_its_error_was_never_measured() -> None:
    cells = [_cell("reference", SXM), _cell("predicted-tgi", TGI),
             _cell("predicted-trtllm", TRT)]
    lines = prediction_accuracy_lines(cells)
    table_end = max(i for i, line in enumerate(lines) if line.startswith("|"))
    # the whole record's words first; then each kind whose own figures are of other models
    # or GPUs: trtllm-h100-sxm's held-out TTFT and TPOT/ITL figures are all of the 70B model,
    # the catalog's E2E figures all on the H200
    assert lines[table_end + 1:] == [
        "", f"For `predicted-tgi`: {_note(TGI)}.", "",
        f"For `predicted-trtllm`: {_kind_note(TRT, 'TTFT')}.", "",
        f"For `predicted-trtllm`: {_kind_note(TRT, 'TPOT/ITL')}.", "",
        f"For `reference`: {_kind_note(SXM, 'E2E')}.", ""]
    assert "published TTFT figures" in _kind_note(TRT, "TTFT")


def test_one_line_names_every_cell_a_record_says_it_of() -> None:
    cells = [_cell("a", PCIE), _cell("b", PCIE), _cell("served", PCIE, served=True),
             _cell("sxm", SXM)]
    lines = prediction_accuracy_lines(cells)
    assert [line for line in lines if "never measured" in line] == [
        f"For `a`, `b`, `served`: {_note(PCIE)}.", f"For `sxm`: {_kind_note(SXM, 'E2E')}."]
    assert f"For every cell: {_note(PCIE)}." in prediction_accuracy_lines(cells[:2])


def test_the_predicted_figures_sentence_says_it() -> None:
    cells = [_cell("reference", SXM), _cell("predicted-tgi", TGI)]
    assert predicted_text(cells) == (
        "Every figure here is **predicted** by the reference engine, not measured on hardware "
        "([how accurate the predictions are](#how-accurate-the-predictions-are)); but for "
        f"`predicted-tgi`, {_note(TGI)}.")
    assert predicted_text([_cell("reference", SXM), _cell("trt", TRT)]) == (
        "Every figure here is **predicted** by the reference engine, not measured on hardware "
        "([how accurate the predictions are](#how-accurate-the-predictions-are)).")


def test_a_run_on_a_gpu_no_published_figure_is_of_says_it_in_its_report(
        tmp_path: Path) -> None:
    run = tmp_path / "pcie"
    assert main(["simulate", "--gpu", "h100-pcie", "--trace", str(EXCERPT), "--limit", "20",
                 "--out", str(run)]) == 0
    text = (run / "report.md").read_text()
    note = _note(PCIE)
    assert ("Every figure here is **predicted** by the reference engine, not measured on "
            "hardware ([how accurate the predictions are](#how-accurate-the-predictions-are)); "
            f"but {note}.\n\n- Served 20 of 20") in text
    assert f"\nFor `pcie`: {note}.\n" in text


def test_the_note_under_each_table_says_it_too() -> None:
    """Under the TTFT table, "a median 32% off" must not read as the error of a cell the
    published figures never covered."""
    from harness.report.predictions import kind_note

    [alone, _] = kind_note([_cell("pcie", PCIE)], "TTFT", "TTFT")
    assert f"; but {_note(PCIE)} ([how accurate" in alone
    [mixed, _] = kind_note([_cell("reference", SXM), _cell("predicted-tgi", TGI)],
                           "throughput", "throughput")
    assert f"; but for `predicted-tgi`, {_note(TGI)} ([how accurate" in mixed
    [covered, _] = kind_note([_cell("reference", SXM), _cell("trt", TRT)], "throughput",
                             "throughput")
    assert "never measured" not in covered
    # of one kind only: trtllm-h100-sxm's held-out TTFT figures are all of the 70B model
    [ttft, _] = kind_note([_cell("reference", SXM), _cell("trt", TRT)], "TTFT", "TTFT")
    assert f"; but for `trt`, {_kind_note(TRT, 'TTFT')} ([how accurate" in ttft


# Llama-3.1-70B on two H100s in bf16 and fp8 (scenarios/fp8.yaml): the catalog's E2E figures
# are all on the H200 and all bf16, so every cell's E2E error is unmeasured for its GPU alone
BF16 = ReferenceConfig(model="llama-3.1-70b", gpu="h100-sxm", tp=2)
FP8 = ReferenceConfig(model="llama-3.1-70b", gpu="h100-sxm", tp=2,
                      weights_dtype="fp8", kv_cache_dtype="fp8")


def test_a_reason_every_cell_shares_is_said_once() -> None:
    """Four cells on the H100 used to get four notes, each repeating the GPU's words and adding
    its data types: one reason is enough to leave an error unmeasured."""
    fp8_notes = coverage_notes(prediction_record(FP8), "E2E")
    gpu = coverage_notes(prediction_record(BF16), "E2E")
    assert len(gpu) == 1 and "this GPU h100-sxm" in gpu[0]
    assert len(fp8_notes) == 3 and fp8_notes[0] == gpu[0]  # GPU, weights, KV cache
    assert "fp8 weights" in fp8_notes[1] and "fp8 KV cache" in fp8_notes[2]
    cells = [_cell("bf16", BF16), _cell("fp8", FP8), _cell("fp8-again", FP8)]
    lines = prediction_accuracy_lines(cells)
    assert [line for line in lines if "never measured" in line] == [f"For every cell: {gpu[0]}."]
    from harness.report.predictions import kind_note

    [e2e, _] = kind_note(cells, "E2E", "E2E latency")
    assert e2e.count("never measured") == 1 and f"; but {gpu[0]} ([how accurate" in e2e


def test_a_cell_that_shares_no_reason_keeps_all_of_its_own() -> None:
    """Alone, a cell's note names everything its figures are not of; two cells that share a
    reason are named together by it, the third by its whole note."""
    fp8_whole = _kind_note(FP8, "E2E")
    assert "this GPU h100-sxm" in fp8_whole and "fp8 weights" in fp8_whole
    [alone] = [line for line in prediction_accuracy_lines([_cell("fp8", FP8)])
               if "never measured" in line]
    assert alone == f"For `fp8`: {fp8_whole}."
    cells = [_cell("a", PCIE), _cell("fp8", FP8), _cell("b", PCIE)]
    assert [line for line in prediction_accuracy_lines(cells) if "never measured" in line] == [
        f"For `a`, `b`: {_note(PCIE)}.", f"For `fp8`: {fp8_whole}."]


def test_a_record_without_the_notes_one_by_one_reads_as_before() -> None:
    """A run recorded before the notes were kept reason by reason: its whole note, as it was."""
    record = prediction_record(FP8)
    for entry in record["coverage_by_kind"].values():
        del entry["each"]
    assert coverage_notes(record, "E2E") == [_kind_note(FP8, "E2E")]
    old = _cell("old", FP8)
    old.manifest["engine"]["prediction"] = record
    lines = prediction_accuracy_lines([old, _cell("bf16", BF16)])
    assert [line for line in lines if "never measured" in line] == [
        f"For `old`: {_kind_note(FP8, 'E2E')}.", f"For `bf16`: {_kind_note(BF16, 'E2E')}."]


def test_what_the_figures_are_not_of_is_said_by_itself() -> None:
    """A finding names what a cell's figures are not of, rather than claiming all of model,
    GPU and data types; a record written before it was kept says so in general words."""
    from harness.prediction import coverage_outside
    from harness.report.predictions import margin_caveat

    record = prediction_record(FP8)
    assert coverage_outside(record, "E2E") == (
        "is of this GPU h100-sxm nor has fp8 weights nor an fp8 KV cache")
    pcie = prediction_record(PCIE)
    assert coverage_outside(pcie, "TTFT") == "is of this GPU h100-pcie"
    assert coverage_outside(prediction_record(SXM), "TTFT") is None  # covered
    cell = _cell("pcie", PCIE)
    assert margin_caveat(cell, 0.010, 0.020, "TPOT/ITL").endswith(
        "figures like its own (none of them is of this GPU h100-pcie)")
    del pcie["coverage_outside"]
    assert coverage_outside(pcie, "TTFT") is None
    cell.manifest["engine"]["prediction"] = pcie
    assert margin_caveat(cell, 0.010, 0.020, "TPOT/ITL").endswith(
        "(none of them is of its model, GPU and data types all at once)")
