"""A probe stopped early reports latencies of the requests that finished only: the requests
its stop cut off (``not_finished``) are left out, so its TTFT and TPOT are a lower bound.
probe.json, search.json and the command line say so, with how many were cut off."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.capacity import ProbeOutcome
from harness.capacity.run import probe_verdict
from harness.cli import main as cli_main
from harness.results import SEARCH_FILE

REPO = Path(__file__).resolve().parents[3]
EXCERPT = REPO / "harness" / "data" / "azure_conv_excerpt.csv"


def _json(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def test_a_stopped_probe_says_its_latencies_are_a_lower_bound(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cap"
    # 64 req/s is stopped early with most of its requests in flight; 32 runs to its end
    assert cli_main(["capacity", "--trace", str(EXCERPT), "--limit", "200", "--slo",
                     "ttft_s=0.5,tpot_s=0.03", "--start", "64", "--max-probes", "2",
                     "--out", str(out)]) == 0
    err = capsys.readouterr().err
    search = _json(out / "reference" / SEARCH_FILE)
    listed = {p["label"]: p for p in search["probes"]}
    stopped = _json(out / "reference" / "rate-64" / "summary.json")
    cut = stopped["failures"]["not_finished"]
    done = stopped["num_completed"]
    assert stopped["stopped_early"] and cut > 0 and stopped["ttft_s"]["count"] == done
    note = (f"ttft_p90_s and tpot_p90_s are of the {done} requests that finished only, not of "
            f"the {cut} the early stop cut off: a lower bound")
    for probe in (_json(out / "reference" / "rate-64" / "probe.json"), listed["rate-64"]):
        assert probe["stopped"] and probe["num_cut_off"] == cut
        assert probe["latency_note"] == note
    assert (f"reference: 64 req/s: SLO attainment 4.2% ({cut} of {stopped['num_requests']} "
            "requests not finished when the probe was stopped early), failed; stopped early: "
            in err)
    assert (f"; its latencies are of the {done} requests that finished only, not of the "
            f"{cut} the early stop cut off: a lower bound\n") in err
    # a probe run to its end cut nothing off: its latencies are of every request it sent
    for probe in (_json(out / "reference" / "rate-32" / "probe.json"), listed["rate-32"]):
        assert not probe["stopped"]
        assert probe["num_cut_off"] == 0 and probe["latency_note"] is None
    assert "reference: 32 req/s: SLO attainment 50.0%, failed: below" in err
    assert err.count("a lower bound") == 1
    # the report's curve table marks the stopped probe's latencies, and its latency section
    # says which cell they are of
    report = (out / "report.md").read_text()
    row = next(line for line in report.splitlines() if line.startswith("| 64 req/s"))
    assert row.count("≥ ") == 3  # TPOT p50, TPOT p90, TTFT p90
    assert not any(line.startswith("| 32 req/s") and "≥" in line
                   for line in report.splitlines())
    assert (f"not of the {cut:,} of `reference/rate-64` it cut off: a lower bound"
            in report)
    assert (f"Stopped early: `reference/rate-64` cut off {cut:,} requests: its percentiles "
            "are of the requests that finished only, a lower bound") in report


def _stopped_probe(folder: Path, load: int, attainment: float, failures: dict[str, int], *,
                   num_requests: int) -> ProbeOutcome:
    """A probe stopped early at ``load`` req/s, its summary.json under ``folder``."""
    label = f"rate-{load}"
    (folder / label).mkdir()
    num_failed = sum(failures.values())
    (folder / label / "summary.json").write_text(json.dumps(
        {"failures": failures, "num_failed": num_failed}))
    return ProbeOutcome(load=load, attainment=attainment, passed=False, num_failed=num_failed,
                        num_requests=num_requests, stopped="over-saturated: ...",
                        run_dir=label)


def test_a_stopped_probe_that_cut_nothing_off_says_nothing_of_its_latencies(
        tmp_path: Path) -> None:
    stopped = _stopped_probe(tmp_path, 8, 0.9, {"rejected": 2}, num_requests=20)
    assert probe_verdict(stopped, 0.99, tmp_path) == (
        "SLO attainment 90.0% (2 of 20 requests failed), failed; stopped early: "
        "over-saturated: ...")


def test_a_stopped_probe_with_nothing_finished_has_no_latencies_to_bound(
        tmp_path: Path) -> None:
    """Every request cut off: there are no latency figures, so none is called a lower bound."""
    stopped = _stopped_probe(tmp_path, 200, 0.0, {"not_finished": 40}, num_requests=40)
    verdict = probe_verdict(stopped, 0.99, tmp_path)
    assert verdict.endswith("its latencies are of no request: none finished before the early "
                            "stop cut off 40 requests")
    assert "lower bound" not in verdict


def test_searches_made_before_reserve_last_token_existed_keep_their_settings_digest() -> None:
    """The reference's settings a search is made from leave out ``reserve_last_token`` where
    it is false, every engine's behaviour before the setting existed: an older search.json
    (no such key) resumes. A TensorRT-LLM profile, which sets it, records it."""
    from harness.capacity.settings import engine_settings
    from harness.target import TargetSpec

    assert "reserve_last_token" not in engine_settings(TargetSpec("reference", "simulate"))
    trt = engine_settings(TargetSpec("reference", "simulate", profile="trtllm-h100-sxm",
                                     gpu="h100-sxm"))
    assert trt["reserve_last_token"] is True
