"""A trace's record (``Trace.options``, ``Trace.timing``, the manifest's ``trace``) loads the
same requests again: an infinite rate or burstiness is kept as "inf" (JSON has no infinity,
and the writers' null read as unset), ``lengths_from`` as an absolute path, and the seed only
where something was drawn with it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from harness.capacity.probe import trace_file_at
from harness.cli import main
from harness.manifest import trace_manifest
from harness.report.format import load_text
from harness.results import dumps_json
from harness.traces import DATA_DIR, Trace, TraceOptions, arrivals_text, load_trace

REPO = Path(__file__).resolve().parents[2]
AZURE_CONV = DATA_DIR / "azure_conv_excerpt.csv"
SHAREGPT = DATA_DIR / "sharegpt_lengths_excerpt.csv"
FIXED: dict[str, Any] = {"num_requests": 20, "prompt_tokens": 100, "output_tokens": 10}


def reloaded(trace: Trace) -> tuple[dict[str, Any], Trace]:
    """The manifest's record of ``trace``, written as every JSON file is, and the trace that
    ``load_trace`` gives from it."""
    record = json.loads(dumps_json(trace_manifest(trace)))
    path = record["path"] or record["source"]
    return record, load_trace(path, TraceOptions(**record["options"]))


# ---------------------------------------------------------------- inf


@pytest.mark.parametrize(("path", "options"), [
    ("synthetic", FIXED),
    (str(AZURE_CONV), {"limit": 20}),
    (str(SHAREGPT), {"limit": 20}),  # lengths only: a closed loop's users
])
def test_rate_inf_is_recorded_as_inf_and_loads_again(path: str, options: dict[str, Any]
                                                      ) -> None:
    trace = load_trace(path, TraceOptions(rate=math.inf, **options))
    record, again = reloaded(trace)
    assert record["options"]["rate"] == "inf" and record["timing"]["value"] == "inf"
    assert "seed" not in record["options"]  # every request at 0 s: nothing drawn
    assert again.digest == trace.digest
    assert {r.arrival_s for r in again.requests} == {0.0}
    assert "rate inf: every request arrives at 0 s" in trace.notes


def test_burstiness_inf_is_recorded_as_inf_and_named_constant() -> None:
    trace = load_trace("synthetic", TraceOptions(rate=2.0, burstiness=math.inf, **FIXED))
    record, again = reloaded(trace)
    assert record["options"]["burstiness"] == "inf"
    assert record["source"] == "synthetic:constant"
    assert record["timing"] == {"kind": "rate", "value": 2.0, "arrival": "constant"}
    assert again.digest == trace.digest
    # the Poisson arrivals a reload without it would give are other requests
    assert load_trace("synthetic", TraceOptions(rate=2.0, **FIXED)).digest != trace.digest
    named = load_trace("synthetic:gamma", TraceOptions(rate=2.0, burstiness=math.inf, **FIXED))
    assert named.source == "synthetic:constant" and named.digest == trace.digest


def test_a_record_of_inf_builds_the_same_options() -> None:
    assert TraceOptions(rate="inf") == TraceOptions(rate=math.inf)  # type: ignore[arg-type]
    assert (TraceOptions(burstiness="inf")  # type: ignore[arg-type]
            == TraceOptions(burstiness=math.inf))
    assert TraceOptions(rate=math.inf, burstiness=math.inf).as_record(seeded=False) == {
        "rate": "inf", "burstiness": "inf"}


def test_a_closed_loop_records_the_rate_it_loads_at() -> None:
    """A concurrency probe of a synthetic trace loads it at rate inf (its users send as they
    free up); its record loads the same requests again."""
    trace = trace_file_at("synthetic", FIXED)("concurrency", 4)
    record, again = reloaded(trace)
    assert record["options"]["rate"] == "inf" and again.digest == trace.digest


def test_a_simulated_run_at_rate_inf_reports_every_request_at_0_s(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main(["simulate", "--model", "llama-3.1-8b", "--trace", "synthetic",
                 "--num-requests", "5", "--rate", "inf", "--prompt-tokens", "8",
                 "--output-tokens", "4", "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["load"]["value"] == "inf"
    assert manifest["load"]["arrivals"] == "every request at 0 s"
    assert manifest["trace"]["options"]["rate"] == "inf"
    report = (out / "report.md").read_text()
    assert "every request at 0 s" in report and "trace timing" not in report


@pytest.mark.parametrize("value", ["inf", math.inf, None])  # None: older folders' null
def test_load_text_of_an_infinite_rate(value: object) -> None:
    assert load_text({"kind": "rate", "value": value}) == "every request at 0 s"
    assert load_text({"kind": "rate", "value": 2.0}) == "2 req/s"
    assert load_text({"kind": "trace", "value": None}) == "trace timing"


# ---------------------------------------------------------------- lengths_from


def test_lengths_from_is_recorded_absolute_and_loads_from_another_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    typed = "harness/data/sharegpt_lengths_excerpt.csv"
    trace = load_trace("synthetic", TraceOptions(num_requests=20, rate=5.0, lengths_from=typed))
    record = json.loads(dumps_json(trace_manifest(trace)))
    assert record["options"]["lengths_from"] == str(SHAREGPT.resolve())
    assert any(typed in note for note in record["notes"])  # as typed
    monkeypatch.chdir(tmp_path)
    again = load_trace(record["source"], TraceOptions(**record["options"]))
    assert again.digest == trace.digest


# ---------------------------------------------------------------- the seed


@pytest.mark.parametrize(("path", "options"), [
    (str(AZURE_CONV), {"arrival": "constant", "limit": 10}),
    (str(AZURE_CONV), {"burstiness": math.inf, "limit": 10}),
    ("synthetic:constant", {"rate": 2.0, **FIXED}),
    ("synthetic", {"rate": 2.0, **FIXED, "num_requests": 1}),
])
def test_no_seed_is_recorded_where_nothing_was_drawn(path: str, options: dict[str, object]
                                                     ) -> None:
    trace = load_trace(path, TraceOptions(**options, seed=5))  # type: ignore[arg-type]
    assert "seed" not in trace.options and "seed" not in (trace.timing or {})
    assert not any("seed" in note for note in trace.notes)
    again = load_trace(path, TraceOptions(**options))  # type: ignore[arg-type]
    assert again.digest == trace.digest  # the seed changed nothing


def test_a_seed_that_drew_arrivals_is_recorded() -> None:
    trace = load_trace(AZURE_CONV, TraceOptions(arrival="poisson", limit=10, seed=5))
    assert trace.options["seed"] == 5 and (trace.timing or {})["seed"] == 5


# ---------------------------------------------------------------- trace info


def test_arrivals_text_says_what_a_trace_without_a_span_has() -> None:
    at_once = load_trace("synthetic", TraceOptions(rate=math.inf, num_requests=5,
                                                   prompt_tokens=3, output_tokens=3))
    assert arrivals_text(at_once).startswith("all at 0 s")
    one = load_trace("synthetic", TraceOptions(rate=2.0, num_requests=1, prompt_tokens=3,
                                               output_tokens=3))
    assert arrivals_text(one).startswith("at 0 s (one request")
    for text in (arrivals_text(at_once), arrivals_text(one)):
        assert "n/a" not in text
    timed = arrivals_text(load_trace(AZURE_CONV, TraceOptions(limit=10)))
    assert timed == "over 8.5 s; mean rate 1.06 req/s; inter-arrival CV 1.36"


def test_a_probed_rate_is_written_as_probed() -> None:
    """A capacity search's probe at 10.37 req/s, the capacity it found, must not read "10.4"
    in the report's tables, above that capacity."""
    assert load_text({"kind": "rate", "value": 10.37}) == "10.37 req/s"
    assert load_text({"kind": "rate", "value": 8.354}) == "8.354 req/s"
    assert load_text({"kind": "rate", "value": 1250.0}) == "1,250 req/s"
