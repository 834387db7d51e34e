"""Rows whose workload is only partly published: the rule, the length shapes, the table."""

from __future__ import annotations

import numpy as np
import pytest

from harness.published.check import CheckedRow, render_fidelity, stats_lines
from harness.published.profiles import read_profile
from harness.published.replay import LENGTH_SHAPES, RowPrediction, predict_row, request_lengths
from harness.published.rows import load_rows
from harness.published.sensitivity import (
    length_sensitivity,
    render_sensitivity,
    workload_published,
)

SHAREGPT_ROW = "vblog060-vllm-8b-a100-80gb-tp1-sharegpt"


def test_the_rule_looks_at_the_data_set_only() -> None:
    rows = load_rows()
    unpublished = {r.row_id for r in rows if not workload_published(r)}
    assert unpublished == {r.row_id for r in rows
                           if r.dataset in ("sharegpt", "orca-first-200", "govreport-20")}
    assert SHAREGPT_ROW in unpublished
    assert "fp8kv-8b-bf16-b1-1024-itl" not in unpublished


@pytest.mark.parametrize("shape", LENGTH_SHAPES)
def test_every_length_shape_keeps_the_published_means(shape: str) -> None:
    row = next(r for r in load_rows() if r.row_id == SHAREGPT_ROW)
    inputs, outputs = request_lengths(row, 4000, np.random.default_rng(0), shape)
    assert inputs.mean() == pytest.approx(row.input_tokens, rel=0.05)
    assert outputs.mean() == pytest.approx(row.output_tokens, rel=0.05)
    assert inputs.min() >= 1 and outputs.min() >= 1
    if shape == "fixed":
        assert set(outputs.tolist()) == {row.output_tokens}
    else:
        assert outputs.max() > 2 * row.output_tokens  # a tail, which is what the rows hinge on


def test_sharegpt_rows_replay_the_requests_of_vllms_sampler_in_order() -> None:
    row = next(r for r in load_rows() if r.row_id == "vci-8b-h200-tp1-throughput")
    inputs, outputs = request_lengths(row, row.num_requests, np.random.default_rng(0))
    # the bundled sample's first rows, in order (its means are the row's: scaled by ~1.001)
    assert inputs[:3].tolist() == [13, 25, 27]
    assert np.abs(outputs[:3] - np.array([120, 770, 233])).max() <= 1
    assert len(inputs) == 200 and round(inputs.mean()) == row.input_tokens == 213
    assert round(outputs.mean()) == row.output_tokens == 218


def test_an_unknown_length_shape_is_refused() -> None:
    row = next(r for r in load_rows() if r.row_id == SHAREGPT_ROW)
    with pytest.raises(ValueError, match="lengths: one of"):
        request_lengths(row, 10, np.random.default_rng(0), "lognormal")


def test_fixed_length_rows_do_not_depend_on_the_shape() -> None:
    row = next(r for r in load_rows() if r.row_id == "fp8kv-8b-bf16-b1-1024-itl")
    profile = read_profile(row.profile_name)
    values = {predict_row(row, profile, lengths=s).predicted for s in LENGTH_SHAPES}
    assert len(values) == 1


def test_sensitivity_of_a_sharegpt_row() -> None:
    rows = [r for r in load_rows() if r.row_id in (SHAREGPT_ROW, "fp8kv-8b-bf16-b1-1024-itl")]
    [item] = length_sensitivity(rows, jobs=1)  # fixed-length rows are left out
    row = next(r for r in rows if r.row_id == SHAREGPT_ROW)
    assert item.row_id == SHAREGPT_ROW and set(item.predicted) == set(LENGTH_SHAPES)
    used = predict_row(row, read_profile(row.profile_name)).predicted
    assert item.predicted["vllm-sample"] == pytest.approx(used)
    # every request at the mean ends the run sooner than a distribution with a tail
    assert item.predicted["fixed"] > item.predicted["vllm-sample"]
    assert item.spread == pytest.approx(max(item.predicted.values())
                                        / min(item.predicted.values()))
    lines = render_sensitivity([item], held_out={SHAREGPT_ROW})
    line = next(ln for ln in lines if ln.startswith(f"| `{SHAREGPT_ROW}` |"))
    assert "| held-out |" in line and f"{item.ratio('vllm-sample'):.2f}" in line
    assert render_sensitivity([], held_out=set()) == []


def test_statistics_with_and_without_unpublished_workloads() -> None:
    rows = [r for r in load_rows()
            if r.row_id in (SHAREGPT_ROW, "vblog060-vllm-8b-a100-80gb-tp1-decode")]
    checked = [CheckedRow(r, RowPrediction(r.row_id, r.value * ratio, r.value, 1, 0), True)
               for r, ratio in zip(rows, (1.5, 1.1) if rows[0].dataset == "sharegpt"
                                   else (1.1, 1.5), strict=True)]
    lines = stats_lines(checked)
    assert lines[1].startswith("held-out: 2 rows") and "worst 50.0%" in lines[1]
    assert lines[2].startswith("held-out, workload published: 1 rows")
    assert "worst 10.0%" in lines[2]
    doc = render_fidelity(checked, digest="0" * 16)
    assert "| held-out, workload published | 1 | 10.0% |" in doc
    assert "| partly unpublished |" in doc
