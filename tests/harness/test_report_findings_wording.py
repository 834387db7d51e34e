"""Key findings say what their figures are: two figures set side by side agree with the change
stated beside them; predicted cells compared or ranked say when different predictors made
them; cells that share a profile's coefficients say so; and the pace check's completion rates
say which window they are over, not the Throughput table's whole run."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.metrics import Pace
from harness.report.findings import (
    _behind_finding,
    _comparison,
    _latency_phrase,
    _leaders_by_load,
    _same_results_finding,
    _throughput_phrase,
    _within,
)
from harness.report.runs import CellResult

PREDICTORS_ERRORS = "the difference includes the two predictors' own errors"


def _summary(tok_s: float, ttft_s: float = 0.5, tpot_s: float = 0.015,
             attainment: float | None = None) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "num_requests": 300, "num_completed": 300, "num_preemptions": 0,
        "throughput": {"output_tokens_per_s": tok_s},
        "ttft_s": {"p50": ttft_s / 2, "p90": ttft_s}, "tpot_s": {"p50": tpot_s / 2,
                                                                 "p90": tpot_s},
        "e2e_s": {"p90": 4.0}}
    if attainment is not None:
        summary["goodput"] = {"slo_attainment": attainment}
        summary["slo"] = {"ttft_s": 1.0}
    return summary


def _simulated(profile: str | None, donor: str | None = None) -> dict[str, Any]:
    """A simulated run's manifest, predicted with ``profile`` (None: the catalog's
    coefficients), which borrows ``donor``'s coefficients when given."""
    record: dict[str, Any] = {"kind": "profile" if profile else "catalog", "profile": profile,
                              "accuracy": {"coefficients_from": donor} if donor else None}
    return {"engine": {"mode": "simulated", "prediction": record}}


def _cell(name: str, summary: Mapping[str, Any],
          manifest: Mapping[str, Any] | None = None) -> CellResult:
    return CellResult(name=name, run_dir=Path(name), state="done", summary=summary,
                      manifest=manifest or {})


def _figures(text: str) -> list[float]:
    """The numbers of "2,515 vs 2,516.4": thousands separators dropped."""
    return [float(x.replace(",", "")) for x in text.split(" vs ")]


# ---------------------------------------------------------------- defect 1: rounded pairs


def test_nearly_equal_throughputs_are_written_to_the_change_stated_beside_them() -> None:
    """2,514.98 against 2,516.39 tok/s is -0.1%; written "2,510 vs 2,520" they read -0.4%."""
    phrase, _ = _throughput_phrase(_cell("priority", _summary(2514.98)),
                                   _cell("fcfs", _summary(2516.39)))
    assert "(2,515.0 vs 2,516.4 tok/s, -0.1%, within 5%)" in phrase


def test_a_whole_percentage_fewer_is_what_the_written_throughputs_give() -> None:
    """2,449 against 2,620.1 tok/s is 6.5% fewer, said "7%"; "2,450 vs 2,620" gives 6.49%,
    which rounds to 6%."""
    phrase, _ = _throughput_phrase(_cell("trtllm", _summary(2449.4)),
                                   _cell("reference", _summary(2620.1)))
    assert phrase.startswith("served 7% fewer output tokens/s than `reference`")
    done, base = _figures(phrase.split("(")[1].split(" tok/s")[0])
    assert f"{(1 - done / base) * 100:.0f}%" == "7%"


def test_throughputs_far_apart_keep_three_significant_digits() -> None:
    phrase, _ = _throughput_phrase(_cell("big", _summary(280.0)), _cell("b", _summary(100.0)))
    assert phrase == "served 2.8× the output tokens/s of `b` (280 vs 100 tok/s)"


def test_latencies_about_the_same_are_written_to_their_stated_change() -> None:
    """11.07 ms against 11.2 ms is -1.2%; "11.1 ms vs 11.2 ms" reads -0.9%."""
    phrase, _ = _latency_phrase("TPOT p90", 0.01107, 0.0112)
    assert phrase == "TPOT p90 about the same (11.07 ms vs 11.20 ms, -1.2%, within 5%)"


