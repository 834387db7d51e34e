"""A prediction says when its model or GPU is none of those its accuracy was measured on."""

from __future__ import annotations

import json

import pytest

from adapters.reference import ReferenceConfig
from adapters.reference.cost_model import PROFILES_DIR
from adapters.reference.prediction import COVERAGE_FILE, prediction_record
from harness.prediction import coverage_note, kind_coverage_note, prediction_text
from harness.published.coverage import coverage
from harness.published.rows import load_rows


def test_the_coverage_file_is_what_the_rows_give() -> None:
    """Regenerate with `batchlab check-published --write-docs` when this fails."""
    assert json.loads(COVERAGE_FILE.read_text()) == coverage(load_rows())


def test_catalog_on_a_published_gpu_and_model_has_no_note() -> None:
    record = prediction_record(ReferenceConfig(model="llama-3.1-8b", gpu="h100-sxm"))
    assert "h100-sxm" in record["covers"]["gpus"]
    assert "llama-3.1-8b" in record["covers"]["models"]
    assert coverage_note(record) is None
    # but its two E2E figures are of the H200 alone: that kind's error is unmeasured here
    assert kind_coverage_note(record, "throughput") is None
    assert kind_coverage_note(record, "E2E") == (
        "none of the published E2E figures its accuracy was measured on is of this GPU "
        "h100-sxm (they are on h200): its error here was never measured")
    assert prediction_text(record).endswith(
        "; but none of the published E2E figures its accuracy was measured on is of this GPU "
        "h100-sxm: that error here was never measured")


def test_each_kind_says_when_its_own_figures_are_of_other_gpus() -> None:
    """An A100 run: throughput figures of the A100 exist, TTFT, TPOT/ITL and E2E ones do not,
    and the error quoted of each of those must not read as measured on it."""
    by_kind = coverage(load_rows())["catalog"]["by_kind"]
    assert "a100-80gb" in by_kind["throughput"]["gpus"]  # the premise
    assert all("a100-80gb" not in by_kind[k]["gpus"] for k in ("TTFT", "TPOT/ITL", "E2E"))
    record = prediction_record(ReferenceConfig(model="llama-3.1-8b", gpu="a100-80gb"))
    assert coverage_note(record) is None
    assert kind_coverage_note(record, "throughput") is None
    assert "published TTFT figures" in str(kind_coverage_note(record, "TTFT"))
    assert prediction_text(record).endswith(
        "; but none of the published TTFT, TPOT/ITL or E2E figures its accuracy was measured "
        "on is of this GPU a100-80gb: their errors here were never measured")
    # a GPU no figure at all is of: said once, of the whole record, whatever the kind
    pcie = prediction_record(ReferenceConfig(model="llama-3.1-8b", gpu="h100-pcie"))
    assert "coverage_by_kind" not in pcie
    assert kind_coverage_note(pcie, "TTFT") == coverage_note(pcie)


def test_a_gpu_no_figure_is_of_is_named() -> None:
    record = prediction_record(ReferenceConfig(model="llama-3.1-8b", gpu="h100-pcie"))
    note = coverage_note(record)
    assert note is not None and "GPU h100-pcie" in note and "h100-sxm" in note
    assert "model" not in note.split("(")[0]  # the model is covered
    assert note in prediction_text(record)


def test_a_profile_quotes_the_models_of_its_held_out_figures() -> None:
    """tgi-h100-sxm's held-out figures are all of the 70B model: an 8B prediction with it
    has an unmeasured error, although the catalog has 8B figures."""
    held = {r.model for r in load_rows()
            if r.profile_name == "tgi-h100-sxm"}
    assert held == {"llama-3.1-70b"}  # the premise: if it changes, pick another case
    record = prediction_record(ReferenceConfig(model="llama-3.1-8b", profile="tgi-h100-sxm"))
    note = coverage_note(record)
    assert note is not None and "model llama-3.1-8b" in note and "GPU" not in note
    by_path = prediction_record(ReferenceConfig(
        model="llama-3.1-8b", profile=str(PROFILES_DIR / "tgi-h100-sxm.json")))
    assert coverage_note(by_path) == note


@pytest.mark.parametrize("profile", ["trtllm-h100-sxm", "vllm-h200"])
def test_shipped_profiles_on_their_own_gpu_have_no_note(profile: str) -> None:
    record = prediction_record(ReferenceConfig(model="llama-3.1-8b", profile=profile))
    assert record["accuracy"] is not None
    assert coverage_note(record) is None
