"""Every simulated cell says it is a prediction, of which model, and how accurate it is."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from adapters.knobs import Knobs
from adapters.reference.config import ReferenceConfig
from adapters.reference.cost_model import (
    profile_accuracy,
    profile_changed_since_measured,
    profile_metadata,
)
from adapters.reference.prediction import catalog_accuracy, prediction_record
from harness.cli import main
from harness.cli.common import prediction_lines
from harness.prediction import KINDS, MEASURED_STATISTICS, SERVED, prediction_text
from harness.published.profiles import read_profile, write_profile
from harness.published.rows import METRIC_KINDS, METRICS
from harness.report.format import fmt_pct
from harness.report.predictions import (
    kind_note,
    margin_caveat,
    prediction_accuracy_lines,
    prediction_row,
    tails_note,
    unmeasured_note,
)
from harness.report.runs import CellResult
from harness.report.sections import prefix_cache_section

EXCERPT = Path(__file__).resolve().parents[2] / "harness" / "data" / "azure_conv_excerpt.csv"
PROFILES = Path(__file__).resolve().parents[2] / "adapters" / "reference" / "profiles"


def _with_profile(*, model: str, profile: str | None,
                  gpu: str | None = None) -> ReferenceConfig:
    """As the command line builds it: the profile's engine defaults, no knob given."""
    return ReferenceConfig.from_knobs(Knobs(given=frozenset()), model=model, gpu=gpu,
                                      profile=profile)


def _label(config: ReferenceConfig) -> str:
    """The whole wording, with the report's markup."""
    return prediction_text(prediction_record(config), mark=lambda t: f"**{t}**",
                           code=lambda t: f"`{t}`")


def _cell(name: str, engine: dict[str, Any]) -> CellResult:
    return CellResult(name, Path(name), "done", summary={}, manifest={"engine": engine})


def _lines(markdown: list[str]) -> list[str]:
    return "\n".join(markdown).splitlines()


def _basis(stats: dict[str, Any]) -> str:
    """How many figures a stored statistic rests on, and from how many sources, and which way
    they erred when at least three in four of them erred the same way."""
    sources = stats["sources"]
    return f"{stats['num_rows']}" + (f" from one source ({sources[0]})" if len(sources) == 1
                                     else f" from {len(sources)} sources") + _bias(stats)


def _bias(stats: dict[str, Any]) -> str:
    n, high = stats["num_rows"], stats["num_over"]
    if n >= 4 and 4 * high >= 3 * n:
        return f" ({high} of {n} predicted high)"
    if n >= 4 and 4 * (n - high) >= 3 * n:
        return f" ({n - high} of {n} predicted low)"
    return ""

def _simulated(name: str, profile: str | None) -> CellResult:
    record = prediction_record(_with_profile(model="llama-3.1-8b", profile=profile))
    return _cell(name, {"mode": "simulated", "prediction": record})


def test_a_profile_cell_names_its_profile_and_its_held_out_error() -> None:
    text = _label(_with_profile(model="llama-3.1-8b", profile="vllm-h200"))
    held = profile_metadata("vllm-h200")["fit"]["held_out"]
    published = profile_metadata("vllm-h200")["fit"]["held_out_workload_published"]
    assert "**predicted**" in text and "`vllm-h200`" in text
    assert f"a median {fmt_pct(held['median_abs_error'])}" in text
    assert f"(worst {fmt_pct(held['worst_abs_error'])}" in text
    # vllm-h200 has held-out ShareGPT rows: the figure without them is shown too
    assert published["num_rows"] < held["num_rows"]
    assert (f"{fmt_pct(published['median_abs_error'])} (worst "
            f"{fmt_pct(published['worst_abs_error'])}) on the {published['num_rows']} whose "
            "workload is fully published") in text


def test_a_profile_says_how_many_figures_its_error_is_measured_on() -> None:
    acc = profile_accuracy("trtllm-h100-sxm")
    assert acc is not None and acc["coefficients_from"] is None
    text = _label(_with_profile(model="llama-3.1-8b", profile="trtllm-h100-sxm"))
    assert f"on {acc['held_out_num_rows']} published figures its fit never saw" in text
    assert "borrowed" not in text


