"""Capacity searches on the reference engine: recorded probes, a known capacity, early stop,
resume, the command line and the report."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

import harness.capacity.run as capacity_run
from adapters.reference import ReferenceConfig
from harness.capacity import (
    SEARCH_FILE,
    ProbeOutcome,
    SearchSpec,
    run_probe,
    run_search,
    single_setting,
)
from harness.capacity.probe import outcome_from_summary
from harness.cli import main as cli_main
from harness.metrics import Slo, summarize
from harness.sim import simulate
from harness.target import TargetSpec
from harness.traces import TraceOptions, load_trace

# A tiny configuration with a sharp, known capacity: constant arrivals of identical requests,
# at most 8 running. Up to about 31 req/s every request meets TTFT <= 100 ms; above, the
# queue grows and TTFTs run away.
KNOBS = {"policy": "fcfs", "max_num_seqs": 8}
TRACE = {"num_requests": 80, "arrival": "constant", "prompt_tokens": 512, "output_tokens": 32}
SLO = Slo(ttft_s=0.1, tpot_s=0.02)
CONFIG = ReferenceConfig(model="llama-3.1-8b", gpu="h100-sxm", **KNOBS)  # type: ignore[arg-type]


def setting(**kw: object) -> capacity_run.Setting:
    from adapters.knobs import Knobs

    spec = TargetSpec("reference", "simulate", knobs=Knobs.from_mapping(KNOBS))
    args = {"name": "fcfs", "trace_path": "synthetic", "trace_options": TRACE, "kind": "rate",
            "target": 0.99, "slo": SLO, "knobs": KNOBS, **kw}
    return single_setting(spec, **args)  # type: ignore[arg-type]


def attainment_at(rate: float, num_requests: int = 80) -> float:
    """A direct simulation at one rate, outside the search."""
    trace = load_trace("synthetic", TraceOptions(**{**TRACE, "num_requests": num_requests,
                                                    "rate": rate}))
    summary = summarize(simulate(trace.requests, CONFIG).timelines, slo=SLO)
    return float(summary["goodput"]["slo_attainment"])


def test_search_finds_the_capacity_a_direct_sweep_finds(tmp_path: Path) -> None:
    spec = SearchSpec(kind="rate", start=4.0, precision=0.02)
    result = run_search(setting(), spec, tmp_path)
    assert result.status == "found"
    lo, hi = result.passing, result.failing
    assert lo is not None and hi is not None and hi / lo - 1 <= 0.02
    # The direct sweep: 1% steps across the region. Everything up to the search's answer
    # passes, everything from its failing load fails: the capacity lies in [lo, hi).
    grid = [20 * 1.01 ** k for k in range(60)]  # 20 .. 36 req/s
    passing = {r: attainment_at(r) >= 0.99 for r in grid}
    assert all(passing[r] for r in grid if r <= lo)
    assert not any(passing[r] for r in grid if r >= hi)
    swept = max(r for r in grid if passing[r])
    assert lo <= swept * 1.01 and swept < hi
    # Every probe is a recorded run folder, listed in search.json.
    record = json.loads((tmp_path / SEARCH_FILE).read_text())
    assert record["status"] == "found" and record["capacity"] == lo
    assert record["bracket"] == {"passing": lo, "failing": hi}
    assert record["precision"] == 0.02 and record["kind"] == "rate"
    for probe in record["probes"]:
        folder = tmp_path / probe["label"]
        assert (folder / "summary.json").exists() and (folder / "probe.json").exists()
        cell = json.loads((folder / "cell.json").read_text())
        assert cell["load"] == {"kind": "rate", "value": probe["load"]}


def test_an_over_saturated_probe_stops_early_and_fails(tmp_path: Path) -> None:
    plan = setting(trace_options={**TRACE, "num_requests": 600}).plan
    outcome = run_probe(plan, 200.0, tmp_path / "rate-200")
    assert not outcome.passed
    assert outcome.stopped is not None and "over-saturated" in outcome.stopped
    summary = json.loads((tmp_path / "rate-200" / "summary.json").read_text())
    assert summary["stopped_early"] == outcome.stopped
    assert summary["num_not_sent"] > 0  # it stopped well before the trace ran out
    manifest = json.loads((tmp_path / "rate-200" / "manifest.json").read_text())
    assert manifest["status"] == "stopped"
    # the requests the stop cut off are not reported as the engine's failures
    from harness.report import render_run_report

    report = render_run_report(tmp_path / "rate-200").read_text()
    cut = summary["failures"]["not_finished"]
    assert ("was stopped early (over-saturated: " in report
            and f"{cut:,} requests in flight cut off, {summary['num_not_sent']:,} never sent."
            in report)
    assert "not_finished" not in report.split("## Key findings")[1].split("##")[0]
    # Without the check the same probe runs to the end (and fails all the same).
    plan_full = setting(trace_options={**TRACE, "num_requests": 600}, early_stop=False).plan
    full = run_probe(plan_full, 200.0, tmp_path / "full")
    assert full.stopped is None and not full.passed


@pytest.mark.parametrize(("raised", "state", "reason"), [
    (KeyboardInterrupt(), "interrupted", "stopped by Ctrl-C or SIGTERM before it finished"),
    (RuntimeError("engine gone"), "failed", "RuntimeError: engine gone"),
])
def test_a_probe_that_did_not_finish_says_how(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              raised: BaseException, state: str,
                                              reason: str) -> None:
    """Ctrl-C is not a failure of the engine: the probe's status.json says which it was."""
    import harness.capacity.probe as probe_module

    class Stopped:
        def run(self, *args: object) -> None:
            raise raised

    monkeypatch.setattr(probe_module, "make_target", lambda spec: Stopped())
    with pytest.raises(type(raised)):
        run_probe(setting().plan, 8.0, tmp_path / "rate-8")
    status = json.loads((tmp_path / "rate-8" / "status.json").read_text())
    assert status == {"state": state, "reason": reason}


