"""Sweeps: every cell into its folder, failed cells recorded, resume after a kill, Ray, demo."""

from __future__ import annotations

import io
import json
import shutil
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from harness import scenario as sc
from harness.cli import main
from harness.report import render_scenario_report

REPO = Path(__file__).resolve().parent.parent.parent
SMALL = REPO / "tests" / "data" / "scenario_small.yaml"
NUM_REQUESTS = 40  # scenario_small.yaml's trace limit


def quiet() -> sc.SweepProgress:
    return sc.SweepProgress(4, stream=io.StringIO(), tty=False)


class Recorder:
    """Wraps the real cell runner: counts runs per cell, and can break one cell."""

    def __init__(self, *, fail: str | None = None, kill: str | None = None) -> None:
        self.calls: list[str] = []
        self.fail = fail
        self.kill = kill

    def __call__(self, job: sc.CellJob, out_dir: Path, progress: sc.ProgressFn
                 ) -> Mapping[str, Any]:
        name = job.cell.name
        self.calls.append(name)
        if name == self.fail:
            raise RuntimeError("engine would not start: simulated failure")
        summary = sc.run_cell(job, out_dir, progress)
        if name == self.kill:
            # Killed mid-cell: half of the rows on disk, then the process stops.
            table = pq.read_table(out_dir / "requests.parquet")
            pq.write_table(table.slice(0, table.num_rows // 2), out_dir / "requests.parquet")
            (out_dir / "summary.json").unlink()
            raise KeyboardInterrupt
        return summary


def mtimes(scenario_dir: Path, cell: str) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in sorted((scenario_dir / cell).iterdir())}


def test_sweep_writes_every_cell_and_the_report(tmp_path: Path) -> None:
    scenario = sc.load_scenario(SMALL)
    result = sc.run_scenario(scenario, tmp_path, progress=quiet())
    assert [o.state for o in result.outcomes] == ["done"] * 4
    for cell in scenario.cells():
        d = tmp_path / "small" / cell.name
        assert sc.read_status(d)["state"] == "done"
        assert pq.read_metadata(d / "requests.parquet").num_rows == NUM_REQUESTS
        manifest = json.loads((d / "manifest.json").read_text())
        assert manifest["command"] == ["batchlab", "run", "tests/data/scenario_small.yaml",
                                       "--out", str(tmp_path), "--only", cell.name]
        assert manifest["knobs"]["max_num_seqs"] == cell.knobs.max_num_seqs
    assert result.report == tmp_path / "small" / "report.md"
    text = result.report.read_text()
    assert "the output tokens/s of `static__max_num_seqs-4`" in text
    assert "### Class interactive (priority 0)" in text
    meta = json.loads((tmp_path / "small" / "scenario.json").read_text())
    assert meta["cells"] == [c.name for c in scenario.cells()]


def test_failed_cell_is_recorded_and_the_sweep_goes_on(tmp_path: Path) -> None:
    scenario = sc.load_scenario(SMALL)
    broken = "static__max_num_seqs-8"
    runner = Recorder(fail=broken)
    result = sc.run_scenario(scenario, tmp_path, runner=runner, progress=quiet())
    assert len(runner.calls) == 4
    states = {o.name: o.state for o in result.outcomes}
    assert states[broken] == "failed" and list(states.values()).count("done") == 3
    status = sc.read_status(tmp_path / "small" / broken)
    assert status["state"] == "failed"
    assert status["reason"] == "RuntimeError: engine would not start: simulated failure"
    assert "Traceback" in (tmp_path / "small" / broken / "error.txt").read_text()
    assert result.report is not None
    assert (f"`{broken}` did not finish: RuntimeError: engine would not start"
            in result.report.read_text())

    # Resume redoes only the failed cell.
    again = Recorder()
    sc.run_scenario(scenario, tmp_path, resume=True, runner=again, progress=quiet(),
                    write_report=False)
    assert again.calls == [broken]
    assert sc.read_status(tmp_path / "small" / broken)["attempt"] == 2


def test_resume_after_a_kill_mid_cell(tmp_path: Path) -> None:
    scenario = sc.load_scenario(SMALL)
    names = [c.name for c in scenario.cells()]
    killed = names[2]
    first = Recorder(kill=killed)
    with pytest.raises(KeyboardInterrupt):
        sc.run_scenario(scenario, tmp_path, runner=first, progress=quiet())
    sdir = tmp_path / "small"
    assert first.calls == names[:3]
    # the cell says it was stopped; one a SIGKILL stopped cannot, and is left "running"
    assert [sc.read_status(sdir / n).get("state") for n in names] == [
        "done", "done", "interrupted", None]
    # the interrupted sweep wrote its report of what finished, and of what did not
    assert (f"`{killed}` did not finish: stopped by Ctrl-C or SIGTERM"
            in (sdir / "report.md").read_text())
    report = render_scenario_report(sdir).read_text()
    assert (f"`{killed}` did not finish: stopped by Ctrl-C or SIGTERM before it finished "
            "(--resume runs it again).") in report
    status = sc.read_status(sdir / killed)
    del status["reason"], status["finished_at"]  # what the cell's start wrote
    (sdir / killed / "status.json").write_text(json.dumps({**status, "state": "running"}))
    assert (f"`{killed}` did not finish: killed before it could say so (no process writes "
            "it now) (--resume runs it again).") in render_scenario_report(sdir).read_text()
    before = {n: mtimes(sdir, n) for n in names[:2]}

    second = Recorder()
    result = sc.run_scenario(scenario, tmp_path, resume=True, runner=second, progress=quiet())
    assert second.calls == names[2:], "no finished cell is run again"
    assert {n: mtimes(sdir, n) for n in names[:2]} == before
    assert [o.state for o in result.outcomes] == ["skipped", "skipped", "done", "done"]
    for n in names:
        assert sc.read_status(sdir / n)["state"] == "done"
        assert pq.read_metadata(sdir / n / "requests.parquet").num_rows == NUM_REQUESTS, n
    assert "did not finish" not in (sdir / "report.md").read_text()


def test_resume_redoes_a_cell_whose_definition_changed(tmp_path: Path) -> None:
    scenario = sc.load_scenario(SMALL)
    sc.run_scenario(scenario, tmp_path, only="static__max_num_seqs-4", progress=quiet())
    changed = tmp_path / "changed.yaml"
    changed.write_text(SMALL.read_text().replace("ttft_s: 1.0", "ttft_s: 2.0"))
    runner = Recorder()
    sc.run_scenario(sc.load_scenario(changed), tmp_path, only="static__max_num_seqs-4",
                    resume=True, runner=runner, progress=quiet())
    assert runner.calls == ["static__max_num_seqs-4"]


def test_a_cell_left_from_an_earlier_definition_is_flagged_in_the_report(
        tmp_path: Path) -> None:
    """Last night's cells stay on disk when --only runs others: the report says which were
    made from a definition the scenario no longer has, and drops the flag once re-run."""
    sc.run_scenario(sc.load_scenario(SMALL), tmp_path, progress=quiet())
    changed = tmp_path / "changed.yaml"
    changed.write_text(SMALL.read_text().replace(
        "{policy: fcfs, max_model_len: 8192, max_num_batched_tokens: 8192}",
        "{policy: fcfs, max_model_len: 8192, max_num_batched_tokens: 4096}"))
    sc.run_scenario(sc.load_scenario(changed), tmp_path, only="static*", progress=quiet())
    findings = (tmp_path / "small" / "report.md").read_text().split("## Key findings")[1]
    flagged = next(line for line in findings.splitlines() if "earlier definition" in line)
    assert flagged.startswith("- `continuous__max_num_seqs-4`, `continuous__max_num_seqs-8` "
                              "were run from an earlier definition")
    sc.run_scenario(sc.load_scenario(changed), tmp_path, resume=True, progress=quiet())
    assert "earlier definition" not in (tmp_path / "small" / "report.md").read_text()


def test_an_interrupted_sweep_leaves_no_report_of_the_last_one(tmp_path: Path) -> None:
    """A sweep stopped before any cell finished: the last sweep's report.md, which describes
    results this one replaces, is not left to be read as this one's."""
    scenario = sc.load_scenario(SMALL)
    sc.run_scenario(scenario, tmp_path, progress=quiet())
    sdir = tmp_path / "small"
    first = sc.load_scenario(SMALL).cells()[0].name
    with pytest.raises(KeyboardInterrupt):
        sc.run_scenario(scenario, tmp_path, runner=Recorder(kill=first), progress=quiet())
    report = (sdir / "report.md").read_text()
    assert f"`{first}` did not finish" in report


def test_only_runs_matching_cells_and_reports_the_rest_as_not_run(tmp_path: Path) -> None:
    scenario = sc.load_scenario(SMALL)
    runner = Recorder()
    result = sc.run_scenario(scenario, tmp_path, only="continuous*", runner=runner,
                             progress=quiet())
    assert runner.calls == ["continuous__max_num_seqs-4", "continuous__max_num_seqs-8"]
    assert [o.state for o in result.outcomes] == ["not_run", "not_run", "done", "done"]
    assert result.report is not None
    text = result.report.read_text()
    assert "2 cells not run" in text
    # running it again runs the same cells, never the ones --only left out
    rerun = text.split("Run it again:", 1)[1].split("```sh\n", 1)[1].split("\n", 1)[0]
    assert rerun.endswith("--only 'continuous*'"), rerun
    with pytest.raises(sc.ScenarioError, match="no cell matches"):
        sc.run_scenario(scenario, tmp_path, only="nothing*", progress=quiet())


def test_live_cell_whose_engine_will_not_start_fails_cleanly(tmp_path: Path) -> None:
    path = tmp_path / "live.yaml"
    path.write_text(textwrap.dedent("""\
        name: live
        question: Does a sweep survive an engine that will not start?
        trace: {path: azure_conv_excerpt.csv, limit: 10}
        model: llama-3.1-8b
        gpu: h100-sxm
        engines:
          - {name: reference, engine: reference}
          - name: vllm
            engine: vllm
            executable: /nonexistent/bin/vllm
            ready_timeout_s: 5
    """))
    result = sc.run_scenario(sc.load_scenario(path), tmp_path / "out", progress=quiet())
    states = {o.name: (o.state, o.reason) for o in result.outcomes}
    assert states["reference"] == ("done", "")
    assert states["vllm"][0] == "failed"
    assert "EngineStartError" in states["vllm"][1]
    assert result.report is not None
    text = result.report.read_text()
    assert "`vllm` did not finish: EngineStartError" in text
    assert "`--max-num-seqs 256`" in text  # the planned flags are still shown


def test_progress_lines_when_not_a_terminal() -> None:
    stream = io.StringIO()
    progress = sc.SweepProgress(2, stream=stream, tty=False, interval_s=0)
    progress.start_cell("a", 10)
    progress.requests(5, 10)
    progress.finish_cell("a", "done")
    progress.skip_cell("b", "finished earlier")
    lines = stream.getvalue().splitlines()
    assert lines[0] == "[0/2] a: started (10 requests)"
    assert lines[1].startswith("[0/2] a: 5/10 requests, ") and "ETA" in lines[1]
    assert lines[2].startswith("[1/2] a: done in ")
    assert lines[3] == "[2/2] b: skipped (finished earlier)"


def test_cli_run_list_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(SMALL), "--list", "--only", "static*"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in out] == ["static__max_num_seqs-4",
                                                     "static__max_num_seqs-8"]
    bad = REPO / "tests" / "data" / "scenario_bad_key.yaml"
    assert main(["run", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:9: engines[0].knobs.max_num_seq: unknown key; did you mean" in err


def test_make_demo_runs_quickstart_and_prints_the_report(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What `make demo` runs: the quickstart scenario, then the report's path."""
    makefile = (REPO / "Makefile").read_text()
    assert "$(BIN)/batchlab run scenarios/quickstart.yaml" in makefile
    assert main(["run", str(REPO / "scenarios" / "quickstart.yaml"),
                 "--out", str(tmp_path)]) == 0
    report = tmp_path / "quickstart" / "report.md"
    assert f"report: {report}" in capsys.readouterr().out
    text = report.read_text()
    findings = text.split("## Key findings")[1].split("## Cells")[0]
    assert "of `static`" in findings and "TTFT p90 fell from" in findings
    # static's 524,288-token step budget reserves activation memory: its KV cache is smaller,
    # and each comparison with it says so
    assert ("(its KV cache holds 4.9× the tokens of `static`'s, 450,736 against 91,696: part "
            "of the difference may be memory, not scheduling)") in findings
    for png in ("latency_cdf.png", "engine_state.png", "throughput.png"):
        assert (tmp_path / "quickstart" / png).exists()


@pytest.mark.ray
def test_ray_runs_two_simulated_cells(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    scenario = sc.load_scenario(SMALL)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        result = sc.run_scenario(scenario, tmp_path, only="continuous*", use_ray=True,
                                 progress=quiet())
    finally:
        ray.shutdown()
    done = [o for o in result.outcomes if o.state == "done"]
    assert [o.name for o in done] == ["continuous__max_num_seqs-4", "continuous__max_num_seqs-8"]
    for o in done:
        d = tmp_path / "small" / o.name
        assert sc.read_status(d)["state"] == "done"
        assert pq.read_metadata(d / "requests.parquet").num_rows == NUM_REQUESTS
        assert (d / "steps.parquet").exists() and (d / "manifest.json").exists()
    assert result.report is not None and result.report.exists()
    # The same cells run locally give the same results (the simulation is deterministic).
    local = tmp_path / "local"
    sc.run_scenario(scenario, local, only="continuous*", progress=quiet())
    for o in done:
        ray_summary = json.loads((tmp_path / "small" / o.name / "summary.json").read_text())
        local_summary = json.loads((local / "small" / o.name / "summary.json").read_text())
        for s in (ray_summary, local_summary):
            s.pop("simulation_wall_s", None)
            s.pop("run_id", None)  # each run has its own
        assert ray_summary == local_summary
    shutil.rmtree(local)


def test_a_run_refused_before_any_cell_leaves_the_folder_as_it_was(tmp_path: Path) -> None:
    """A changed scenario whose trace cannot be read is refused before anything is written: the
    definition of the results already in the folder is not replaced by the refused one."""
    sc.run_scenario(sc.load_scenario(SMALL), tmp_path, only="static*", progress=quiet())
    before = (tmp_path / "small" / "scenario.json").read_bytes()
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                   "2023-11-16 18:15:46.6805900,374,abc\n")
    changed = tmp_path / "small.yaml"
    changed.write_text(SMALL.read_text()
                       .replace("question: Does continuous", "question: CHANGED. Does continuous")
                       .replace("path: azure_conv_excerpt.csv", f"path: {bad}"))
    with pytest.raises(sc.ScenarioError, match="GeneratedTokens"):
        sc.run_scenario(sc.load_scenario(changed), tmp_path, progress=quiet())
    assert (tmp_path / "small" / "scenario.json").read_bytes() == before
    # nor is a folder made for a scenario refused on its first run
    with pytest.raises(sc.ScenarioError, match="GeneratedTokens"):
        sc.run_scenario(sc.load_scenario(changed), tmp_path / "fresh", progress=quiet())
    assert not (tmp_path / "fresh").exists()


def test_a_cell_that_served_nothing_fails_with_its_first_error_and_is_run_again(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every request rejected (a KV cache of one block): the cell's files are on disk, but it
    measured nothing, so it is failed with the engine's words, and --resume runs it again."""
    path = tmp_path / "small.yaml"
    path.write_text(SMALL.read_text().replace(
        "  - name: continuous\n    engine: reference\n",
        "  - name: continuous\n    engine: reference\n    num_gpu_blocks: 1\n"))
    scenario = sc.load_scenario(path)
    result = sc.run_scenario(scenario, tmp_path, only="continuous__max_num_seqs-4",
                             progress=quiet())
    [outcome] = [o for o in result.outcomes if o.state != "not_run"]
    assert outcome.state == "failed"
    assert outcome.reason.startswith(f"NothingServed: none of the {NUM_REQUESTS} requests "
                                     f"completed (rejected {NUM_REQUESTS}); the first: request ")
    assert "needs" in outcome.reason and "the KV cache has only 1" in outcome.reason
    cell_dir = tmp_path / "small" / "continuous__max_num_seqs-4"
    assert (cell_dir / "requests.parquet").exists()  # what it did is kept
    report = (tmp_path / "small" / "report.md").read_text()
    assert "`continuous__max_num_seqs-4` failed: none of the 40 requests" in report
    assert "| failed: none of the 40 requests completed" in report  # the cells table
    again = sc.run_scenario(scenario, tmp_path, only="continuous__max_num_seqs-4", resume=True,
                            progress=quiet())
    assert [o.state for o in again.outcomes if o.state != "not_run"] == ["failed"]


def test_a_simulation_that_served_nothing_exits_1(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    excerpt = REPO / "harness" / "data" / "azure_conv_excerpt.csv"
    assert main(["simulate", "--trace", str(excerpt), "--limit", "5", "--num-gpu-blocks", "1",
                 "--no-report", "--out", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert "error: none of the 5 requests completed (rejected 5); the first: request " in err
    assert (tmp_path / "run" / "summary.json").exists()


def test_an_interrupted_sweep_says_how_to_render_and_resume(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*_args: Any, **_kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(sc, "run_scenario", interrupted)
    assert main(["run", str(SMALL), "--out", str(tmp_path)]) == 130
    err = capsys.readouterr().err
    assert (f"interrupted; the cells that finished are in {tmp_path / 'small'}/: `batchlab "
            f"report {tmp_path / 'small'}` renders them, and the same command with --resume "
            "runs the others") in err


def test_the_command_refused_before_any_cell_makes_no_folder(tmp_path: Path) -> None:
    assert main(["run", str(SMALL), "--only", "zzz", "--out", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()


def test_a_cell_whose_engine_would_reject_requests_as_too_long_is_refused_first(
        tmp_path: Path) -> None:
    """The engine's max_model_len (a knob) is below some requests of the trace, which sets
    none of its own: they would be rejected, whatever on_too_long says. Refused before any cell
    runs, with what to write instead."""
    path = tmp_path / "s.yaml"
    path.write_text(SMALL.read_text().replace("max_model_len: 8192", "max_model_len: 1024"))
    with pytest.raises(sc.ScenarioError, match=r"cell static__max_num_seqs-4: \d+ of 40 requests "
                                               r"of its trace need more than its engine's "
                                               r"max_model_len \(1024; first: request "):
        sc.run_scenario(sc.load_scenario(path), tmp_path, progress=quiet())
    assert not (tmp_path / "small").exists()
    path.write_text(path.read_text().replace(
        "  limit: 40\n", "  limit: 40\n  on_too_long: drop\n  max_model_len: 1024\n"))
    result = sc.run_scenario(sc.load_scenario(path), tmp_path, only="static*",
                             progress=quiet())
    assert all(o.state in ("done", "not_run") for o in result.outcomes)


def test_a_sweep_warns_of_each_cell_that_fell_behind(tmp_path: Path) -> None:
    """As simulate warns of its run, a sweep warns of each cell whose engine fell behind its
    arrivals, as it finishes; the report's key findings say the same."""
    stream = io.StringIO()
    sc.run_scenario(sc.load_scenario(SMALL), tmp_path,
                    progress=sc.SweepProgress(4, stream=stream, tty=False))
    warned = [ln for ln in stream.getvalue().splitlines() if ln.startswith("warning: ")]
    findings = (tmp_path / "small" / "report.md").read_text().split("## Key findings")[1]
    said = findings.split("fell behind their arrivals")[1].split("\n- ")[0]
    behind = [c.name for c in sc.load_scenario(SMALL).cells()
              if f"`{c.name}` (completed" in said or f"`{c.name}` " in said]
    assert behind  # the static cells of this scenario cannot keep up
    assert [ln.split(":")[1].strip() for ln in warned] == behind
    assert all("the engine fell behind its arrivals, so TTFT and E2E are those of this "
               "trace's length" in ln and "over the second half of them it completed" in ln
               for ln in warned)


def test_the_roofline_is_said_of_the_cell_that_runs_the_largest_batch(tmp_path: Path) -> None:
    """A batch-size sweep: the roofline paragraph speaks of the largest batch any cap runs,
    not of the first cell's (a cap of 1 is no roofline's limit)."""
    path = tmp_path / "caps.yaml"
    path.write_text(textwrap.dedent("""\
        name: caps
        question: How does the batch cap change throughput?
        trace: {path: azure_conv_excerpt.csv, limit: 40, time_scale: 0.25}
        model: llama-3.1-8b
        gpu: h100-sxm
        engines:
          - {name: fcfs, engine: reference, knobs: {policy: fcfs}}
        grid:
          max_num_seqs: [1, 4, 16]
        """))
    sc.run_scenario(sc.load_scenario(path), tmp_path, progress=quiet())
    roofline = next(ln for ln in (tmp_path / "caps" / "report.md").read_text().splitlines()
                    if ln.startswith("Roofline"))
    assert "the largest batch it runs, 16 (its max_num_seqs; the KV cache holds" in roofline


def test_max_failed_fails_a_run_that_served_some_and_failed_more(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A nightly gate on failures: --max-failed on simulate and run exits 1 when more than the
    fraction failed (the run is kept), 0 within it, as replay --max-failed does."""
    excerpt = REPO / "harness" / "data" / "azure_conv_excerpt.csv"
    args = ["simulate", "--trace", str(excerpt), "--limit", "50", "--num-gpu-blocks", "60",
            "--no-report"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0  # some served: no gate asked
    assert main([*args, "--max-failed", "0.05", "--out", str(tmp_path / "b")]) == 1
    assert "error: 10 of 50 requests failed (20.0%), more than --max-failed 0.05" \
        in capsys.readouterr().err
    assert (tmp_path / "b" / "summary.json").exists()
    assert main([*args, "--max-failed", "0.5", "--out", str(tmp_path / "c")]) == 0
    scenario = tmp_path / "s.yaml"
    scenario.write_text(textwrap.dedent(f"""\
        name: tight
        question: Does a tiny KV cache reject long prompts?
        trace: {{path: {excerpt}, limit: 50}}
        model: llama-3.1-8b
        gpu: h100-sxm
        engines:
          - {{name: tiny, engine: reference, num_gpu_blocks: 60}}
          - {{name: roomy, engine: reference}}
        """))
    run = ["run", str(scenario), "--out", str(tmp_path / "sweep")]
    assert main(run) == 0
    capsys.readouterr()
    assert main([*run, "--resume", "--max-failed", "0.05"]) == 1
    err = capsys.readouterr().err
    assert "cell tiny: 10 of 50 requests failed (20.0%), more than --max-failed 0.05" in err
    assert "cell roomy" not in err


def test_a_bad_ray_address_is_bad_input_not_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--ray ADDRESS` that Ray cannot parse: exit 2, one line naming --ray, no cell run."""
    pytest.importorskip("ray")
    assert main(["run", str(SMALL), "--only", "continuous*", "--out", str(tmp_path),
                 "--ray", "bad address"]) == 2
    err = capsys.readouterr().err
    assert "--ray: cannot start or join the Ray cluster at 'bad address'" in err
    assert "Traceback" not in err
    assert not list((tmp_path / "small").glob("continuous*/summary.json"))