def test_a_profile_without_training_figures_names_whose_coefficients_it_borrows() -> None:
    # TGI has no training rows: its profile runs vLLM's coefficients with TGI's scheduler
    assert profile_metadata("tgi-h100-sxm")["fit"]["coefficients_from"] == "vllm-h100-sxm"
    text = _label(_with_profile(model="llama-3.1-8b", profile="tgi-h100-sxm"))
    assert text.startswith("**predicted** by the reference engine with profile "
                           "`tgi-h100-sxm` (coefficients borrowed from `vllm-h100-sxm`: no "
                           "training figures of its own); on 2 published figures")
    # an old run folder's record, written before the donor was recorded, still reads
    old = {"kind": "profile", "profile": "tgi-h100-sxm",
           "accuracy": {"held_out_median_abs_error": 0.4, "held_out_worst_abs_error": 0.7}}
    assert prediction_text(old) == ("predicted by the reference engine with profile "
                                    "tgi-h100-sxm; on published figures its fit never saw, it "
                                    "missed by a median 40.0% (worst 70.0%, docs/fidelity.md)")


def test_a_profile_whose_held_out_rows_are_all_published_shows_one_figure() -> None:
    acc = profile_accuracy("trtllm-h200")
    assert acc is not None
    assert acc["held_out_published_num_rows"] == acc["held_out_num_rows"]
    assert "whose workload" not in _label(_with_profile(model="llama-3.1-8b",
                                                          profile="trtllm-h200"))


def test_a_profile_with_no_fully_published_held_out_workload_says_none() -> None:
    """tgi-h100-sxm's held-out figures all have a partly unpublished workload: its record
    counts none (the key, with None), and the command line says so as the report does."""
    acc = profile_accuracy("tgi-h100-sxm")
    assert acc is not None and "held_out_published_num_rows" in acc
    assert acc["held_out_published_num_rows"] is None
    text = prediction_text(prediction_record(_with_profile(model="llama-3.1-8b",
                                                             profile="tgi-h100-sxm")))
    assert (f"; on {acc['held_out_num_rows']} published figures its fit never saw, it missed "
            f"by a median {fmt_pct(acc['held_out_median_abs_error'])} (worst "
            f"{fmt_pct(acc['held_out_worst_abs_error'])}; none of them with a fully published "
            "workload, docs/fidelity.md); all of them throughput figures") in text
    row = next(ln for ln in _lines(prediction_accuracy_lines([_simulated("tgi", "tgi-h100-sxm")]))
               if ln.startswith("| `tgi`"))
    assert " | none: every one's workload is partly unpublished | " in row


def test_a_profile_fitted_before_fully_published_workloads_were_counted_says_nothing_of_them(
        tmp_path: Path) -> None:
    """A profile file whose fit has no ``held_out_workload_published`` (fitted before they
    were counted) said "none of them with a fully published workload": it says nothing."""
    raw = json.loads((Path(__file__).resolve().parents[2] / "adapters" / "reference" / "profiles"
                      / "tgi-h100-sxm.json").read_text())
    del raw["metadata"]["fit"]["held_out_workload_published"]
    path = tmp_path / "older.json"
    path.write_text(json.dumps(raw))
    acc = profile_accuracy(str(path))
    assert acc is not None and "held_out_published_num_rows" not in acc
    text = prediction_text(prediction_record(ReferenceConfig(model="llama-3.1-8b",
                                                             profile=str(path))))
    assert "missed by a median" in text and "fully published" not in text


def test_a_record_written_before_fully_published_workloads_were_counted_says_nothing() -> None:
    old = {"kind": "profile", "profile": "tgi-h100-sxm",
           "accuracy": {"held_out_median_abs_error": 0.4, "held_out_worst_abs_error": 0.7,
                        "held_out_num_rows": 2}}
    assert prediction_text(old) == ("predicted by the reference engine with profile "
                                    "tgi-h100-sxm; on 2 published figures its fit never saw, it "
                                    "missed by a median 40.0% (worst 70.0%, docs/fidelity.md)")
    row = next(ln for ln in _lines(prediction_accuracy_lines([
        _cell("old", {"mode": "simulated", "prediction": old})])) if ln.startswith("| `old`"))
    assert " | 40.0% (worst 70.0%) | not recorded in the run | " in row