def test_a_stopped_probe_fails_whatever_its_attainment() -> None:
    summary = {"goodput": {"slo_attainment": 1.0}, "stopped_early": "over-saturated: ..."}
    assert not outcome_from_summary(8.0, summary, 0.99).passed
    assert outcome_from_summary(8.0, {"goodput": {"slo_attainment": 0.995}}, 0.99).passed


def test_resume_runs_only_the_probes_not_done(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    spec = SearchSpec(kind="rate", start=4.0, precision=0.05)
    full = run_search(setting(), spec, tmp_path / "full")
    ran: list[float] = []
    real_probe = capacity_run.run_probe

    def interrupted_after_three(plan: object, load: float, out: Path) -> ProbeOutcome:
        if len(ran) == 3:
            raise KeyboardInterrupt
        ran.append(load)
        return real_probe(plan, load, out)  # type: ignore[arg-type]

    monkeypatch.setattr(capacity_run, "run_probe", interrupted_after_three)
    half = tmp_path / "half"
    with pytest.raises(KeyboardInterrupt):
        run_search(setting(), spec, half)
    record = json.loads((half / SEARCH_FILE).read_text())
    assert record["status"] == "interrupted" and len(record["probes"]) == 3

    ran.clear()
    monkeypatch.setattr(capacity_run, "run_probe", lambda plan, load, out: (
        ran.append(load), real_probe(plan, load, out))[1])
    resumed = run_search(setting(), spec, half, resume=True)
    assert (resumed.passing, resumed.failing) == (full.passing, full.failing)
    assert [p.load for p in resumed.probes] == [p.load for p in full.probes]
    assert ran == [p.load for p in full.probes[3:]]  # the first three were not run again
    assert [p.resumed for p in resumed.probes[:3]] == [True] * 3
    # Other settings (another SLO) must not reuse these probes.
    with pytest.raises(ValueError, match="made with other settings"):
        run_search(setting(slo=Slo(ttft_s=0.5)), spec, half, resume=True)


def test_cli_capacity_concurrency_search_and_report(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cap"
    code = cli_main([
        "capacity", "--trace", "synthetic", "--num-requests", "60", "--prompt-tokens", "512",
        "--output-tokens", "32", "--max-num-seqs", "8", "--search", "concurrency",
        "--start", "2", "--slo", "ttft_s=0.1,tpot_s=0.02", "--out", str(out),
    ])
    assert code == 0
    printed = capsys.readouterr().out
    assert "reference" in printed and "found" in printed
    search = json.loads((out / "reference" / SEARCH_FILE).read_text())
    assert search["kind"] == "concurrency" and search["status"] == "found"
    capacity = search["capacity"]
    assert search["bracket"]["failing"] == capacity + 1  # exact, to one user
    report = (out / "report.md").read_text()
    assert "## Throughput–latency curves" in report and "## Capacity at SLO" in report
    assert f"| `reference` | {capacity:g} users | baseline | search |" in report
    # the answer leads the key findings
    findings = report.split("## Key findings")[1].split("\n- ")
    assert findings[1].startswith("Capacity at SLO (the highest load with at least 99.0% of "
                                  "requests within TTFT ≤ 100 ms, TPOT ≤ 20 ms, the "
                                  "engine keeping up): "
                                  f"`reference` {capacity:g} users.")
    assert (out / "throughput_latency.png").exists()
    # a rate search cannot also be given a rate
    assert cli_main(["capacity", "--trace", "synthetic", "--num-requests", "4",
                     "--prompt-tokens", "8", "--output-tokens", "2", "--rate", "3",
                     "--slo", "ttft_s=1", "--out", str(tmp_path / "x")]) == 2
    assert "--rate" in capsys.readouterr().err


def test_cli_capacity_with_a_profile_is_filed_under_the_profile(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cap"
    assert cli_main([
        "capacity", "--trace", "synthetic", "--num-requests", "40", "--prompt-tokens", "512",
        "--output-tokens", "16", "--profile", "trtllm-h100-sxm", "--start", "4",
        "--max-probes", "3", "--slo", "ttft_s=0.1", "--out", str(out),
    ]) == 0
    printed = capsys.readouterr().out
    assert "trtllm-h100-sxm: predicted by the reference engine with profile trtllm-h100-sxm" \
        in printed
    assert [p.name for p in out.iterdir() if p.is_dir()] == ["trtllm-h100-sxm"]
    search = json.loads((out / "trtllm-h100-sxm" / SEARCH_FILE).read_text())
    assert len(search["probes"]) == 3
    report = (out / "report.md").read_text()
    assert "| `trtllm-h100-sxm` |" in report
    # one trace at three loads is one line, and every cell is the same kind of prediction
    rows = {ln.split(" | ")[0]: ln for ln in report.splitlines() if ln.startswith("| ")}
    assert rows["| Trace"].startswith("| Trace | `synthetic:poisson` (synthetic, 40 requests, "
                                      "mean prompt 512 tokens, mean output 16 tokens), "
                                      "arrivals at each cell's load (3 arrival schedules")
    assert rows["| Predicted"].startswith("| Predicted | every cell: **predicted** by the "
                                          "reference engine with profile `trtllm-h100-sxm`")


def test_resume_refuses_probes_of_a_profile_or_trace_since_rewritten(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A recalibrated profile (or a trace rewritten in place) answers another question: its
    earlier probes are not reused, and the refusal names what changed."""
    from adapters.reference.cost_model import resolve_profile

    profile = tmp_path / "mine.json"
    profile.write_text(resolve_profile("vllm-h100-sxm").read_text())
    trace = tmp_path / "trace.csv"
    trace.write_text((Path(__file__).resolve().parents[3] / "harness" / "data"
                      / "azure_conv_excerpt.csv").read_text())
    args = ["capacity", "--trace", str(trace), "--limit", "60", "--profile", str(profile),
            "--start", "4", "--max-probes", "2", "--slo", "ttft_s=0.5", "--out",
            str(tmp_path / "cap")]
    assert cli_main(args) == 0
    capsys.readouterr()
    assert cli_main([*args, "--resume"]) == 0  # nothing changed: resumed
    said = capsys.readouterr()
    assert "(resumed)" in said.out + said.err
    doc = json.loads(profile.read_text())
    doc["memory_efficiency"] *= 0.3
    profile.write_text(json.dumps(doc))
    assert cli_main([*args, "--resume"]) == 2
    assert f"changed: the bytes of {profile.resolve()}" in capsys.readouterr().err
    profile.write_text(resolve_profile("vllm-h100-sxm").read_text())  # as it was
    with trace.open("a") as f:
        f.write("2023-11-16 18:15:46.6805900,4808,10\n")
    assert cli_main([*args, "--resume"]) == 2
    assert f"changed: the bytes of {trace.resolve()}" in capsys.readouterr().err
    trace.write_text(trace.read_text().rsplit("2023-11-16 18:15:46.6805900", 1)[0])
    assert cli_main([*args[:-2], "--target", "0.95", "--out", str(tmp_path / "cap"),
                     "--resume"]) == 2
    assert "target attainment: 0.99 then, 0.95 now" in capsys.readouterr().err


def test_a_capacity_search_shows_only_in_reports_of_its_setting_and_slo(tmp_path: Path) -> None:
    """A run folder beside a capacity folder (the README's reports/sim and reports/capacity)
    must not borrow its capacity: another SLO, or another setting, is another question."""
    trace = ["--trace", "synthetic", "--num-requests", "40", "--prompt-tokens", "512",
             "--output-tokens", "16"]
    assert cli_main(["capacity", *trace, "--max-num-seqs", "8", "--start", "4",
                     "--max-probes", "3", "--slo", "ttft_s=0.1", "--out",
                     str(tmp_path / "capacity")]) == 0
    assert "## Capacity at SLO" in (tmp_path / "capacity" / "report.md").read_text()
    for name, args in {"other-slo": ["--max-num-seqs", "8", "--slo", "ttft_s=0.5"],
                       "other-setting": ["--max-num-seqs", "64", "--slo", "ttft_s=0.1"]}.items():
        assert cli_main(["simulate", *trace, "--rate", "4", *args,
                         "--out", str(tmp_path / name)]) == 0
        report = (tmp_path / name / "report.md").read_text()
        assert "Capacity at SLO" not in report, name


def test_cli_capacity_over_a_scenario(tmp_path: Path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "name: tiny\nquestion: which cap serves more?\n"
        "trace: {path: azure_conv_excerpt.csv, limit: 60, prompt_tokens: 512,"
        " output_tokens: 32}\n"
        "model: llama-3.1-8b\ngpu: h100-sxm\nslo: {ttft_s: 0.1, tpot_s: 0.02}\n"
        "engines:\n  - {name: fcfs, engine: reference, knobs: {policy: fcfs}}\n"
        "grid:\n  max_num_seqs: [4, 8]\n")
    out = tmp_path / "out"
    assert cli_main(["capacity", str(scenario), "--start", "8", "--precision", "0.1",
                     "--out", str(out)]) == 0
    rows = json.loads((out / "capacity.json").read_text())["settings"]
    caps = {r["setting"]: r["capacity"] for r in rows}
    assert set(caps) == {"fcfs__max_num_seqs-4", "fcfs__max_num_seqs-8"}
    assert caps["fcfs__max_num_seqs-8"] > caps["fcfs__max_num_seqs-4"]
    report = (out / "report.md").read_text()
    assert "`fcfs, max_num_seqs=8`" in report.split("## Capacity at SLO")[1]
    answer = report.split("## Key findings")[1].split("\n- ")[1].split("\n")[0]
    ratio = caps["fcfs__max_num_seqs-8"] / caps["fcfs__max_num_seqs-4"]
    assert answer.startswith("Capacity at SLO (")
    assert "`fcfs, max_num_seqs=4` " in answer and "(baseline)" in answer
    assert f"({ratio:.2f}× the baseline)" in answer


def test_a_search_of_some_settings_keeps_the_others_earlier_results(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--only searches some settings again: the others' earlier searches (same digest) stay
    in capacity.json, scenario.json and the report, in the scenario's order; a search made
    with other settings is not kept."""
    scenario = tmp_path / "s.yaml"
    text = ("name: tiny\nquestion: which cap serves more?\n"
            "trace: {path: azure_conv_excerpt.csv, limit: 60, prompt_tokens: 512,"
            " output_tokens: 32}\n"
            "model: llama-3.1-8b\ngpu: h100-sxm\nslo: {ttft_s: 0.1, tpot_s: 0.02}\n"
            "engines:\n  - {name: fcfs, engine: reference, knobs: {policy: fcfs}}\n"
            "grid:\n  max_num_seqs: [4, 8]\n")
    scenario.write_text(text)
    out = tmp_path / "out"
    args = ["capacity", str(scenario), "--start", "8", "--precision", "0.1", "--out", str(out)]
    assert cli_main(args) == 0
    first = json.loads((out / "capacity.json").read_text())["settings"]
    capsys.readouterr()
    assert cli_main([*args, "--only", "*-8", "--resume"]) == 0
    printed = capsys.readouterr()
    assert ("kept from an earlier search (not selected by --only): fcfs__max_num_seqs-4"
            in printed.err)
    table = printed.out.split("fcfs__max_num_seqs-4 ")[-1]
    assert "(earlier search, not run now)" in table.splitlines()[0]
    again = json.loads((out / "capacity.json").read_text())["settings"]
    assert [r["setting"] for r in again] == ["fcfs__max_num_seqs-4", "fcfs__max_num_seqs-8"]
    assert [(r["status"], r["capacity"], r["bracket"]) for r in again] == [
        (r["status"], r["capacity"], r["bracket"]) for r in first]
    cells = json.loads((out / "scenario.json").read_text())["cells"]
    assert any(c.startswith("fcfs__max_num_seqs-4/") for c in cells)
    assert "`fcfs, max_num_seqs=4`" in (out / "report.md").read_text().split(
        "## Capacity at SLO")[1]
    # the same scenario with another SLO: the earlier search of the other setting no longer
    # answers this question, and is left out
    scenario.write_text(text.replace("ttft_s: 0.1,", "ttft_s: 0.2,"))
    capsys.readouterr()
    assert cli_main([*args, "--only", "*-8"]) == 0
    summary = json.loads((out / "capacity.json").read_text())
    assert [r["setting"] for r in summary["settings"]] == ["fcfs__max_num_seqs-8"]
    # ... and said so, not dropped without a word
    assert [r["setting"] for r in summary["left_out"]] == ["fcfs__max_num_seqs-4"]
    why = summary["left_out"][0]["why"]
    # what changed, not "its definition changed": here the SLO
    assert why.startswith("its search in this folder was made with other settings (changed: ")
    assert "SLO: {'ttft_s': 0.1, 'tpot_s': 0.02} then, {'ttft_s': 0.2, 'tpot_s': 0.02} now" in why
    assert f"not listed: fcfs__max_num_seqs-4: {why}" in capsys.readouterr().err


def test_an_interrupted_capacity_run_keeps_its_probes_listed_and_reportable(
        tmp_path: Path, ctrl_c_on_probe: Callable[[int], list[object]]) -> None:
    """Ctrl-C on the third probe: the two probes done stay in capacity.json and
    scenario.json, so `batchlab report` renders what was measured."""
    ctrl_c_on_probe(3)
    out = tmp_path / "cap"
    code = cli_main(["capacity", "--trace", "synthetic", "--num-requests", "40",
                     "--prompt-tokens", "512", "--output-tokens", "16", "--start", "4",
                     "--slo", "ttft_s=0.1", "--out", str(out)])
    assert code == 130
    summary = json.loads((out / "capacity.json").read_text())
    assert summary["slo"] == {"ttft_s": 0.1}
    [row] = summary["settings"]
    assert row["status"] == "interrupted" and row["num_probes"] == 2
    cells = json.loads((out / "scenario.json").read_text())["cells"]
    assert cells == ["reference/rate-4", "reference/rate-8"]
    assert json.loads((out / "reference" / SEARCH_FILE).read_text())["status"] == "interrupted"
    assert cli_main(["report", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert "| `reference/rate-4` |" in report and "| `reference/rate-8` |" in report
    # what the two probes showed, as a lower bound: the report says it is not the answer
    search = json.loads((out / "reference" / SEARCH_FILE).read_text())
    passed = [p["load"] for p in search["probes"] if p["passed"]]
    row_text = next(line for line in report.split("## Capacity at SLO")[1].splitlines()
                    if line.startswith("| `reference` |"))
    if passed:
        assert f"| ≥ {max(passed):.4g} req/s |" in row_text
    assert "interrupted, `--resume` goes on" in row_text
    assert report.startswith("# Capacity at SLO: reference-capacity")


def test_a_load_range_alone_moves_the_default_start_into_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--min-load / --max-load without --start: the search starts within them, rather than
    refusing a start of 1 req/s nobody typed; an empty --only is refused."""
    base = ["capacity", "--trace", "synthetic", "--num-requests", "40", "--prompt-tokens",
            "512", "--output-tokens", "16", "--slo", "ttft_s=0.1", "--max-probes", "2"]
    assert cli_main([*base, "--min-load", "5", "--max-load", "50",
                     "--out", str(tmp_path / "a")]) == 0
    probes = json.loads((tmp_path / "a" / "reference" / SEARCH_FILE).read_text())["probes"]
    assert probes[0]["load"] == 5
    assert cli_main([*base, "--max-load", "0.5", "--out", str(tmp_path / "b")]) == 0
    probes = json.loads((tmp_path / "b" / "reference" / SEARCH_FILE).read_text())["probes"]
    assert probes[0]["load"] == 0.5
    capsys.readouterr()
    assert cli_main([*base, "--only", "", "--out", str(tmp_path / "c")]) == 2
    assert "--only: give a pattern" in capsys.readouterr().err


class _Killed(BaseException):
    """What a run killed outright leaves behind: nothing after the point it died at."""


def test_a_search_killed_outright_leaves_capacity_json_saying_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rerun into the same --out with other settings and killed after a probe: capacity.json
    says the search is running, with the new SLO, not the earlier search's answer."""
    out = tmp_path / "cap"
    base = ["capacity", "--trace", "synthetic", "--num-requests", "40", "--prompt-tokens",
            "512", "--output-tokens", "16", "--start", "4", "--max-probes", "3",
            "--out", str(out)]
    assert cli_main([*base, "--slo", "ttft_s=0.1"]) == 0
    first = json.loads((out / "capacity.json").read_text())
    assert first["status"] == "finished" and first["settings"][0]["capacity"] is not None
    real_probe = capacity_run.run_probe
    ran: list[float] = []

    def killed_after_one(plan: object, load: float, out_dir: Path, **kw: object) -> ProbeOutcome:
        if ran:
            raise _Killed
        ran.append(load)
        return real_probe(plan, load, out_dir, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(capacity_run, "run_probe", killed_after_one)
    with pytest.raises(_Killed):  # another search: replaced only when asked
        cli_main([*base, "--slo", "ttft_s=0.5", "--overwrite"])
    left = json.loads((out / "capacity.json").read_text())
    assert left["status"] == "running" and left["slo"] == {"ttft_s": 0.5}
    row = left["settings"][0]
    assert row["status"] == "running" and row["num_probes"] == 1 and "capacity" not in row
    cells = json.loads((out / "scenario.json").read_text())["cells"]
    assert cells == [f"reference/rate-{ran[0]:g}"]  # the probe this search made, no other


def test_capacity_json_says_whose_capacity_and_the_log_names_failures(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each row says which engine answered, whether it is a prediction, and to what precision
    it was searched; a probe that failed requests (refused: too little KV space) says so."""
    out = tmp_path / "cap"
    assert cli_main(["capacity", "--trace", str(Path(__file__).resolve().parents[3] / "harness"
                                                / "data" / "azure_conv_excerpt.csv"),
                     "--limit", "60", "--num-gpu-blocks", "120", "--slo", "ttft_s=0.5",
                     "--target", "0.5", "--max-probes", "2", "--out", str(out)]) == 0
    said = capsys.readouterr()
    assert "(7 of 60 requests failed)" in said.err
    assert "a capacity at an SLO is itself a prediction" in said.out
    assert "within TTFT <= 0.5 s" in said.out  # the SLO searched for, on the first line
    row = json.loads((out / "capacity.json").read_text())["settings"][0]
    assert (row["engine"], row["mode"], row["predicted"]) == ("reference", "simulated", True)
    assert row["model"] == "llama-3.1-8b" and row["precision_text"] == "within 5%"
    # what predicted it and how accurate that is, in the command line's words, and why the
    # capacity itself has no measured error
    assert row["prediction"]["text"].startswith("predicted by the reference engine")
    assert row["prediction"]["text"] in said.out
    assert row["prediction"]["capacity_caveat"] in said.out


def test_requests_refused_at_any_load_end_the_search_at_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """54 of 60 prompts can never fit 10 KV blocks: no load reaches 99%, and the search says
    so at its first probe rather than halving the load down to 0.01 req/s."""
    out = tmp_path / "cap"
    assert cli_main(["capacity", "--trace", str(Path(__file__).resolve().parents[3] / "harness"
                                                / "data" / "azure_conv_excerpt.csv"),
                     "--limit", "60", "--num-gpu-blocks", "10", "--slo", "ttft_s=0.5",
                     "--out", str(out)]) == 1
    assert ("54 of 60 requests are refused at any load (they can never fit the KV cache): SLO "
            "attainment cannot reach 99.0%, whatever the load") in capsys.readouterr().out
    search = json.loads((out / "reference" / SEARCH_FILE).read_text())
    assert search["status"] == "failed" and len(search["probes"]) == 0


def test_a_precision_finer_than_the_loads_can_be_named_is_refused(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["capacity", "--trace", "synthetic", "--slo", "ttft_s=0.1",
                     "--precision", "0.00001"]) == 2
    assert "--precision: at least 0.002" in capsys.readouterr().err


def test_an_out_that_is_a_file_is_bad_input(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "afile").write_text("mine\n")
    assert cli_main(["capacity", "--trace", "synthetic", "--num-requests", "10",
                     "--prompt-tokens", "8", "--output-tokens", "4", "--slo", "ttft_s=0.1",
                     "--out", str(tmp_path / "afile")]) == 2
    said = capsys.readouterr()
    assert "a file is there, not a folder" in said.err and "capacity search (" not in said.out
    assert (tmp_path / "afile").read_text() == "mine\n"


def test_a_concurrency_search_on_lengths_only_needs_no_rate(tmp_path: Path) -> None:
    """Users send as they free up: a trace of lengths (ShareGPT) needs no --rate for them."""
    out = tmp_path / "cap"
    assert cli_main(["capacity", "--trace", str(Path(__file__).resolve().parents[3] / "harness"
                                                / "data" / "sharegpt_lengths_excerpt.csv"),
                     "--limit", "40", "--search", "concurrency", "--slo", "ttft_s=0.5",
                     "--max-probes", "2", "--out", str(out)]) == 0
    assert len(json.loads((out / "reference" / SEARCH_FILE).read_text())["probes"]) == 2


def test_a_report_that_fails_keeps_the_searches_and_exits_1(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import harness.report as report_module

    def broken(*args: object, **kwargs: object) -> Path:
        raise ValueError("bottom cannot be >= top")

    monkeypatch.setattr(report_module, "render_scenario_report", broken)
    out = tmp_path / "cap"
    assert cli_main(["capacity", "--trace", "synthetic", "--num-requests", "40",
                     "--prompt-tokens", "512", "--output-tokens", "16", "--slo", "ttft_s=0.1",
                     "--max-probes", "2", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "report.md could not be written: ValueError: bottom cannot be >= top" in err
    assert json.loads((out / "capacity.json").read_text())["status"] == "finished"


def test_refusals_are_judged_over_the_whole_trace_not_a_stopped_part(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """1 refused of the 25 requests sent before an early stop is not "refused at any load":
    of the whole trace, 4 of 400 are, which a 99% target allows."""
    import harness.capacity.probe as probe_module

    class StopsAfter120s:
        def __init__(self, **kwargs: object) -> None:
            pass

        def __call__(self, state: object) -> str | None:
            return "over-saturated: (a test's stop)" if getattr(state, "t_s", 0) > 120 else None

    monkeypatch.setattr(probe_module, "SaturationMonitor", StopsAfter120s)
    out = tmp_path / "cap"
    assert cli_main(["capacity", "--trace", str(Path(__file__).resolve().parents[3] / "harness"
                                                / "data" / "azure_conv_excerpt.csv"),
                     "--limit", "400", "--num-gpu-blocks", "259", "--slo", "ttft_s=5,tpot_s=0.2",
                     "--start", "0.5", "--max-probes", "2", "--out", str(out)]) == 0
    said = capsys.readouterr()
    assert "refused at any load" not in said.out + said.err


def test_what_a_search_records_it_was_made_from_holds_no_secret() -> None:
    """search.json records what its digest digests (``made_from``): the engine's environment
    (a token) is part of the target, and must be digested, never spelled out."""
    from adapters.knobs import Knobs

    spec = TargetSpec("reference", "launch", knobs=Knobs.from_mapping(KNOBS),
                      engine_env={"HF_TOKEN": "hf_SUPERSECRETVALUE123"})
    made = single_setting(spec, name="fcfs", trace_path="synthetic", trace_options=TRACE,
                          kind="rate", target=0.99, slo=SLO, knobs=KNOBS).plan
    assert "hf_SUPERSECRETVALUE123" not in json.dumps(dict(made.made_from), default=str)
    other = single_setting(TargetSpec("reference", "launch", knobs=Knobs.from_mapping(KNOBS),
                                      engine_env={"HF_TOKEN": "another"}),
                           name="fcfs", trace_path="synthetic", trace_options=TRACE,
                           kind="rate", target=0.99, slo=SLO, knobs=KNOBS).plan
    assert other.digest != made.digest  # still part of what decides reuse


@pytest.mark.parametrize(("extra", "said"), [
    (["--min-load", "50", "--max-load", "5"], "--min-load 50 is above --max-load 5"),
    (["--search", "concurrency", "--max-load", "2.5"],
     "--max-load: whole numbers of users for a concurrency search"),
])
def test_a_load_range_that_cannot_be_searched_names_its_own_flags(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str],
        said: str) -> None:
    assert cli_main(["capacity", "--trace", "synthetic", "--num-requests", "10",
                     "--prompt-tokens", "8", "--output-tokens", "4", "--slo", "ttft_s=0.1",
                     *extra, "--out", str(tmp_path / "cap")]) == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "cap").exists()


def test_an_out_that_cannot_be_made_is_refused_before_the_search(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "afile").write_text("mine\n")
    base = ["capacity", "--trace", "synthetic", "--num-requests", "10", "--prompt-tokens", "8",
            "--output-tokens", "4", "--slo", "ttft_s=0.1"]
    assert cli_main([*base, "--out", str(tmp_path / "afile" / "sub")]) == 2
    said = capsys.readouterr()
    assert "is a file, not a folder" in said.err and "capacity search (" not in said.out
    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "reference").write_text("mine\n")  # where setting reference's goes
    assert cli_main([*base, "--out", str(tmp_path / "k")]) == 2
    assert "reference is a file there" in capsys.readouterr().err
    assert (tmp_path / "k" / "reference").read_text() == "mine\n"