def test_the_written_pair_gives_the_stated_change_over_many_pairs() -> None:
    """Whatever two throughputs within 5% of each other, the change stated beside them is the
    one their figures as written give, and two that differ read differently."""
    values = [97.3, 99.99, 100.0, 100.04, 100.6, 101.5, 528.04, 528.4, 2514.98, 2516.39,
              10_004.0, 10_051.0]
    for cv, bv in itertools.permutations(values, 2):
        if abs(cv / bv - 1) >= 0.05:
            continue
        phrase, _ = _throughput_phrase(_cell("c", _summary(cv)), _cell("b", _summary(bv)))
        written = phrase.split("(")[1].split(" tok/s")[0]
        shown_c, shown_b = _figures(written)
        assert shown_c != shown_b, phrase
        assert _within(shown_c / shown_b) == _within(cv / bv), phrase


def test_about_the_same_in_every_cell_reads_as_two_figures() -> None:
    """Three cells within 5% of each other: "(528 tok/s to 528 tok/s)" said nothing."""
    cells = [_cell(f"c{n}", _summary(v, ttft_s=0.1 * (n + 1)))
             for n, v in enumerate((528.04, 528.2, 528.4))]
    (text,) = _leaders_by_load(cells)
    assert "about the same output throughput in every cell (528.0 tok/s to 528.4 tok/s)" in text


def test_fmt_pair_adds_digits_only_as_the_change_needs_them() -> None:
    from harness.report.format import fmt_pair, fmt_seconds

    def change(r: float) -> str:
        return f"{(r - 1) * 100:+.1f}%"

    assert fmt_pair(2514.98, 2516.39, change=change) == ("2,515.0", "2,516.4")
    assert fmt_pair(280.0, 100.0, change=change) == ("280", "100")
    # no change stated: told apart, both to as many decimals (a dropped trailing zero read as
    # a coarser figure: "2,003.6 vs 2,003.58")
    assert fmt_pair(528.04, 528.4) == ("528.0", "528.4")
    assert fmt_pair(2003.6, 2003.58) == ("2,003.60", "2,003.58")
    assert fmt_pair(5.0, 5.0) == ("5", "5")
    assert fmt_pair(0.01107, 0.0112, fmt_seconds, change) == ("11.07 ms", "11.20 ms")
    # at 3 digits, as any figure: no zero added; nor between two units
    assert fmt_pair(0.00943, 0.0107, fmt_seconds) == ("9.43 ms", "10.7 ms")
    assert fmt_pair(1.2, 0.9, fmt_seconds) == ("1.2 s", "900 ms")
    # at most six significant digits, however close
    assert fmt_pair(1.0, 1.0000001) == ("1", "1")


# ---------------------------------------------------------------- defect 2: predictors


def test_predicted_cells_of_different_predictors_say_their_errors_are_in_the_difference() -> None:
    trtllm = _cell("predicted-trtllm", _summary(2449.0, ttft_s=1.66, tpot_s=0.0165),
                   _simulated("trtllm-h100-sxm"))
    reference = _cell("reference", _summary(2620.0, ttft_s=0.683, tpot_s=0.0143),
                      _simulated(None))
    _, text = _comparison(trtllm, reference)
    assert ("(`predicted-trtllm` is predicted with profile `trtllm-h100-sxm`'s coefficients, "
            "`reference` with the catalog's coefficients: the difference includes the two "
            "predictors' own errors)") in text
    # a profile that borrows another's coefficients says whose
    tgi = _cell("predicted-tgi", _summary(2569.0, ttft_s=1.05, tpot_s=0.0152),
                _simulated("tgi-h100-sxm", donor="vllm-h100-sxm"))
    _, text = _comparison(tgi, trtllm)
    assert ("`predicted-tgi` is predicted with profile `tgi-h100-sxm` and the coefficients it "
            "borrows from `vllm-h100-sxm`") in text
    assert PREDICTORS_ERRORS in text


