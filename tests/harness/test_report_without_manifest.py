"""A run folder whose manifest.json is gone (deleted, never copied) is reported from what is
left, and the report claims nothing the manifest alone could say.

It used to say "not applicable: every cell was simulated" of a live run, "every knob was
applied as given" of knobs nobody recorded, and nothing of the run having been interrupted,
which its summary.json still said."""

from __future__ import annotations

import json
from pathlib import Path

from harness.cli import main

REPO = Path(__file__).resolve().parents[2]
EXCERPT = REPO / "harness" / "data" / "azure_conv_excerpt.csv"


def test_a_run_without_its_manifest_says_what_is_not_known(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert main(["simulate", "--trace", str(EXCERPT), "--limit", "20", "--no-report",
                 "--out", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    summary.update(status="interrupted", num_not_sent=12)
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "manifest.json").unlink()
    (run / "steps.parquet").unlink()  # nothing left that says it was simulated
    assert main(["report", str(run)]) == 0
    text = (run / "report.md").read_text()
    assert "every cell was simulated" not in text
    assert "record no mode (no manifest.json)" in text or "records no mode" in text
    assert "every knob was applied as given" not in text
    assert "no manifest.json records how the knobs were applied" in text
    assert "did not run to its end: interrupted (Ctrl-C or SIGTERM); 12 requests of the " \
           "trace were never sent" in text


def test_summarize_without_the_manifest_keeps_what_only_the_summary_knew(
        tmp_path: Path) -> None:
    """summarize of such a folder took the old summary for another run's (its run_id is not
    the missing manifest's) and dropped how the run ended and how much of its trace it sent;
    and it replaced a live run's "not known" preemption count by 0."""
    run = tmp_path / "run"
    assert main(["simulate", "--trace", str(EXCERPT), "--limit", "20", "--no-report",
                 "--out", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    summary.update(status="interrupted", num_planned=32, num_not_sent=12,
                   num_preemptions=None)
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "manifest.json").unlink()
    assert main(["summarize", str(run)]) == 0
    rebuilt = json.loads((run / "summary.json").read_text())
    assert (rebuilt["status"], rebuilt["num_planned"], rebuilt["num_not_sent"]) == (
        "interrupted", 32, 12)
    assert rebuilt["num_preemptions"] is None
    assert rebuilt["num_requests"] == 20


def test_a_run_killed_before_its_summary_is_reported_as_such(tmp_path: Path) -> None:
    """A folder with only its manifest (a run killed before it wrote anything else) was "not
    a run folder" to `batchlab report` (exit 2), while `compare` said how it ended."""
    run = tmp_path / "killed"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"kind": "live", "status": "running",
                                                    "run_id": "a" * 32}))
    assert main(["report", str(run)]) == 0
    text = (run / "report.md").read_text()
    assert ("`killed` did not finish: killed before it could say so (no process writes it "
            "now)") in text


def test_a_run_another_process_writes_is_said_to_be_still_running(tmp_path: Path) -> None:
    """Its manifest says running and another process holds its folder: not called killed."""
    import subprocess
    import sys

    from harness.report.runs import load_run

    run = tmp_path / "running"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"kind": "live", "status": "running",
                                                    "run_id": "a" * 32}))
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from harness.runfolder import hold_dir; "
         f"hold_dir({str(run)!r}); print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        reason = load_run(run).reason
        assert reason == f"still running (another batchlab process (pid {holder.pid}) writes it)"
    finally:
        holder.communicate("")
    assert load_run(run).reason == "killed before it could say so (no process writes it now)"
