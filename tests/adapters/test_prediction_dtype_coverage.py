"""A prediction says when its weights or KV-cache data type is none of those of the published
figures its accuracy was measured on, as it says of a model or GPU; and a profile given by
path that is an unchanged copy of a shipped one quotes that one's coverage, wherever the copy
lies and whatever it is called."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from adapters.knobs import Knobs
from adapters.reference import prediction
from adapters.reference.config import ReferenceConfig
from adapters.reference.cost_model import PROFILES_DIR
from adapters.reference.prediction import prediction_record
from harness.cli import main
from harness.prediction import coverage_note, kind_coverage_note, prediction_text
from harness.published.coverage import coverage
from harness.published.rows import load_rows
from harness.report.predictions import prediction_accuracy_lines
from harness.report.runs import CellResult

VLLM = "vllm-h100-sxm"


def _config(*, model: str, gpu: str | None = None, profile: str | None = None,
            **knobs: Any) -> ReferenceConfig:
    """As the command line and scenarios build it: the profile's engine defaults for the
    knobs not given (its accuracy is quoted with no note of other settings)."""
    return ReferenceConfig.from_knobs(Knobs.from_mapping(knobs), model=model, gpu=gpu,
                                      profile=profile)


FP8 = _config(model="llama-3.1-8b", gpu="h100-sxm", profile=VLLM,
              weights_dtype="fp8", kv_cache_dtype="fp8")
FP8_NOTE = ("none of the published figures its accuracy was measured on has fp8 weights (they "
            "are bf16) nor an fp8 KV cache (theirs are bf16): its error here was never measured")


def test_the_coverage_file_lists_the_rows_data_types() -> None:
    rows = load_rows()
    held = coverage(rows)["profiles"][VLLM]
    assert held["weights_dtypes"] == ["bf16"]  # the premise: no vLLM row has FP8 weights
    assert not any(r.engine == "vllm" and r.weights_dtype == "fp8" for r in rows)
    assert held["by_kind"]["throughput"]["kv_cache_dtypes"] == ["bf16"]
    catalog = coverage(rows)["catalog"]
    assert catalog["weights_dtypes"] == catalog["kv_cache_dtypes"] == ["bf16", "fp8"]
    assert catalog["by_kind"]["E2E"]["weights_dtypes"] == ["bf16"]


def test_fp8_weights_and_kv_cache_outside_a_profiles_figures_are_said() -> None:
    record = prediction_record(FP8)
    assert record["covers"]["weights_dtypes"] == ["bf16"]
    assert coverage_note(record) == FP8_NOTE
    assert kind_coverage_note(record, "throughput") == FP8_NOTE
    assert prediction_text(record).endswith(f"; but {FP8_NOTE}")
    # the same profile in BF16: covered, nothing said
    bf16 = prediction_record(_config(model="llama-3.1-8b", gpu="h100-sxm",
                                     profile=VLLM))
    assert coverage_note(bf16) is None and "coverage_by_kind" not in bf16


def test_a_kv_cache_dtype_alone_is_said() -> None:
    record = prediction_record(_config(model="llama-3.1-8b", gpu="h100-sxm",
                                       profile=VLLM, kv_cache_dtype="fp8"))
    assert coverage_note(record) == (
        "none of the published figures its accuracy was measured on has an fp8 KV cache "
        "(theirs are bf16): its error here was never measured")


def test_a_data_type_one_kind_of_figure_lacks_is_said_of_that_kind() -> None:
    """The catalog has FP8 throughput, TTFT and TPOT/ITL figures, but its E2E figures are all
    BF16 (and of the H200)."""
    record = prediction_record(_config(model="llama-3.1-8b", gpu="h200",
                                       weights_dtype="fp8", kv_cache_dtype="fp8"))
    assert coverage_note(record) is None
    assert kind_coverage_note(record, "throughput") is None
    assert kind_coverage_note(record, "E2E") == (
        "none of the published E2E figures its accuracy was measured on has fp8 weights (they "
        "are bf16) nor an fp8 KV cache (theirs are bf16): its error here was never measured")
    assert prediction_text(record).endswith(
        "; but none of the published E2E figures its accuracy was measured on has fp8 weights "
        "nor an fp8 KV cache: that error here was never measured")
    # with a GPU they are not of either: one sentence names both
    sxm = prediction_record(_config(model="llama-3.1-8b", gpu="h100-sxm",
                                    weights_dtype="fp8"))
    assert prediction_text(sxm).endswith(
        "; but none of the published E2E figures its accuracy was measured on is of this GPU "
        "h100-sxm nor has fp8 weights: that error here was never measured")


def test_the_command_line_says_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["costmodel", "--profile", VLLM, "--weights-dtype", "fp8",
                 "--kv-cache-dtype", "fp8"]) == 0
    lines = capsys.readouterr().out.splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("figures above: predicted"))
    assert lines[-1] == f"  but {FP8_NOTE}" and first < len(lines) - 1


def test_the_reports_accuracy_notes_say_it() -> None:
    record = prediction_record(FP8)
    cell = CellResult("fp8", Path("/nonexistent/fp8"), "done", summary={}, manifest={
        "kind": "simulated", "engine": {"name": "reference", "mode": "simulated",
                                        "config": FP8.as_dict(), "prediction": record}})
    assert f"For `fp8`: {FP8_NOTE}." in prediction_accuracy_lines([cell])


def test_a_coverage_file_without_data_types_says_nothing_of_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One written before they were listed."""
    covers: dict[str, Any] = {"models": ["llama-3.1-8b"], "gpus": ["h100-sxm"],
                              "by_kind": {"throughput": {"models": ["llama-3.1-8b"],
                                                         "gpus": ["h100-sxm"]}}}
    monkeypatch.setattr(prediction, "coverage_record", lambda: {"profiles": {VLLM: covers}})
    record = prediction.prediction_record(FP8)
    assert record["covers"] == {"models": ["llama-3.1-8b"], "gpus": ["h100-sxm"]}
    assert "coverage_note" not in record and "coverage_by_kind" not in record


