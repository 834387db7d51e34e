"""In a report that mixes predicted and measured cells, every predicted figure says so where it
is shown: a table's row, the capacity finding, a figure's legend; the load-curve and batch-size
tables carry the accuracy notes the other tables do; and the fidelity section compares a served
reference engine only with a simulation by its own cost model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from adapters.reference.config import ReferenceConfig
from adapters.reference.prediction import prediction_record
from harness.report.context import ReportContext
from harness.report.curves import Baselines, BatchRow, CapacityRow, CurvePoint, Series
from harness.report.fidelity import fidelity_pairs, prediction_section, render_fidelity_markdown
from harness.report.findings import key_findings
from harness.report.predictions import kind_note, row_labels
from harness.report.runs import CellResult
from harness.report.sections import (
    batch_size_section,
    capacity_section,
    curves_section,
    latency_section,
    throughput_section,
)

SUMMARY = {"num_requests": 10, "num_completed": 10, "num_failed": 0, "duration_s": 10.0,
           "throughput": {"output_tokens_per_s": 100.0, "requests_per_s": 1.0},
           "ttft_s": {"p50": 0.1, "p90": 0.2, "p99": 0.3, "mean": 0.12, "count": 10},
           "tpot_s": {"p50": 0.01, "p90": 0.02, "p99": 0.03, "mean": 0.012, "count": 10}}
MEASURED = {"name": "vllm", "mode": "launch"}
SLO = {"ttft_s": 0.5}


def _simulated_engine(config: ReferenceConfig) -> dict[str, Any]:
    return {"name": "reference", "mode": "simulated", "config": config.as_dict(),
            "prediction": prediction_record(config)}


def _served_engine(config: ReferenceConfig) -> dict[str, Any]:
    """A live run's engine record when its server was ``batchlab serve reference``: the
    server's ``/version`` answer carries its prediction record and settings."""
    return {"name": "reference", "mode": "attach", "version_probe": {"body": {
        "prediction": prediction_record(config), "reference": config.as_dict()}}}


def _cell(name: str, engine: dict[str, Any], *, kind: str = "simulated",
          setting: str | None = None) -> CellResult:
    manifest = {"kind": kind, "engine": engine, "trace": {"digest": "abc"}}
    cell = {"engine": {"name": setting}} if setting else {}
    return CellResult(name, Path(f"/nonexistent/{name}"), "done", summary=SUMMARY,
                      manifest=manifest, cell=cell)


CATALOG = ReferenceConfig(model="llama-3.1-8b", gpu="h100-sxm")
TRT = ReferenceConfig(model="llama-3.1-8b", gpu="h100-sxm", profile="trtllm-h100-sxm")


def _measured(name: str = "meas", setting: str | None = None) -> CellResult:
    return _cell(name, MEASURED, kind="live", setting=setting)


def _sim(name: str, config: ReferenceConfig, setting: str | None = None) -> CellResult:
    return _cell(name, _simulated_engine(config), setting=setting)


# ---------------------------------------------------------------- prediction fidelity


def test_a_served_reference_is_compared_with_the_simulation_by_its_own_cost_model() -> None:
    served = _cell("served", _served_engine(CATALOG), kind="live")
    trt, cat = _sim("trt", TRT), _sim("cat", CATALOG)
    assert fidelity_pairs([trt, cat, served]) == [(served, cat)]  # not the first simulated
    text = "\n".join(prediction_section([trt, cat, served]))
    assert "### `served` served, `cat` simulated" in text
    assert ("`served` and `cat` predict with the same cost model (catalog coefficients) and "
            "the same settings, so this compares the simulation with its own served form: "
            "what HTTP, the client and real time add") in text
    assert "| metric | predicted | served reference (itself predicted) | error |" in text
    # the same cost model with other settings: the errors are partly theirs
    other = _sim("cat64", ReferenceConfig(model="llama-3.1-8b", gpu="h100-sxm",
                                          max_num_seqs=64))
    text = "\n".join(prediction_section([other, served]))
    assert "but with other settings (max_num_seqs 256 served, 64 simulated" in text
    assert "and the same settings" not in text


def test_a_served_reference_against_another_profile_says_it_compares_two_cost_models() -> None:
    """The served reference with no simulation by its own cost model (a profile calibrated on
    it, say) is compared with another's, and the section says plainly which models differ:
    not what HTTP adds."""
    served = _cell("served", _served_engine(CATALOG), kind="live")
    trt = _sim("trt", TRT)
    assert fidelity_pairs([trt, served]) == [(served, trt)]
    text = "\n".join(prediction_section([trt, served]))
    assert "### `served` served, `trt` simulated" in text
    assert ("`served` and `trt` predict with different cost models (served with catalog "
            "coefficients, simulated with profile `trtllm-h100-sxm`): the errors are the two "
            "models' differences together with what HTTP, the client and real time add, not "
            "what HTTP adds alone") in text
    assert "neither side is a measurement of hardware" in text
    assert "the same cost model" not in text