def test_cells_of_one_predictor_need_no_caveat() -> None:
    fcfs = _cell("fcfs", _summary(2000.0, ttft_s=2.0), _simulated(None))
    priority = _cell("priority", _summary(2600.0, ttft_s=1.0), _simulated(None))
    _, text = _comparison(priority, fcfs)
    assert "predict" not in text and "coefficients" not in text
    # nor two measurements
    _, text = _comparison(_cell("a", _summary(2600.0, ttft_s=1.0)),
                          _cell("b", _summary(2000.0, ttft_s=2.0)))
    assert "predict" not in text and "coefficients" not in text


def test_a_ranking_of_cells_from_different_predictors_says_so() -> None:
    cells = [_cell("reference", _summary(2620.0, 0.683, 0.0143, 0.98), _simulated(None)),
             _cell("predicted-vllm", _summary(2569.0, 1.05, 0.0152, 0.876),
                   _simulated("vllm-h100-sxm")),
             _cell("predicted-tgi", _summary(2569.0, 1.05, 0.0152, 0.876),
                   _simulated("tgi-h100-sxm", donor="vllm-h100-sxm")),
             _cell("predicted-trtllm", _summary(2449.0, 1.66, 0.0165, 0.546),
                   _simulated("trtllm-h100-sxm"))]
    (text,) = _leaders_by_load(cells)
    assert "best SLO attainment `reference`" in text
    assert text.endswith(
        " Their figures are predicted with different coefficients (`reference` the catalog's; "
        "`predicted-vllm` and `predicted-tgi` profile `vllm-h100-sxm`'s, which profile "
        "`tgi-h100-sxm` borrows; `predicted-trtllm` profile `trtllm-h100-sxm`'s): the "
        "differences between them include the predictors' own errors.")
    # one predictor: the ranking is the settings'
    same = [_cell(c.name, c.summary or {}, _simulated(None)) for c in cells]
    (text,) = _leaders_by_load(same)
    assert "coefficients" not in text and "own errors" not in text


# ---------------------------------------------------------------- defect 3: shared coefficients


def test_cells_with_the_same_results_say_when_they_share_coefficients() -> None:
    summary = _summary(2569.0, 1.05, 0.0152)
    vllm = _cell("predicted-vllm", summary, _simulated("vllm-h100-sxm"))
    tgi = _cell("predicted-tgi", summary, _simulated("tgi-h100-sxm", donor="vllm-h100-sxm"))
    assert _same_results_finding([vllm, tgi]) == [
        "`predicted-vllm` and `predicted-tgi` gave the same results (completions, throughput, "
        "TTFT, TPOT, E2E and preemptions): their latencies come from the same coefficients, "
        "profile `vllm-h100-sxm`'s (profile `tgi-h100-sxm` borrows them), so only their "
        "scheduler settings differ, and on this trace those made no difference."]
    # two cells of one profile differ in their settings only, as the finding always said
    a = _cell("a", summary, _simulated(None))
    b = _cell("b", summary, _simulated(None))
    assert _same_results_finding([a, b]) == [
        "`a` and `b` gave the same results (completions, throughput, TTFT, TPOT, E2E and "
        "preemptions): on this trace, the settings in which they differ made no difference."]


def test_a_cell_with_anothers_results_is_not_compared_with_the_baseline_again() -> None:
    """engines-h100: `predicted-tgi`'s comparison with `reference` repeated `predicted-vllm`'s
    word for word. It is left out, and the same-results finding says the first one holds."""
    from harness.report.context import ReportContext
    from harness.report.findings import key_findings

    summary = _summary(2569.0, 1.05, 0.0152)
    reference = _cell("reference", _summary(2620.0, 0.683, 0.0143), _simulated(None))
    vllm = _cell("predicted-vllm", summary, _simulated("vllm-h100-sxm"))
    tgi = _cell("predicted-tgi", summary, _simulated("tgi-h100-sxm", donor="vllm-h100-sxm"))
    lines = key_findings([reference, vllm, tgi], reference, ReportContext(title="t"), {})
    assert [line for line in lines if line.startswith("`predicted-vllm` served")]
    assert not [line for line in lines if line.startswith("`predicted-tgi` served")]
    [same] = [line for line in lines if "gave the same results" in line]
    assert same.startswith(
        "`predicted-vllm` and `predicted-tgi` gave the same results (completions, throughput, "
        "TTFT, TPOT, E2E and preemptions), so the comparison of `predicted-vllm` with "
        "`reference` above holds for `predicted-tgi` too: their latencies come from the same")
    # the first of them the baseline: nothing to compare, nothing said to hold
    lines = key_findings([vllm, tgi, reference], vllm, ReportContext(title="t"), {})
    assert not [line for line in lines if line.startswith("`predicted-tgi` served")]
    [same] = [line for line in lines if "gave the same results" in line]
    assert "above holds" not in same