def test_a_catalog_cell_shows_the_catalog_accuracy() -> None:
    text = _label(ReferenceConfig(model="llama-3.1-8b", gpu="h100-sxm"))
    assert "catalog's datasheet coefficients" in text
    median = catalog_accuracy()["median_abs_error"]
    assert isinstance(median, float)
    assert f"on {catalog_accuracy()['num_rows']} published figures" in text
    assert f"a median {fmt_pct(median)}" in text


def test_an_old_run_without_a_prediction_record_still_says_predicted() -> None:
    old = _cell("old", {"mode": "simulated"})
    assert prediction_row([old]) == ("`old`: **predicted** by the reference engine (accuracy "
                                       "not recorded in this run)")
    # its row in the accuracy table says the accuracy is unknown rather than leaving it out
    row = next(ln for ln in _lines(prediction_accuracy_lines([old])) if ln.startswith("| `old`"))
    assert "| its accuracy not recorded in the run | unknown |" in row


def test_the_report_names_each_predictor_and_tabulates_its_accuracy() -> None:
    cells = [_simulated("cat", None), _simulated("trt", "trtllm-h100-sxm"),
             _simulated("trt2", "trtllm-h100-sxm"), _simulated("vllm", "vllm-h100-sxm"),
             _cell("live", {"mode": "launch", "name": "vllm"})]
    row = prediction_row(cells)
    assert row.split("<br>") == [
        "`cat`: **predicted** by the reference engine with the catalog's datasheet coefficients",
        "`trt`, `trt2`: **predicted** by the reference engine with profile `trtllm-h100-sxm`",
        "`vllm`: **predicted** by the reference engine with profile `vllm-h100-sxm`",
        "Their measured accuracy: [how accurate the predictions are]"
        "(#how-accurate-the-predictions-are)"]
    lines = _lines(prediction_accuracy_lines(cells))
    assert lines[0] == "### How accurate the predictions are"
    rows = {ln.split(" | ")[0]: ln.strip("| ").split(" | ") for ln in lines
            if ln.startswith("| `")}
    assert list(rows) == ["| `cat`", "| `trt`, `trt2`", "| `vllm`"]  # not the live cell
    acc = profile_accuracy("trtllm-h100-sxm")
    assert acc is not None
    by_kind = acc["held_out_by_kind"]
    assert rows["| `trt`, `trt2`"] == [
        "`trt`, `trt2`", "profile `trtllm-h100-sxm`",
        f"{acc['held_out_num_rows']} held-out figures (docs/fidelity.md)",
        f"{fmt_pct(acc['held_out_median_abs_error'])} (worst "
        f"{fmt_pct(acc['held_out_worst_abs_error'])})",
        f"{fmt_pct(acc['held_out_published_median_abs_error'])} (worst "
        f"{fmt_pct(acc['held_out_published_worst_abs_error'])}) of "
        f"{acc['held_out_published_num_rows']}",
        *[f"{fmt_pct(by_kind[k]['median_abs_error'])} (worst "
          f"{fmt_pct(by_kind[k]['worst_abs_error'])}) of {_basis(by_kind[k])}"
          for k in ("throughput", "TTFT", "TPOT/ITL")],
        "no held-out figure"]
    assert rows["| `vllm`"][-3:] == ["no held-out figure"] * 3
    assert rows["| `cat`"][2] == f"{catalog_accuracy()['num_rows']} figures (docs/published.md)"
    assert "no held-out" not in " ".join(rows["| `cat`"])


def test_one_kind_of_prediction_over_every_cell_is_one_row() -> None:
    cells = [_simulated("a", "trtllm-h200"), _simulated("b", "trtllm-h200")]
    assert prediction_row(cells) == (
        "every cell: **predicted** by the reference engine with profile `trtllm-h200` "
        "(measured accuracy: [how accurate the predictions are]"
        "(#how-accurate-the-predictions-are))")
    row = next(ln for ln in _lines(prediction_accuracy_lines(cells))
               if ln.startswith("| every cell"))
    assert " | all of them | " in row  # every held-out trtllm-h200 workload is published


