"""The note under goodput, SLO attainment and capacity tables names the latencies the SLO
bounds: it said "TTFT and TPOT" whatever the SLO, leaving out an E2E bound and naming TTFT
under a TPOT-only SLO."""

from __future__ import annotations

from pathlib import Path

from adapters.reference.config import ReferenceConfig
from adapters.reference.prediction import prediction_record
from harness.report.predictions import derived_note
from harness.report.runs import CellResult


def _cell(slo: dict[str, float]) -> CellResult:
    config = ReferenceConfig(model="llama-3.1-8b", gpu="h100-sxm")
    return CellResult("run", Path("/nonexistent/run"), "done",
                      summary={"num_requests": 1, "slo": slo},
                      manifest={"kind": "simulated", "engine": {
                          "name": "reference", "mode": "simulated",
                          "config": config.as_dict(), "prediction": prediction_record(config)}})


def test_the_note_names_the_latencies_the_slo_bounds() -> None:
    [note, _] = derived_note([_cell({"tpot_s": 0.05})], "Goodput and SLO attainment")
    assert "whose predicted TPOT met the SLO" in note and "TTFT" not in note
    assert "the notes under the TPOT table, and" in note
    [note, _] = derived_note([_cell({})], "Goodput", slo={"ttft_s": 1.0, "e2e_s": 5.0})
    assert "whose predicted TTFT and E2E latency met the SLO" in note
    [note, _] = derived_note([_cell({})], "Capacities at SLO", pace=True,
                             slo={"ttft_s": 1.0, "tpot_s": 0.05, "e2e_s": 5.0})
    assert "rest on predicted TTFT, TPOT and E2E latency (which requests met the SLO)" in note
    assert "the notes under the TTFT, TPOT, E2E latency and throughput tables" in note