def test_the_same_profile_with_other_coefficients_is_another_cost_model() -> None:
    served = _cell("served", _served_engine(CATALOG), kind="live")
    engine = dict(_simulated_engine(CATALOG))
    engine["config"] = {**engine["config"], "cost_model_digest": "0123456789abcdef"}
    edited, same = _cell("edited", engine), _sim("same", CATALOG)
    assert fidelity_pairs([edited, same, served]) == [(served, same)]
    text = "\n".join(prediction_section([edited, served]))
    assert ("predict with different cost models (cost_model_digest "
            f"{CATALOG.as_dict()['cost_model_digest']} served, 0123456789abcdef simulated)"
            ) in text


def test_the_fidelity_markdown_says_when_its_live_side_is_itself_predicted() -> None:
    fid = {"ttft_s": {"p50": {"predicted": 0.1, "measured": 0.2, "relative_error": -0.5}}}
    plain = render_fidelity_markdown(fid)
    assert "| metric | predicted | measured | error |" in plain
    assert "itself" not in plain and "what the live engine measured" in plain
    served = render_fidelity_markdown(fid, live_engine=_served_engine(TRT))
    assert "| metric | predicted | served reference (itself predicted) | error |" in served
    assert ("The live side is the reference engine served over HTTP, itself a prediction: its "
            "step times are predicted with profile `trtllm-h100-sxm`") in served
    assert "Error = (predicted − served) / served." in served
    # a real engine's record: measured
    assert "| predicted | measured |" in render_fidelity_markdown(fid, live_engine=MEASURED)
    # without the live run's record, `batchlab validate`'s context names the engine it drove
    validated = render_fidelity_markdown({**fid, "context": {"engine": "reference"}})
    assert "served reference (itself predicted)" in validated
    assert "predicted with its cost model" in validated
    assert "| predicted | measured |" in render_fidelity_markdown(
        {**fid, "context": {"engine": "vllm"}})


# ---------------------------------------------------------------- tables and findings


def test_a_mixed_reports_rows_say_which_cells_are_predicted() -> None:
    meas, sim = _measured(), _sim("sim", TRT)
    served = _cell("served", _served_engine(CATALOG), kind="live")
    assert row_labels([meas, sim, served]) == {"meas": "`meas`", "sim": "`sim` (predicted)",
                                               "served": "`served` (predicted)"}
    ok = [meas, sim]
    bases = Baselines.of(ok, meas)
    ttft = "\n".join(latency_section(ok, bases)).split("### TTFT")[1]
    assert "| `meas` | 100 ms | 200 ms |" in ttft
    assert "| `sim` (predicted) | 100 ms (±0%) |" in ttft
    assert "| `sim` (predicted) | 1 (±0%) |" in "\n".join(throughput_section(ok, bases))
    # a wholly predicted report says so once, above its tables: no row is marked
    both = [sim, served]
    assert "(predicted)" not in "\n".join(latency_section(both, Baselines.of(both, sim)))


def test_a_mixed_reports_capacity_finding_says_which_capacity_is_predicted() -> None:
    stub = _measured("stub", setting="stub")
    trt = _sim("ref-trt", TRT, setting="ref-trt")
    rows = [CapacityRow("stub", "rate", 8.0, "≥", "interpolated", "every load point met it",
                        ("stub",), slo=SLO),
            CapacityRow("ref-trt", "rate", 2.0, "<", "interpolated", "even the lowest missed",
                        ("ref-trt",), slo=SLO)]
    ctx = ReportContext(title="t", slo=SLO)
    finding = key_findings([stub, trt], stub, ctx, {}, capacity=rows)[0]
    assert finding.endswith("`stub` ≥ 8 req/s (interpolated; baseline); "
                            "`ref-trt` < 2 req/s (interpolated; predicted).")
    table = "\n".join(capacity_section(rows, "stub", SLO, 0.99, cells=[stub, trt]))
    assert "| `ref-trt` (predicted) | < 2 req/s |" in table and "| `stub` | ≥ 8" in table
    # every capacity predicted: the banner above the findings says so, not each capacity
    other = _sim("stub", CATALOG, setting="stub")
    finding = key_findings([other, trt], other, ctx, {}, capacity=rows)[0]
    assert "predicted" not in finding


def _curve_cells() -> list[CellResult]:
    return [_sim("r1", TRT, setting="ref"), _sim("r2", TRT, setting="ref"),
            _measured("m1", setting="live"), _measured("m2", setting="live")]


def _series() -> list[Series]:
    def point(cell: str, load: float) -> CurvePoint:
        return CurvePoint(cell, load, 100.0, 0.01, 0.02, 0.2, 0.99, slo=SLO)

    return [Series("ref", "rate", (point("r1", 1.0), point("r2", 2.0))),
            Series("live", "rate", (point("m1", 1.0), point("m2", 2.0)))]