def test_a_record_written_before_data_types_were_covered_reads_as_before() -> None:
    """Its ``outside`` names what the figures are not of, without a verb."""
    record = {"profile": None, "accuracy": {"median_abs_error": 0.1, "worst_abs_error": 0.2,
                                            "num_rows": 3,
                                            "by_kind": {"TTFT": {"median_abs_error": 0.1,
                                                                 "worst_abs_error": 0.2,
                                                                 "num_rows": 3}}},
              "coverage_by_kind": {"TTFT": {"note": "none of ...", "outside":
                                            "GPU a100-80gb"}}}
    assert prediction_text(record).endswith(
        "; but none of the published TTFT figures its accuracy was measured on is of this GPU "
        "a100-80gb: that error here was never measured")


# ---- a copy of a shipped profile, given by path


def _copy(tmp_path: Path, name: str, as_name: str, edit: dict[str, Any] | None = None) -> str:
    path = tmp_path / f"{as_name}.json"
    if edit is None:
        shutil.copyfile(PROFILES_DIR / f"{name}.json", path)
    else:
        raw = json.loads((PROFILES_DIR / f"{name}.json").read_text())
        path.write_text(json.dumps({**raw, **edit}, indent=2))
    return str(path)


@pytest.mark.parametrize("as_name", ["tgi-copy", "tgi-h100-sxm", "vllm-h100-sxm"])
def test_an_unchanged_copy_has_its_shipped_profiles_coverage(tmp_path: Path,
                                                             as_name: str) -> None:
    """Whatever the copy is called: even the name of another shipped profile."""
    by_name = prediction_record(_config(model="llama-3.1-8b", profile="tgi-h100-sxm"))
    note = coverage_note(by_name)
    assert note is not None and "model llama-3.1-8b" in note  # the premise
    copy = prediction_record(_config(model="llama-3.1-8b",
                                     profile=_copy(tmp_path, "tgi-h100-sxm", as_name)))
    assert copy["accuracy"] == by_name["accuracy"]
    assert copy["covers"] == by_name["covers"]
    assert coverage_note(copy) == note


def test_a_copy_with_other_words_only_keeps_its_coverage(tmp_path: Path) -> None:
    """``source`` is not what it predicts with (``profile_digest``): the accuracy and its
    coverage still hold."""
    path = _copy(tmp_path, "tgi-h100-sxm", "mine", {"source": "my copy"})
    record = prediction_record(_config(model="llama-3.1-8b", profile=path))
    assert record["accuracy"] is not None
    assert coverage_note(record) is not None and "model llama-3.1-8b" in str(
        coverage_note(record))


def test_an_edited_copy_quotes_no_accuracy(tmp_path: Path) -> None:
    raw = json.loads((PROFILES_DIR / "tgi-h100-sxm.json").read_text())
    path = _copy(tmp_path, "tgi-h100-sxm", "edited",
                 {"memory_efficiency": raw["memory_efficiency"] * 0.9})
    record = prediction_record(_config(model="llama-3.1-8b", profile=path))
    assert record["accuracy"] is None and "covers" not in record
    assert "its accuracy is not known" in prediction_text(record)


def test_a_simulated_copy_says_it_as_the_shipped_name_does(tmp_path: Path) -> None:
    trace = Path(__file__).resolve().parents[2] / "harness" / "data" / "azure_conv_excerpt.csv"
    path = _copy(tmp_path, "tgi-h100-sxm", "tgi-copy")
    runs = {}
    for name, profile in (("copy", path), ("shipped", "tgi-h100-sxm")):
        assert main(["simulate", "--profile", profile, "--trace", str(trace), "--limit", "20",
                     "--out", str(tmp_path / name), "--no-report"]) == 0
        runs[name] = json.loads((tmp_path / name / "summary.json").read_text())["prediction"]
    note = runs["shipped"]["record"]["coverage_note"]
    assert "never measured" in note
    assert runs["copy"]["record"]["coverage_note"] == note
    assert runs["copy"]["text"].endswith(f"; but {note}")
