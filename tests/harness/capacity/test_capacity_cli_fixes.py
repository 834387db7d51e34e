"""``batchlab capacity`` as its user reads it: a served reference engine's capacity labelled a
prediction, bad loads and timing flags refused by name, why a search stopped where it did,
a --resume judged on the settings that take effect, probe verdicts in the order they failed,
and an --out that cannot be made refused as bad input."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.cli import main as cli_main
from harness.metrics import Slo
from harness.prediction import CAPACITY_CAVEAT
from harness.results import SEARCH_FILE

REPO = Path(__file__).resolve().parents[3]
EXCERPT = REPO / "harness" / "data" / "azure_conv_excerpt.csv"
SERVED = "predicted by the reference engine served over HTTP"
SMALL = ["--trace", "synthetic", "--num-requests", "16", "--prompt-tokens", "64",
         "--output-tokens", "8", "--start", "4", "--max-probes", "2", "--slo", "ttft_s=1"]


def _capacity_json(out: Path) -> dict[str, Any]:
    return dict(json.loads((out / "capacity.json").read_text()))


# ---------------------------------------------------------------- A: served reference


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def _served(port: int, log: Path) -> Iterator[None]:
    """``batchlab serve reference`` on ``port`` in a child process, stopped on exit."""
    argv = [sys.executable, "-m", "harness.cli", "serve", "reference", "--host", "127.0.0.1",
            "--port", str(port)]
    with log.open("wb") as sink:
        process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while "listening on" not in log.read_text(errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.05)
        yield
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.timeout(300)
def test_an_attached_served_reference_is_labelled_a_prediction(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Attached as ``--engine openai``, the reference engine served over HTTP said nothing of
    predicting the capacity: capacity.json had "predicted": false though every probe's
    summary said "predicted by the reference engine served over HTTP". What the probes
    recorded decides, on the console and in capacity.json."""
    port = _free_port()
    out = tmp_path / "cap"
    with _served(port, tmp_path / "server.log"):
        code = cli_main(["capacity", "--engine", "openai", "--url", f"http://127.0.0.1:{port}",
                         "--model", "llama-3.1-8b", *SMALL, "--out", str(out)])
    said = capsys.readouterr()
    assert code == 0, said.err
    assert f"\nopenai: {SERVED}" in said.out and CAPACITY_CAVEAT in said.out
    row = _capacity_json(out)["settings"][0]
    assert row["predicted"] is True and row["mode"] == "live"
    assert row["prediction"]["text"].startswith(SERVED) and row["prediction"]["served"]


