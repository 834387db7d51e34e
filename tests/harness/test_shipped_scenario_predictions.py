"""The predicted cells of the shipped scenarios/engines-h100.yaml: each live engine has a
reference cell predicting it with that engine's shipped H100 profile, and the label the report
gives it says "predicted", names the profile and quotes the profile's stored held-out error."""

from __future__ import annotations

from pathlib import Path

from adapters.reference.cost_model import shipped_profiles
from adapters.reference.prediction import prediction_record
from harness.prediction import prediction_text
from harness.published.profiles import read_profile
from harness.report.format import code, fmt_pct
from harness.report.predictions import prediction_row
from harness.report.runs import CellResult
from harness.scenario import load_scenario
from harness.scenario.cell import reference_config

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "engines-h100.yaml"


def _bold(text: str) -> str:
    return f"**{text}**"  # the report's mark for "predicted"


def test_engines_h100_predicts_each_live_engine_with_its_shipped_profile() -> None:
    scenario = load_scenario(SCENARIO)
    cells = scenario.cells()
    predicted = [c for c in cells if c.engine.engine == "reference" and c.engine.profile]
    live = [c for c in cells if c.engine.mode == "live"]
    assert {c.engine.engine for c in live} == {"vllm", "tgi", "trtllm"}
    # every live engine has exactly one cell predicting it, named for it
    profiles = {c.engine.name: c.engine.profile for c in predicted}
    assert sorted(profiles) == sorted(f"predicted-{c.engine.engine}" for c in live)
    records = []
    for cell in predicted:
        name = cell.engine.profile
        assert name in shipped_profiles(), (cell.name, name)
        profile = read_profile(name)
        assert (profile.engine, profile.gpu) == (cell.name.removeprefix("predicted-"),
                                                 scenario.gpu), cell.name
        config = reference_config(cell, scenario.model, scenario.gpu)
        record = prediction_record(config)
        assert record["profile"] == name
        records.append(record)
        label = prediction_text(record, mark=_bold, code=code)
        held = profile.fit["held_out"]
        assert label.startswith(f"**predicted** by the reference engine with profile `{name}`")
        assert f"it missed by a median {fmt_pct(held['median_abs_error'])} " \
               f"(worst {fmt_pct(held['worst_abs_error'])}" in label, label
        assert f"on {held['num_rows']} published figures its fit never saw" in label, label
    # the report's "predicted" row names each cell with its profile
    row = prediction_row([
        CellResult(c.name, Path(c.name), "done", summary={},
                   manifest={"engine": {"mode": "simulated", "prediction": r}})
        for c, r in zip(predicted, records, strict=True)])
    for cell in predicted:
        assert (f"`{cell.name}`: **predicted** by the reference engine with profile "
                f"`{cell.engine.profile}`") in row, row