def test_a_comparison_of_two_profiles_on_shared_coefficients_says_only_settings_differ() -> None:
    """`predicted-tgi` borrows `predicted-vllm`'s coefficients: what tells them apart is their
    settings, not the engines' own step costs. Cells with the same results say it once, in
    the same-results finding, not in a comparison that finds nothing."""
    vllm = _cell("predicted-vllm", _summary(2569.0, 1.05, 0.0152), _simulated("vllm-h100-sxm"))
    tgi = _cell("predicted-tgi", _summary(2400.0, 1.6, 0.0152),
                _simulated("tgi-h100-sxm", donor="vllm-h100-sxm"))
    _, text = _comparison(tgi, vllm)
    assert text.endswith(
        " (`predicted-tgi` and `predicted-vllm` are predicted with the same coefficients, "
        "profile `vllm-h100-sxm`'s, which profile `tgi-h100-sxm` borrows: the difference is "
        "that of their settings alone, not of the engines' own step costs).")
    same = _cell("predicted-tgi", vllm.summary or {},
                 _simulated("tgi-h100-sxm", donor="vllm-h100-sxm"))
    _, text = _comparison(same, vllm)
    assert "coefficients" not in text


# ---------------------------------------------------------------- defect 4: the pace window


def _paced(name: str, pace: Pace) -> CellResult:
    cell = _cell(name, {})
    cell.__dict__["pace"] = pace  # what CellResult.pace would have read from its folder
    return cell


WHOLE_RUN = ("not the Throughput table's whole-run requests/s; a request is due when it would "
             "have finished had it not queued (its arrival, plus the quickest wait any request "
             "had for a first token, plus its own decode time: docs/metrics.md).")


def test_completion_rates_of_cells_behind_say_their_window() -> None:
    """The batch-size sweep said "`-64` 21.1, `-256` 7.52 req/s" beside a Throughput table of
    15.7 and 20 req/s, without saying that its rates count only what finished from the
    arrivals' midpoint to the last arrival."""
    cells = [_paced(name, Pace(87.3, done, False, "fell behind: ...", fell_behind=True,
                               settled=False, queue_growth_s=grew, span_s=4.6))
             for name, done, grew in (("c64", 21.1, 13.4), ("c256", 7.52, 4.5))]
    (text,) = _behind_finding(cells)
    assert ("These completion rates count the requests finished from the arrivals' "
            "midpoint to the last arrival (2.3 s), " + WHOLE_RUN) in text
    # the verdict first, then the evidence, then what the evidence's rates are
    assert text.index("their TTFT") < text.index("`c256` 7.52") \
        < text.index("These completion rates")


def test_the_completion_rate_of_one_cell_behind_says_its_window() -> None:
    behind = Pace(12.5, 11.2, False, "fell behind: ...", fell_behind=True, settled=True)
    (text,) = _behind_finding([_paced("fcfs", behind)])
    assert ("it completed 11.2 req/s while 12.5 req/s were due, its queue growing for the whole "
            "run. That completion rate counts the requests finished from the arrivals' midpoint "
            "to the last arrival, " + WHOLE_RUN) in text


def test_a_cell_short_within_chance_writes_rates_that_give_its_shortfall() -> None:
    """11.24 of 12.4 req/s is 9.4% short; "11.2 while 12.4" reads 9.7%."""
    behind = Pace(12.45, 11.24, False, "fell behind: ...", fell_behind=True, settled=True)
    near = Pace(12.40, 11.24, True, settled=True)
    (text,) = _behind_finding([_paced("fcfs", near), _paced("priority", behind)])
    assert "`fcfs` (completed 11.24 req/s while 12.40 req/s were due, 9.4% short)" in text