def test_a_cell_without_figures_is_not_named_predicted() -> None:
    """A cell not run whose folder keeps an earlier run's manifest (a sweep cut short, run
    again with --only), and one interrupted before it measured anything, have no figure."""
    done = _simulated("done", "trtllm-h200")
    pending = replace(_simulated("pending", "trtllm-h200"), state="not_run")
    cut = replace(_simulated("cut", "trtllm-h200"), state="interrupted", summary=None)
    row = prediction_row([done, pending, cut])
    assert row.startswith("`done`: **predicted** by the reference engine with profile")
    assert "pending" not in row and "cut" not in row and "every cell" not in row
    assert prediction_row([pending, cut]) == ""
    assert prediction_accuracy_lines([pending, cut]) == []
    table = "\n".join(prediction_accuracy_lines([done, pending, cut]))
    assert "`done`" in table and "pending" not in table and "`cut`" not in table


def test_the_plain_wording_is_the_reports_without_its_markup() -> None:
    record = prediction_record(_with_profile(model="llama-3.1-8b", profile="vllm-h200"))
    plain = prediction_text(record)
    assert plain.startswith("predicted by the reference engine with profile vllm-h200 "
                            "(coefficients borrowed from vllm-h100-sxm: ")
    assert _label(_with_profile(model="llama-3.1-8b", profile="vllm-h200")) == (
        plain.replace("predicted", "**predicted**", 1).replace("vllm-h200", "`vllm-h200`", 1)
        .replace("vllm-h100-sxm", "`vllm-h100-sxm`", 1))
    served = prediction_text(record, by=SERVED)
    assert served.startswith("predicted by the reference engine served over HTTP")
    assert served.endswith(plain.split(" with profile ", 1)[1])


def test_a_profile_never_measured_says_so() -> None:
    record = {"kind": "profile", "profile": "mine.json", "accuracy": None}
    assert prediction_text(record) == ("predicted by the reference engine with profile "
                                       "mine.json; its accuracy was not measured against "
                                       "published figures")


def test_a_live_cell_of_a_real_engine_is_not_a_prediction() -> None:
    real = _cell("real", {"mode": "launch", "name": "vllm",
                          "version_probe": {"body": {"version": "0.19.0"}}})
    assert prediction_row([real]) == "" and prediction_accuracy_lines([real]) == []
    served = _cell("served", {"mode": "launch", "name": "reference", "version_probe": {
        "body": {"prediction": prediction_record(ReferenceConfig(model="llama-3.1-8b"))}}})
    assert prediction_row([served]).startswith(
        "`served`: **predicted** by the reference engine served over HTTP")
    row = next(ln for ln in _lines(prediction_accuracy_lines([served]))
               if ln.startswith("| `served`"))
    assert "| catalog coefficients, served over HTTP |" in row