@pytest.mark.timeout(300)
def test_a_launched_served_reference_is_labelled_a_prediction_on_the_console(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--engine reference --launch``: the console printed the table and no "predicted by"
    line, where ``replay`` says its figures are predicted."""
    out = tmp_path / "cap"
    code = cli_main(["capacity", "--engine", "reference", "--launch", *SMALL, "--out", str(out)])
    said = capsys.readouterr()
    assert code == 0, said.err
    assert f"\nreference: {SERVED}" in said.out and CAPACITY_CAVEAT in said.out
    row = _capacity_json(out)["settings"][0]
    assert row["predicted"] is True and row["prediction"]["text"].startswith(SERVED)


# ---------------------------------------------------------------- B, C: bad input


@pytest.mark.parametrize("search", ["rate", "concurrency"])
@pytest.mark.parametrize(("flag", "value"), [("--max-load", "inf"), ("--max-load", "nan"),
                                             ("--min-load", "nan"), ("--start", "inf")])
def test_a_load_that_is_not_finite_is_bad_input_naming_its_flag(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], search: str, flag: str,
        value: str) -> None:
    """--max-load inf on a concurrency search was an OverflowError traceback (exit 1); a rate
    search took it and doubled its load without end."""
    code = cli_main(["capacity", "--trace", str(EXCERPT), "--limit", "50", "--search", search,
                     "--slo", "ttft_s=0.5", flag, value, "--out", str(tmp_path / "cap")])
    assert code == 2
    assert f"{flag}: expected a finite load, got {value}" in capsys.readouterr().err
    assert not (tmp_path / "cap").exists()


@pytest.mark.parametrize("flags", [["--time-scale", "0.5"], ["--rate", "3"],
                                   ["--time-scale", "0.5", "--rate", "3"]])
def test_a_rate_search_refuses_a_time_scale_saying_it_sets_the_rate_itself(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str]) -> None:
    """--time-scale alone was refused as "--time-scale and --rate both rescale time", though
    no --rate was given."""
    code = cli_main(["capacity", "--trace", str(EXCERPT), "--limit", "50", "--slo",
                     "ttft_s=0.5", *flags, "--out", str(tmp_path / "cap")])
    assert code == 2
    err = capsys.readouterr().err
    assert "a rate search sets the arrival rate of each probe itself" in err
    assert flags[0] in err and "both rescale time" not in err
    assert not (tmp_path / "cap").exists()


def test_a_concurrency_search_says_a_time_scale_has_no_effect(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli_main(["capacity", "--trace", str(EXCERPT), "--limit", "20", "--search",
                     "concurrency", "--start", "1", "--max-probes", "2", "--slo", "ttft_s=0.5",
                     "--time-scale", "0.5", "--out", str(tmp_path / "cap")])
    said = capsys.readouterr()
    assert code == 0, said.err
    assert ("note: --time-scale: no effect on a concurrency search (each user sends its next "
            "request when its last one ends; arrival times are not used)") in said.err


def test_a_scenario_time_scale_a_rate_search_does_not_use_is_warned_of() -> None:
    """A scenario's trace.time_scale was dropped from a rate search without a word."""
    from harness.capacity import scenario_settings
    from harness.scenario import load_scenario

    scenario = load_scenario(REPO / "scenarios" / "batch-size.yaml")
    line = scenario.line_of("trace.time_scale")
    warned: list[str] = []
    scenario_settings(scenario, kind="rate", target=0.99, slo=Slo(ttft_s=1), warn=warned.append)
    assert warned == [f"{scenario.source}:{line}: trace.time_scale 0.05 is not used: a rate "
                      "search sets the arrival rate of each probe itself (the trace rescaled "
                      "to it)"]
    warned.clear()
    scenario_settings(scenario, kind="concurrency", target=0.99, slo=Slo(ttft_s=1),
                      warn=warned.append)
    assert warned == []  # kept, and unused by users who send as they free up


# ---------------------------------------------------------------- D: the trace's cap


def test_a_concurrency_search_the_trace_capped_says_so_on_the_console(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The console said ``at_least_max`` at 12 users while --max-load was 4096: only
    search.json said that the trace's length set 12."""
    out = tmp_path / "cap"
    code = cli_main(["capacity", "--trace", str(EXCERPT), "--limit", "50", "--search",
                     "concurrency", "--slo", "ttft_s=0.5", "--out", str(out)])
    said = capsys.readouterr()
    assert code == 0, said.err
    line = next(x for x in said.out.splitlines() if x.startswith("reference "))
    assert line.endswith("at_least_max: the trace's length caps users at 12 (one user per 4 "
                         "of its requests), not --max-load")
    row = _capacity_json(out)["settings"][0]
    assert row["status"] == "at_least_max" and row["load_cap"]["max_load"] == 12
    assert row["load_cap"]["why"].startswith("one user per 4 requests of the trace "
                                             "(50 requests: 12 users)")
    search = json.loads((out / "reference" / SEARCH_FILE).read_text())
    assert search["load_cap"] == row["load_cap"]["why"] and search["load_cap_max"] == 12


# ---------------------------------------------------------------- E: --resume


def test_resume_judges_the_settings_that_take_effect_and_names_a_knob_that_changed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The default GPU or max_num_seqs said aloud, or the trace named ./t3.csv, were refused
    as "made with other settings (changed: engine or knobs)"; a knob that did change was not
    named."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(EXCERPT, tmp_path / "t3.csv")
    base = ["capacity", "--limit", "60", "--start", "2", "--max-probes", "2", "--slo",
            "ttft_s=0.5,tpot_s=0.03", "--out", "cap"]
    assert cli_main([*base, "--trace", "t3.csv"]) == 0
    capsys.readouterr()
    for same in (["--trace", "t3.csv", "--gpu", "h100-sxm"],
                 ["--trace", "t3.csv", "--max-num-seqs", "256"],
                 ["--trace", "./t3.csv"],
                 ["--trace", str(tmp_path / "t3.csv")]):
        code = cli_main([*base, *same, "--resume"])
        said = capsys.readouterr()
        assert code == 0, (same, said.err)
        assert said.err.count("(resumed)") == 2, same
    assert cli_main([*base, "--trace", "t3.csv", "--max-num-seqs", "64", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "made with other settings (changed: engine or knobs: --max-num-seqs 256 then, 64 now" \
        in err
    # a trace option is named with its two values, not as "trace options" alone
    assert cli_main(["capacity", "--limit", "50", *base[3:], "--trace", "t3.csv",
                     "--resume"]) == 2
    assert ("made with other settings (changed: trace options: limit: 60 then, 50 now)"
            in capsys.readouterr().err)


# ---------------------------------------------------------------- F: wording


def test_a_probe_that_missed_the_target_says_so_before_its_pace(tmp_path: Path) -> None:
    from harness.capacity import ProbeOutcome
    from harness.capacity.run import probe_verdict

    short = "too short to show a steady state: its arrivals last 6.22 s, under 4 times ..."
    missed = ProbeOutcome(load=32, attainment=0.503, passed=False, behind=short)
    assert probe_verdict(missed, 0.99, tmp_path) == (
        f"SLO attainment 50.3%, failed: below the 99.0% target; also {short}")
    met = ProbeOutcome(load=32, attainment=0.995, passed=False, behind=short)
    assert probe_verdict(met, 0.99, tmp_path) == f"SLO attainment 99.5%, failed; {short}"


def test_requests_cut_off_by_the_early_stop_are_not_called_failed(tmp_path: Path) -> None:
    from harness.capacity import ProbeOutcome
    from harness.capacity.run import probe_verdict

    (tmp_path / "rate-64").mkdir()
    (tmp_path / "rate-64" / "summary.json").write_text(json.dumps(
        {"failures": {"not_finished": 101, "rejected": 2}}))
    stopped = ProbeOutcome(load=64, attainment=0.2, passed=False, num_failed=103,
                           num_requests=178, stopped="over-saturated: ...", run_dir="rate-64")
    assert probe_verdict(stopped, 0.99, tmp_path) == (
        "SLO attainment 20.0% (101 of 178 requests not finished when the probe was stopped "
        "early; 2 of 178 requests failed), failed; stopped early: over-saturated: ...; its "
        "latencies are of the 75 requests that finished only, not of the 101 the early stop "
        "cut off: a lower bound")


def test_the_log_of_a_probe_stopped_early_and_of_one_user(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["capacity", "--trace", str(EXCERPT), "--limit", "200", "--slo",
                     "ttft_s=0.5,tpot_s=0.03", "--start", "64", "--max-probes", "2",
                     "--out", str(tmp_path / "rate")]) == 0
    err = capsys.readouterr().err
    assert "requests not finished when the probe was stopped early)" in err
    assert "requests failed" not in err
    assert cli_main(["capacity", "--trace", str(EXCERPT), "--limit", "20", "--search",
                     "concurrency", "--start", "1", "--max-probes", "2", "--slo", "ttft_s=0.5",
                     "--out", str(tmp_path / "conc")]) == 0
    err = capsys.readouterr().err
    assert "reference: probe 1 user\n" in err and "reference: 1 user: SLO attainment" in err
    assert "1 users" not in err


# ---------------------------------------------------------------- G: --out


def test_an_out_that_cannot_be_made_is_bad_input_naming_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What the look-ahead check cannot tell (root may write /proc, but nothing can be made
    there) failed at mkdir: exit 1, "error: /proc/x: No such file or directory"."""
    import harness.runfolder

    monkeypatch.setattr(harness.runfolder, "ensure_creatable_dir", lambda *a, **k: None)
    (tmp_path / "afile").write_text("mine\n")
    out = tmp_path / "afile" / "sub"
    code = cli_main(["capacity", *SMALL, "--out", str(out)])
    assert code == 2
    assert f"error: --out {out}: cannot write there" in capsys.readouterr().err


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="no /proc")
def test_an_out_under_proc_is_bad_input_naming_out(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = cli_main(["capacity", *SMALL, "--out", "/proc/batchlab-x"])
    assert code == 2
    assert "error: --out /proc/batchlab-x: cannot write there" in capsys.readouterr().err


def test_the_reports_curve_table_says_a_missed_target_before_the_pace() -> None:
    """A probe at 50.3% against a 99% target read "(failed: too short to show a steady
    state)", as if the trace's length, not the SLO, had failed it."""
    from harness.report.curves import CurvePoint, Series
    from harness.report.sections import curves_section

    def point(load: float, attainment: float) -> CurvePoint:
        return CurvePoint(cell=f"rate-{load:g}", load=load, output_tokens_per_s=100.0,
                          tpot_p50_s=0.01, tpot_p90_s=0.02, ttft_p90_s=0.1,
                          attainment=attainment,
                          behind="too short to show a steady state: its arrivals last 9 s")

    series = [Series("reference", "rate", (point(4.0, 0.995), point(8.0, 0.503)))]
    text = "\n".join(curves_section(series, has_plot=False, target=0.99))
    assert "| 99.5% (failed: too short to show a steady state) |" in text
    assert ("| 50.3% (failed: below the 99.0% target; also too short to show a steady state) |"
            in text)


def test_the_curve_table_shows_a_closed_loops_attainment_once_under_way() -> None:
    """The capacity table said 72 users passed at 99% while the curve table, over every
    request, showed 97.1% for the same probe: both are shown, and said what they are."""
    from harness.report.curves import CurvePoint, Series
    from harness.report.sections import curves_section

    point = CurvePoint(cell="conc-72", load=72, output_tokens_per_s=4060.0, tpot_p50_s=0.0148,
                       tpot_p90_s=0.0181, ttft_p90_s=0.744, attainment=0.971,
                       under_way=(0.994, 72))
    other = CurvePoint(cell="conc-1", load=1, output_tokens_per_s=150.0, tpot_p50_s=0.006,
                       tpot_p90_s=0.006, ttft_p90_s=0.03, attainment=1.0)
    text = "\n".join(curves_section([Series("continuous", "concurrency", (other, point))],
                                    has_plot=False, target=0.99))
    assert "| 97.1% (99.4% once under way) |" in text
    assert "| 1 user |" in text
    assert "over the requests sent after the first one completed" in text
