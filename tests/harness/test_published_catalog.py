"""The catalog's accuracy: measured by `batchlab check-published --catalog --write-docs`,
recorded in adapters/reference/catalog_accuracy.json and docs/published.md, never by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adapters.reference.config import ReferenceConfig
from adapters.reference.cost_model import CostModelParams
from adapters.reference.prediction import (
    CATALOG_ACCURACY_FILE,
    catalog_accuracy,
    prediction_record,
)
from harness.published.catalog import (
    BEGIN,
    END,
    PUBLISHED_MD,
    catalog_digest,
    render_block,
    write_catalog,
)
from harness.published.check import check_rows
from harness.published.profiles import read_profile
from harness.published.replay import catalog_coefficients
from harness.published.rows import load_rows

STALE = "stale: run `batchlab check-published --catalog --write-docs`"


def _record() -> dict:
    return json.loads(CATALOG_ACCURACY_FILE.read_text())


def test_the_record_is_current() -> None:
    record = _record()
    assert record["inputs_digest"] == catalog_digest(), STALE
    assert record["num_rows"] == len(load_rows()) == len(record["predicted"]), STALE
    # code changes are not in the digest: a few rows simulated again must give the same values
    rows = {r.row_id: r for r in load_rows()}
    quick = ["fp8kv-8b-bf16-b1-1024-itl", "vci-8b-h200-tp1-latency",
             "trt017-8b-h100-sxm-tp1-128-128"]
    for c in check_rows([rows[i] for i in quick], jobs=1, catalog=True):
        assert c.prediction.predicted == pytest.approx(record["predicted"][c.row.row_id],
                                                       rel=1e-9), f"{c.row.row_id}: {STALE}"


def test_the_doc_shows_the_record() -> None:
    text = PUBLISHED_MD.read_text()
    block = text[text.index(BEGIN):text.index(END) + len(END)]
    assert block == render_block(_record()), STALE


def test_runs_without_a_profile_quote_the_record() -> None:
    record = _record()
    quoted = prediction_record(ReferenceConfig(model="llama-3.1-8b"))["accuracy"]
    assert quoted == catalog_accuracy()
    for key in ("median_abs_error", "worst_abs_error", "num_rows", "measured"):
        assert quoted[key] == record[key]


def test_catalog_coefficients_keep_the_engine_defaults_only() -> None:
    fitted = read_profile("trtllm-h100-sxm")
    catalog = catalog_coefficients(fitted)
    assert catalog.scheduler == fitted.scheduler and catalog.gpu == fitted.gpu
    assert catalog.params == CostModelParams(device=fitted.params.device,
                                             source="catalog datasheet coefficients")
    assert fitted.params.step_overhead_s != catalog.params.step_overhead_s


def test_writing_needs_the_markers_and_keeps_the_rest_of_the_doc(tmp_path: Path) -> None:
    rows = {r.row_id: r for r in load_rows()}
    checked = check_rows([rows["fp8kv-8b-bf16-b1-1024-itl"]], jobs=1, catalog=True)
    doc, record_file = tmp_path / "published.md", tmp_path / "catalog.json"
    doc.write_text("no markers here\n")
    with pytest.raises(ValueError, match=r"published\.md: the catalog accuracy markers"):
        write_catalog(checked, doc=doc, record_file=record_file)
    assert not record_file.exists()
    doc.write_text(f"before\n{BEGIN}\nold\n{END}\nafter\n")
    write_catalog(checked, doc=doc, record_file=record_file, measured="2026-01-01")
    text = doc.read_text()
    assert text.startswith("before\n" + BEGIN) and text.endswith(END + "\nafter\n")
    assert "old" not in text and "Measured 2026-01-01" in text
    assert json.loads(record_file.read_text())["num_rows"] == 1