def test_the_command_line_says_its_figures_are_predicted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _with_profile(model="llama-3.1-8b", gpu="h100-sxm", profile="vllm-h100-sxm")
    expected = prediction_lines("figures above: " + prediction_text(prediction_record(config)))
    assert expected[0] == ("figures above: predicted by the reference engine with profile "
                           "vllm-h100-sxm")
    assert main(["costmodel", "--profile", "vllm-h100-sxm"]) == 0
    assert capsys.readouterr().out.splitlines()[-len(expected):] == expected
    assert main(["simulate", "--trace", str(EXCERPT), "--limit", "5", "--profile",
                 "vllm-h100-sxm", "--out", str(tmp_path / "run"), "--no-report"]) == 0
    lines = capsys.readouterr().out.splitlines()
    caveat = (f"  that accuracy was measured on {MEASURED_STATISTICS}: no predicted p99, "
              "preemption count or SLO attainment was ever compared with a published figure")
    start = lines.index(expected[0])
    assert lines[start:start + len(expected) + 1] == [*expected, caveat]
    # summarize printed a simulated run's figures again with no word of prediction
    assert main(["summarize", str(tmp_path / "run"), "--slo", "ttft_s=0.05"]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = lines.index(expected[0])
    assert lines[start:start + len(expected) + 1] == [*expected, caveat]


def test_a_profile_states_its_error_for_each_kind_of_figure() -> None:
    by_kind = profile_metadata("trtllm-h100-sxm")["fit"]["held_out_by_kind"]
    assert list(by_kind) == ["throughput", "TTFT", "TPOT/ITL"]  # KINDS order
    text = _label(_with_profile(model="llama-3.1-8b", profile="trtllm-h100-sxm"))
    parts = [f"{kind} {fmt_pct(s['median_abs_error'])} (worst {fmt_pct(s['worst_abs_error'])})"
             f" of {_basis(s)}" for kind, s in by_kind.items()]
    # its held-out TTFT and TPOT/ITL figures are all of the 70B model with FP8 weights and
    # KV cache (NIM's): of an 8B run in BF16, said
    assert text.endswith("; by kind of figure: " + ", ".join(parts) + "; no held-out E2E figure"
                         "; but none of the published TTFT or TPOT/ITL figures its accuracy "
                         "was measured on is of this model llama-3.1-8b nor has bf16 weights "
                         "nor a bf16 KV cache: their errors here were never measured")


def test_a_profile_held_out_on_one_kind_says_which_kinds_are_unmeasured() -> None:
    assert list(profile_metadata("vllm-h100-sxm")["fit"]["held_out_by_kind"]) == ["throughput"]
    text = _label(_with_profile(model="llama-3.1-8b", profile="vllm-h100-sxm"))
    # every one of its held-out figures predicted a higher throughput than published
    held = profile_metadata("vllm-h100-sxm")["fit"]["held_out_by_kind"]["throughput"]
    assert held["num_over"] == held["num_rows"] == 8
    assert text.endswith("; all of them throughput figures (8 of 8 predicted high): no "
                         "held-out TTFT, TPOT/ITL or E2E figure")


def test_the_catalog_states_its_error_for_each_kind_of_figure() -> None:
    by_kind = catalog_accuracy()["by_kind"]
    assert list(by_kind) == list(KINDS)
    assert sum(s["num_rows"] for s in by_kind.values()) == catalog_accuracy()["num_rows"]
    text = _label(ReferenceConfig(model="llama-3.1-8b", gpu="h100-sxm"))
    ttft = by_kind["TTFT"]
    assert (f"TTFT {fmt_pct(ttft['median_abs_error'])} (worst "
            f"{fmt_pct(ttft['worst_abs_error'])}) of {ttft['num_rows']}") in text
    assert "no held-out" not in text  # the catalog was fitted on nothing


def test_every_published_metric_is_of_one_kind() -> None:
    assert set(METRIC_KINDS) == set(METRICS)
    assert set(METRIC_KINDS.values()) == set(KINDS)


def test_each_latency_and_throughput_table_says_how_far_its_kind_was_measured_to_miss() -> None:
    cells = [_simulated("cat", None), _simulated("trt", "trtllm-h100-sxm"),
             _simulated("vllm", "vllm-h100-sxm"), _simulated("tgi", "tgi-h100-sxm")]
    ttft = profile_accuracy("trtllm-h100-sxm")["held_out_by_kind"]["TTFT"]  # type: ignore[index]
    cat = catalog_accuracy()["by_kind"]["TTFT"]
    [note, blank] = kind_note(cells, "TTFT", "TTFT")
    assert blank == ""
    assert _bias(cat) and _bias(ttft)  # which way they erred: said, as the accuracy table does
    assert note == (
        "How far predicted TTFT was measured to miss published TTFT figures: "
        f"`cat` a median {fmt_pct(cat['median_abs_error'])} off (worst "
        f"{fmt_pct(cat['worst_abs_error'])}) over {cat['num_rows']} figures from "
        f"{len(cat['sources'])} sources{_bias(cat)}; "
        f"`trt` a median {fmt_pct(ttft['median_abs_error'])} off (worst "
        f"{fmt_pct(ttft['worst_abs_error'])}) over {ttft['num_rows']} held-out figures from "
        f"one source ({ttft['sources'][0]}){_bias(ttft)}; "
        "no held-out TTFT figure for `vllm`, `tgi`; "
        "but for `trt`, none of the published TTFT figures its accuracy was measured on is "
        "of this model llama-3.1-8b (they are of llama-3.1-70b) nor has bf16 weights (they "
        "are fp8) nor a bf16 KV cache (theirs are fp8): its error here was never measured "
        "([how accurate the predictions are](#how-accurate-the-predictions-are)).")
    # measured cells add nothing; a run that recorded no accuracy says it is unknown
    assert kind_note([_cell("live", {"mode": "launch", "name": "vllm"})], "TTFT", "TTFT") == []
    assert kind_note([_cell("old", {"mode": "simulated"})], "TTFT", "TTFT")[0] == (
        "How far predicted TTFT was measured to miss published TTFT figures: its accuracy not "
        "recorded in the run for `old` "
        "([how accurate the predictions are](#how-accurate-the-predictions-are)).")


def test_no_published_figure_is_a_tail_percentile_and_latency_notes_say_so() -> None:
    """The accuracy of a p90 or p99 was never measured: every published metric is a mean, a
    median or a rate, and the note under a percentile table says the tails are unmeasured."""
    assert all(m.endswith(("_mean_s", "_p50_s")) or m in ("output_tok_s", "req_s", "duration_s")
               for m in METRIC_KINDS)
    assert MEASURED_STATISTICS == "means, medians and whole-run rates"
    [note, _] = tails_note([_simulated("trt", "trtllm-h100-sxm")])
    assert note.startswith("The published figures predictions were measured against are means, "
                           "medians and whole-run rates: no predicted p90 or p99 below was ever "
                           "compared with a published figure")
    assert tails_note([_cell("live", {"mode": "launch", "name": "vllm"})]) == []


def test_a_profile_never_measured_keeps_every_predicted_label(tmp_path: Path) -> None:
    """A calibrated profile (no held-out figures) is as much a prediction as a shipped one:
    the banners and every table's note say so, with its accuracy unknown."""
    mine = tmp_path / "mine.json"
    raw = json.loads((PROFILES / "vllm-h100-sxm.json").read_text())
    del raw["metadata"]["fit"]
    mine.write_text(json.dumps(raw))
    out = tmp_path / "run"
    assert main(["simulate", "--trace", str(EXCERPT), "--limit", "20", "--profile", str(mine),
                 "--policy", "priority", "--priority-fraction", "0.3",
                 "--slo", "ttft_s=0.5,tpot_s=0.05", "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    findings = text.split("## Key findings", 1)[1].split("\n## ", 1)[0]
    assert "Every figure here is **predicted** by the reference engine" in findings
    for table in ("### TTFT", "### TPOT", "## Throughput"):
        section = text.split(f"\n{table}\n", 1)[1].split("\n#", 1)[0]
        assert "never measured against published figures for `run`" in section, table
    for table in ("## Goodput and SLO attainment", "## Preemptions", "## Per priority class"):
        section = text.split(f"\n{table}\n", 1)[1].split("\n## ", 1)[0]
        assert "of every cell are predicted" in section or "of `run` are predicted" in section, \
            table
    row = next(ln for ln in text.splitlines() if ln.startswith("| `run` | profile"))
    assert "| never measured against published figures | unknown |" in row


def test_a_report_puts_the_note_under_its_tables(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main(["simulate", "--trace", str(EXCERPT), "--limit", "20", "--profile",
                 "vllm-h100-sxm", "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    for table, kind in (("### TTFT", "TTFT"), ("### TPOT", "TPOT/ITL"), ("## Throughput",
                                                                          "throughput")):
        section = text.split(f"\n{table}\n", 1)[1].split("\n#", 1)[0]
        assert f"to miss published {kind} figures: " in section, table
    assert "no held-out TTFT figure for `run`" in text


def test_a_profile_edited_since_its_accuracy_was_measured_quotes_none(tmp_path: Path) -> None:
    """A copy of a shipped profile with other coefficients predicts other numbers: the shipped
    profile's held-out error is not its error."""
    for name in ("trtllm-h100-sxm", "vllm-h100-sxm", "tgi-h100-sxm"):
        assert not profile_changed_since_measured(name)
        assert profile_accuracy(name) is not None
    raw = json.loads((PROFILES / "trtllm-h100-sxm.json").read_text())
    same = tmp_path / "same.json"
    same.write_text(json.dumps({**raw, "source": "my copy"}))  # descriptions are not predictions
    assert profile_accuracy(same) == profile_accuracy("trtllm-h100-sxm")
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps({**raw, "memory_efficiency": raw["memory_efficiency"] / 2}))
    assert profile_changed_since_measured(edited) and profile_accuracy(edited) is None
    text = prediction_text(prediction_record(ReferenceConfig(model="llama-3.1-8b",
                                                             profile=str(edited))))
    assert text.endswith("; its accuracy is not known: its coefficients or engine defaults "
                         "differ from those its accuracy was measured with")
    defaults = tmp_path / "defaults.json"
    defaults.write_text(json.dumps({**raw, "metadata": {
        **raw["metadata"], "scheduler": {**raw["metadata"]["scheduler"], "max_num_seqs": 8}}}))
    assert profile_accuracy(defaults) is None


def test_a_report_says_why_an_edited_profile_quotes_no_accuracy(tmp_path: Path) -> None:
    """Wherever the report says a cell has no accuracy, an edited profile's reads as its
    *Predicted* row does, not "never measured"."""
    raw = json.loads((PROFILES / "vllm-h100-sxm.json").read_text())
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps({**raw, "memory_efficiency": raw["memory_efficiency"] / 2}))
    cells = [_simulated("cat", None), _simulated("mine", str(edited))]
    why = "its coefficients or engine defaults differ from those its accuracy was measured with"
    assert prediction_row(cells).split("<br>")[1] == (
        f"`mine`: **predicted** by the reference engine with profile `{edited}`; its accuracy "
        f"is not known: {why}")
    row = next(ln for ln in _lines(prediction_accuracy_lines(cells)) if ln.startswith("| `mine`"))
    assert row == (f"| `mine` | profile `{edited}` | its accuracy is not known: {why} | "
                   "unknown | – | – | – | – | – |")
    [note, _] = kind_note(cells, "TTFT", "TTFT")
    assert note.endswith(f"; its accuracy is not known for `mine`: {why} ([how accurate the "
                         "predictions are](#how-accurate-the-predictions-are)).")
    assert margin_caveat(cells[1], 0.010, 0.020, "TPOT/ITL") == (
        f"; predicted, 50.0% within the limit, with an error not known: {why}")


def test_a_profile_written_after_its_check_records_what_was_measured(tmp_path: Path) -> None:
    written = write_profile(read_profile("trtllm-h100-sxm"), directory=tmp_path)
    assert not profile_changed_since_measured(written)
    assert profile_accuracy(written) == profile_accuracy("trtllm-h100-sxm")


def test_a_finding_within_a_limit_by_less_than_the_error_says_it_may_not_hold() -> None:
    cat = _simulated("cat", None)
    tpot = catalog_accuracy()["by_kind"]["TPOT/ITL"]
    median, rows, over = tpot["median_abs_error"], tpot["num_rows"], tpot["num_over"]
    assert 2 * (rows - over) > rows  # the catalog's TPOT predictions came out low: biased
    tight = 0.020 * (1 - median / 2)  # within 20 ms by half the median error
    # a figure predicted low that is within the limit by less than the error is more likely
    # than not over it on hardware: said so, not "may not hold"
    assert margin_caveat(cat, tight, 0.020, "TPOT/ITL") == (
        f"; predicted, and only {fmt_pct(median / 2)} within the limit, less than the median "
        f"error of {fmt_pct(median)} measured for predicted TPOT/ITL figures, which came out "
        f"low in {rows - over} of {rows}: it is more likely than not to exceed the limit on "
        "hardware")
    assert margin_caveat(cat, 0.020 * (1 - 2 * median), 0.020, "TPOT/ITL") == ""
    live = _cell("live", {"mode": "launch", "name": "vllm"})
    assert margin_caveat(live, tight, 0.020, "TPOT/ITL") == ""
    # a profile with no held-out TPOT figure: its error there is not known
    assert margin_caveat(_simulated("v", "vllm-h100-sxm"), 0.010, 0.020, "TPOT/ITL") == (
        "; predicted, 50.0% within the limit, with an error never measured for predicted "
        "TPOT/ITL")
    # a run that recorded no prediction record: its error is not recorded, not unmeasured
    assert margin_caveat(_cell("old", {"mode": "simulated"}), 0.010, 0.020, "TPOT/ITL") == (
        "; predicted, 50.0% within the limit, with an error not recorded in the run")


_UNMEASURED = ("are predicted, and no published real-hardware figure of their kind was ever "
               "compared with them: their error is not known ([how accurate the predictions "
               "are](#how-accurate-the-predictions-are)).")


def test_a_note_under_a_table_of_some_cells_says_every_cell_only_of_the_whole_report() -> None:
    sim, sim2 = _simulated("sim", None), _simulated("sim2", None)
    live = _cell("live", {"mode": "launch", "name": "vllm"})
    # the prefix-cache table shows the simulated cells only: a live cell has no such figures
    assert unmeasured_note([sim], "Prefix-cache hits", report_cells=[live, sim]) == [
        f"Prefix-cache hits of `sim` {_UNMEASURED}", ""]
    assert unmeasured_note([sim, sim2], "Prefix-cache hits", report_cells=[sim, live, sim2]) == [
        f"Prefix-cache hits of `sim`, `sim2` {_UNMEASURED}", ""]
    assert unmeasured_note([sim, sim2], "Prefix-cache hits", report_cells=[sim, sim2]) == [
        f"Prefix-cache hits of every cell {_UNMEASURED}", ""]
    assert unmeasured_note([live, sim], "Preemption counts") == [
        f"Preemption counts of `sim` {_UNMEASURED}", ""]


def test_the_prefix_cache_note_of_a_report_with_a_measured_cell_names_the_predicted_ones() -> None:
    cache = {"queries_tokens": 100, "hits_tokens": 50, "hit_rate": 0.5,
             "preempted_hit_rate": None, "num_requests_with_prefix_ids": 3}
    sim = CellResult("sim", Path("sim"), "done", summary={"prefix_cache": cache}, manifest={
        "engine": {"mode": "simulated", "prediction": prediction_record(
            ReferenceConfig(model="llama-3.1-8b"))}})
    live = _cell("live", {"mode": "launch", "name": "vllm"})
    assert prefix_cache_section([live, sim])[-2] == f"Prefix-cache hits of `sim` {_UNMEASURED}"


def test_a_profiles_descriptions_are_not_what_its_accuracy_depends_on(tmp_path: Path) -> None:
    raw = json.loads((PROFILES / "vllm-h100-sxm.json").read_text())
    scheduler = raw["metadata"]["scheduler"]
    described = tmp_path / "described.json"
    described.write_text(json.dumps({**raw, "metadata": {**raw["metadata"], "scheduler": {
        **scheduler, "sources": {"note": "read from somewhere else"}}}}))
    assert profile_accuracy(described) == profile_accuracy("vllm-h100-sxm")
    unrecorded = tmp_path / "unrecorded.json"
    fit = {k: v for k, v in raw["metadata"]["fit"].items() if k != "measured_digest"}
    unrecorded.write_text(json.dumps({**raw, "metadata": {**raw["metadata"], "fit": fit}}))
    assert profile_accuracy(unrecorded) is None
    text = prediction_text(prediction_record(ReferenceConfig(model="llama-3.1-8b",
                                                             profile=str(unrecorded))))
    assert text.endswith("its fit record does not say which coefficients its accuracy was "
                         "measured with")


def test_a_run_that_overrides_its_profiles_defaults_says_which(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A flag that changes a profile's engine default kept the whole accuracy quote with no
    word of it, while the same change made in the profile's file voided the quote."""
    assert main(["simulate", "--trace", str(EXCERPT), "--limit", "5", "--profile",
                 "vllm-h100-sxm", "--max-num-seqs", "32", "--no-prefix-caching",
                 "--out", str(tmp_path / "run"), "--no-report"]) == 0
    said = ("it ran with max_num_seqs 32 where its profile's default is 1024, prefix_caching "
            "off where its profile's default is on (that accuracy was measured with the "
            "profile's defaults, save where a published figure's own run set another)")
    assert said in capsys.readouterr().out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["prediction"]["record"]["settings_not_defaults"] == {
        "max_num_seqs": {"value": 32, "default": 1024},
        "prefix_caching": {"value": False, "default": True}}
    assert main(["simulate", "--trace", str(EXCERPT), "--limit", "5", "--profile",
                 "vllm-h100-sxm", "--out", str(tmp_path / "defaults"), "--no-report"]) == 0
    assert "it ran with" not in capsys.readouterr().out