def test_the_load_curves_say_how_far_their_kinds_of_figure_were_measured_to_miss() -> None:
    cells = _curve_cells()
    text = "\n".join(curves_section(_series(), False, cells))
    assert "| 1 req/s | `r1` (predicted) | 100 |" in text and "| 1 req/s | `m1` | 100 |" in text
    assert "no predicted p90 or p99 below was ever compared with a published figure" in text
    for kind, label in (("throughput", "output tokens/s"), ("TPOT/ITL", "TPOT"),
                        ("TTFT", "TTFT")):
        assert (f"How far predicted {label} was measured to miss published {kind} figures: "
                "`r1`, `r2` a median") in text, kind
    assert "SLO attainments of `r1`, `r2` are predicted" in text
    measured = [c for c in cells if c.name.startswith("m")]
    text = "\n".join(curves_section(_series()[1:], False, measured))
    assert "predicted" not in text


def test_the_batch_size_table_says_where_its_tpot_and_throughputs_errors_are_said() -> None:
    def rows(cells: list[CellResult]) -> list[BatchRow]:
        return [BatchRow(c, cap, None, "–", None, False, "–")
                for c, cap in zip(cells, (8, 16, 32), strict=True)]

    sims = [_sim(f"s{cap}", TRT) for cap in (8, 16, 32)]
    meas = _measured()
    text = "\n".join(batch_size_section({"": rows(sims)}, report_cells=[*sims, meas]))
    # where their error is said, not those notes again (the report has them under the TPOT and
    # Throughput tables); the measured cell is not among those said to be predicted
    assert ("The TPOT and output tokens/s of `s8`, `s16`, `s32` are predicted, as in the TPOT "
            "and Throughput tables, under which their measured error is said") in text
    assert "How far" not in text and "no predicted p90 or p99 below" not in text
    assert "Running batches, KV use, what bound them and the turn of `s8`, `s16`, `s32`" in text
    assert "| 8 | `s8` (predicted) |" in text
    alone = "\n".join(batch_size_section({"": rows(sims)}))
    assert "| 8 | `s8` |" in alone  # the whole report predicted: no row marked
    assert "The TPOT and output tokens/s of every cell are predicted" in alone
    measured = [_measured(f"m{cap}") for cap in (8, 16, 32)]
    assert "predicted" not in "\n".join(batch_size_section({"": rows(measured)}))


def test_an_accuracy_note_says_which_way_the_errors_lean() -> None:
    [note, _] = kind_note([_sim("cat", CATALOG)], "TTFT", "TTFT")
    by_kind = prediction_record(CATALOG)["accuracy"]["by_kind"]["TTFT"]
    n, low = by_kind["num_rows"], by_kind["num_rows"] - by_kind["num_over"]
    assert 4 * low >= 3 * n  # the catalog's TTFT: predicted low, nearly always
    assert f"over {n} figures from 3 sources ({low} of {n} predicted low)" in note
    [note, _] = kind_note([_sim("a", TRT), _sim("b", TRT)], "E2E", "E2E latency")
    assert "no held-out E2E figure for any cell" in note


# ---------------------------------------------------------------- figures


def test_a_mixed_figures_legend_marks_its_predicted_lines(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.report import plots, render

    sim, live = tmp_path / "sim", tmp_path / "live"
    for run, engine in ((sim, _simulated_engine(TRT)), (live, MEASURED)):
        run.mkdir()
        (run / "manifest.json").write_text(json.dumps({"engine": engine}))
    assert render._legend_labels({"sim": sim, "live": live}) == {"sim": "sim (predicted)",
                                                                 "live": "live"}
    assert render._legend_labels({"sim": sim}) == {"sim": "sim"}  # the note says it
    drawn: list[list[str]] = []
    monkeypatch.setattr(render, "request_columns",
                        lambda run_dir: {"ttft_s": np.array([0.1, 0.2])})
    monkeypatch.setattr(plots, "latency_cdfs",
                        lambda series, path, note=None: drawn.append(list(series)))
    render._latency_figure({"sim": sim, "live": live}, tmp_path / "latency_cdf.png")
    assert drawn == [["sim (predicted)", "live"]]

    lines: list[list[str]] = []
    monkeypatch.setattr(plots, "throughput_latency", lambda curves, path, slo=None, note=None:
                        lines.append([c.label for c in curves]))
    cells = [CellResult(c.name, tmp_path / c.name, "done", summary=SUMMARY,
                        manifest=dict(c.manifest),
                        cell={**c.cell, "load": {"kind": "rate", "value": float(c.name[1])}})
             for c in _curve_cells()]
    render._draw_plots(cells, tmp_path / "out", ReportContext(title="t"), {}, whole=cells)
    assert lines == [["ref (predicted)", "live"]]
