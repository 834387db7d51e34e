"""Input bounds and strict JSON: SLOs, counts, tokens and rates are refused the same way on the
command line and in scenario files (one line naming the option, or file:line:key), and no file
batchlab writes holds a bare NaN."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import numpy as np
import pytest

from harness.cli import main
from harness.metrics import Slo
from harness.results import write_json_atomic
from harness.scenario import ScenarioError, load_scenario

SIMULATE = ["simulate", "--model", "llama-3.1-8b", "--trace", "synthetic", "--num-requests", "3",
            "--rate", "20", "--prompt-tokens", "8", "--output-tokens", "4"]


def strict_loads(text: str) -> object:
    """json.loads that refuses NaN and Infinity, as every JSON reader outside Python does."""
    def refuse(name: str) -> object:
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


# ---------------------------------------------------------------- SLOs


@pytest.mark.parametrize("value", ["nan", "-1", "0", "inf", "-inf"])
def test_cli_slo_refuses_nan_negative_zero(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert main([*SIMULATE, "--slo", f"ttft_s={value}", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--slo: ttft_s" in err[0] and "positive, finite" in err[0]
    assert not out.exists()  # refused before anything ran


def test_cli_slo_refuses_a_key_given_twice(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main([*SIMULATE, "--slo", "ttft_s=0.5,ttft_s=1", "--out", str(out)]) == 2
    assert "--slo: ttft_s given twice (0.5 and 1)" in capsys.readouterr().err
    assert not out.exists()


def test_slo_record_refuses_what_the_parser_does() -> None:
    with pytest.raises(ValueError, match="tpot_s: must be a positive, finite number"):
        Slo(tpot_s=math.nan)
    with pytest.raises(ValueError, match="e2e_s"):
        Slo(e2e_s=0.0)
    assert Slo.parse("ttft_s=0.5, e2e_s=10").as_dict() == {"ttft_s": 0.5, "e2e_s": 10.0}


def scenario(tmp_path: Path, *, trace: str = "  limit: 3", top: str = "",
             engine: str = "") -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent("""\
        name: demo
        question: Is it bounded?
        trace:
          path: azure_conv_excerpt.csv
        {trace}
        model: llama-3.1-8b
        gpu: h100-sxm
        {top}engines:
          - name: r
            engine: reference
            {engine}
        """).format(trace=trace, top=top, engine=engine))
    return path


def error_of(path: Path) -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    return info.value


@pytest.mark.parametrize("value", [".nan", "-1", "0", ".inf"])
def test_scenario_slo_uses_the_same_rule(value: str, tmp_path: Path) -> None:
    err = error_of(scenario(tmp_path, top=f"slo: {{ttft_s: {value}}}\n"))
    assert (err.line, err.key) == (8, "slo.ttft_s")
    assert "must be a positive, finite number of seconds" in err.message


# ---------------------------------------------------------------- bounds in scenario files


@pytest.mark.parametrize(("option", "key", "expected"), [
    ("limit: 4294967295", "trace.limit", "at most 10000000 requests"),
    ("num_requests: 100000000000", "trace.num_requests", "at most 10000000 requests"),
    ("prompt_tokens: 4294967295", "trace.prompt_tokens", "at most 16777216 tokens"),
    ("output_tokens: 0", "trace.output_tokens", "at least 1"),
    ("rate: 1.0e-9", "trace.rate", "between 1e-06 and 1e+06"),
    ("start_s: 1.0e+300", "trace.start_s", "at most 1e+10 seconds"),
    ("start_s: -5", "trace.start_s", "non-negative"),
    ("time_scale: 1.0e+300", "trace.time_scale", "between 1e-06 and 1e+06"),
    # on_too_long without a length was ignored: every long request failed in the run
    ("on_too_long: drop", "trace.on_too_long",
     "drop needs max_model_len N, the length (prompt + output) beyond which requests are "
     "dropped"),
])
def test_scenario_trace_options_are_bounded_like_the_cli(
    option: str, key: str, expected: str, tmp_path: Path
) -> None:
    err = error_of(scenario(tmp_path, trace=f"  {option}"))
    assert (err.line, err.key) == (5, key)
    assert expected in err.message


def test_scenario_load_and_knobs_are_bounded(tmp_path: Path) -> None:
    err = error_of(scenario(tmp_path, top="load: {rates: [1, 1.0e+7]}\n"))
    assert (err.line, err.key) == (8, "load.rates[1]") and "1e+06" in err.message
    err = error_of(scenario(tmp_path, top="load: {time_scales: [1, 1.0e+300]}\n"))
    assert (err.line, err.key) == (8, "load.time_scales[1]") and "1e+06" in err.message
    err = error_of(scenario(tmp_path, top="load: {concurrencies: [4, 100000000]}\n"))
    assert (err.line, err.key) == (8, "load.concurrencies[1]") and "65536" in err.message
    err = error_of(scenario(tmp_path, engine="num_gpu_blocks: 4294967295"))
    assert (err.line, err.key) == (11, "engines[0].num_gpu_blocks")
    assert "up to 16777216" in err.message
    err = error_of(scenario(tmp_path, engine="knobs: {max_num_batched_tokens: 4294967295}"))
    assert (err.line, err.key) == (11, "engines[0].knobs.max_num_batched_tokens")


def test_scenario_options_that_clash_at_a_load_point(tmp_path: Path) -> None:
    # time_scale in the trace and a rate per load point: both rescale time. Refused at load,
    # not when the sweep reaches the cell.
    # At the load point's value, in the file's words (keys, not --flags).
    err = error_of(scenario(tmp_path, trace="  time_scale: 2", top="load: {rates: [1, 2]}\n"))
    assert (err.line, err.key) == (8, "load.rates[0]")
    assert err.message == ("at load point rate-1: time_scale and rate both rescale time: give "
                           "one of them")


# ---------------------------------------------------------------- strict JSON


def test_summary_with_nan_is_written_as_null(tmp_path: Path) -> None:
    summary = {"duration_s": math.nan, "ttft_s": {"p50": np.float64("nan"), "max": math.inf},
               "send_lag_s": [np.float32("nan"), 1.5], "count": np.int64(3), "ok": np.bool_(True)}
    path = tmp_path / "summary.json"
    write_json_atomic(summary, path)
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert strict_loads(text) == {"duration_s": None, "ttft_s": {"p50": None, "max": None},
                                  "send_lag_s": [None, 1.5], "count": 3, "ok": True}


def test_simulated_run_files_are_strict_json(tmp_path: Path) -> None:
    # One request of one output token: no TPOT, so the SLO's metric is undefined (NaN) there.
    out = tmp_path / "run"
    argv = [*SIMULATE, "--num-requests", "1", "--output-tokens", "1", "--slo",
            "ttft_s=1,tpot_s=0.05", "--out", str(out)]
    assert main(argv) == 0
    for name in ("summary.json", "manifest.json"):
        strict_loads((out / name).read_text())
