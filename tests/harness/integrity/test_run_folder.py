"""A run folder belongs to one run: another run's folder is refused unless --overwrite (then
emptied first), and every file batchlab writes there carries the run's id."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from harness.cli import main as cli_main
from harness.live.recorder import RECORDS_FILE, records_run_id
from harness.runfolder import LOCK_FILE, MARKERS, RunDirError, RunIdentity, claim_run_dir

SIM = RunIdentity("simulated", "a" * 64, engine="reference")
LIVE = RunIdentity("live", "a" * 64, target="http://127.0.0.1:1")


def test_claim_an_empty_or_new_folder_writes_the_run_id(tmp_path: Path) -> None:
    run_id = claim_run_dir(tmp_path / "new", SIM)
    manifest = json.loads((tmp_path / "new" / "manifest.json").read_text())
    assert manifest["run_id"] == run_id and len(run_id) == 32
    assert manifest["identity"] == SIM.as_dict()


def test_another_runs_folder_is_refused_unless_overwrite(tmp_path: Path) -> None:
    claim_run_dir(tmp_path, SIM)
    (tmp_path / "requests.parquet").write_bytes(b"old")
    for other in (LIVE, RunIdentity("simulated", "b" * 64, engine="reference"),
                  RunIdentity("live", "a" * 64, engine="vllm")):
        with pytest.raises(RunDirError, match=r"holds another run.*--overwrite"):
            claim_run_dir(tmp_path, other)
    assert (tmp_path / "requests.parquet").exists()  # nothing was touched
    (tmp_path / "notes.txt").write_text("mine")  # the user's own: refused even with --overwrite
    with pytest.raises(RunDirError, match=r"batchlab did not write \(notes.txt\)"):
        claim_run_dir(tmp_path, LIVE, overwrite=True)
    assert (tmp_path / "notes.txt").read_text() == "mine"
    (tmp_path / "notes.txt").unlink()
    claim_run_dir(tmp_path, LIVE, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([LOCK_FILE, "manifest.json"])


def test_the_same_run_again_replaces_the_old_files_only(tmp_path: Path) -> None:
    first = claim_run_dir(tmp_path, SIM)
    for name in ("requests.parquet", "summary.json", "vllm-server.stdout.log", "records.jsonl"):
        (tmp_path / name).write_text("old")
    second = claim_run_dir(tmp_path, SIM)
    assert second != first
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([LOCK_FILE, "manifest.json"])
    (tmp_path / "notes.txt").write_text("the user's own file")  # not batchlab's: refused
    with pytest.raises(RunDirError, match=r"batchlab did not write \(notes.txt\)"):
        claim_run_dir(tmp_path, SIM)


def test_foreign_files_are_refused_even_with_overwrite(tmp_path: Path) -> None:
    (tmp_path / "thesis.tex").write_text("do not delete")
    (tmp_path / "sub").mkdir()
    with pytest.raises(RunDirError, match=r"batchlab did not write \(sub/, thesis.tex\)"):
        claim_run_dir(tmp_path, SIM, overwrite=True)
    assert (tmp_path / "thesis.tex").exists()


def test_a_scenario_cells_markers_are_kept(tmp_path: Path) -> None:
    for name in MARKERS:
        (tmp_path / name).write_text("{}")
    claim_run_dir(tmp_path, SIM)
    assert {p.name for p in tmp_path.iterdir()} >= MARKERS


def test_simulate_into_a_replay_folder_then_summarize(tmp_path: Path, loopback: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Issue case: `simulate` into an earlier replay's folder, then `summarize`, rebuilt the
    summary from the replay's records.jsonl (3 requests instead of 200)."""
    out = tmp_path / "run"
    small = ["--trace", "synthetic", "--num-requests", "3", "--rate", "20", "--prompt-tokens",
             "8", "--output-tokens", "4"]
    assert cli_main(["replay", "--target", loopback, *small, "--out", str(out)]) == 0
    assert (out / RECORDS_FILE).exists()
    big = ["--trace", "synthetic", "--num-requests", "200", "--rate", "20",
           "--prompt-tokens", "8", "--output-tokens", "4", "--out", str(out)]
    capsys.readouterr()
    assert cli_main(["simulate", *big]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "holds another run" in err and "--overwrite" in err
    assert cli_main(["simulate", *big, "--overwrite"]) == 0
    assert not (out / RECORDS_FILE).exists()
    assert cli_main(["summarize", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_requests"] == 200
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["kind"] == "simulated" and summary["run_id"] == manifest["run_id"]
    for name in ("requests.parquet", "chunks.parquet", "steps.parquet"):
        metadata = pq.read_schema(out / name).metadata
        assert metadata[b"batchlab.run_id"].decode() == manifest["run_id"], name


def test_summarize_ignores_records_of_another_run(tmp_path: Path, loopback: str) -> None:
    """A records.jsonl whose header names another run (copied in, or left by an older
    batchlab) is not the folder's record: the parquet files are."""
    replayed, simulated = tmp_path / "replayed", tmp_path / "simulated"
    small = ["--trace", "synthetic", "--num-requests", "3", "--rate", "20", "--prompt-tokens",
             "8", "--output-tokens", "4"]
    assert cli_main(["replay", "--target", loopback, *small, "--out", str(replayed)]) == 0
    assert cli_main(["simulate", "--trace", "synthetic", "--num-requests", "50", "--rate",
                     "20", "--prompt-tokens", "8", "--output-tokens", "4",
                     "--out", str(simulated)]) == 0
    (simulated / RECORDS_FILE).write_bytes((replayed / RECORDS_FILE).read_bytes())
    assert cli_main(["summarize", str(simulated)]) == 0
    assert json.loads((simulated / "summary.json").read_text())["num_requests"] == 50


def test_a_live_runs_files_all_carry_its_run_id(tmp_path: Path, loopback: str) -> None:
    out = tmp_path / "run"
    assert cli_main(["replay", "--target", loopback, "--trace", "synthetic", "--num-requests",
                     "4", "--rate", "20", "--prompt-tokens", "8", "--output-tokens", "4",
                     "--out", str(out)]) == 0
    run_id = json.loads((out / "manifest.json").read_text())["run_id"]
    assert json.loads((out / "summary.json").read_text())["run_id"] == run_id
    assert records_run_id(out / RECORDS_FILE) == run_id
    for name in ("requests.parquet", "chunks.parquet"):
        assert pq.read_schema(out / name).metadata[b"batchlab.run_id"].decode() == run_id


def test_replay_into_an_engine_runs_folder_keeps_nothing_of_it(tmp_path: Path, loopback: str,
                                                                bl: type) -> None:
    """Issue case: a replay into an earlier `--engine` run's folder kept the old engine,
    knobs and telemetry in the manifest, so the report credited the wrong engine."""
    out = tmp_path / "run"
    launched = bl.run("replay", "--engine", "reference", "--launch", *bl.SMALL_TRACE,
                      "--max-num-seqs", "4", "--out", str(out))
    assert launched.returncode == 0, launched.stderr
    assert (out / "telemetry.parquet").exists()
    first = bl.read_json(out / "manifest.json")
    assert first["engine"]["name"] == "reference" and first["knobs"]["max_num_seqs"] == 4
    for name in ("telemetry.parquet", "requests.parquet"):
        assert pq.read_schema(out / name).metadata[b"batchlab.run_id"].decode() == \
            first["run_id"], name
    plain = ["replay", "--target", loopback, "--trace", "synthetic", "--num-requests", "3",
             "--rate", "20", "--prompt-tokens", "8", "--output-tokens", "4", "--out", str(out)]
    refused = bl.run(*plain)
    assert refused.returncode == 2
    assert "holds another run (a live run of reference" in refused.stderr
    assert bl.read_json(out / "manifest.json")["run_id"] == first["run_id"]  # untouched
    replaced = bl.run(*plain, "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    manifest = bl.read_json(out / "manifest.json")
    assert manifest["run_id"] != first["run_id"]
    for stale in ("engine", "knobs", "mapping", "launch", "telemetry"):
        assert stale not in manifest, stale
    assert sorted(p.name for p in out.iterdir()) == [
        "chunks.parquet", "manifest.json", "records.jsonl", "requests.parquet", "summary.json"]


EXCERPT = Path(__file__).resolve().parents[3] / "harness" / "data" / "azure_conv_excerpt.csv"


def test_simulate_or_replay_into_a_scenario_cell_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A cell's cell.json would describe results it did not produce."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: s\nquestion: q\ntrace: {path: azure_conv_excerpt.csv, limit: 20}\n"
                        "model: llama-3.1-8b\ngpu: h100-sxm\n"
                        "engines:\n  - {name: fcfs, engine: reference}\n")
    assert cli_main(["run", str(scenario), "--out", str(tmp_path)]) == 0
    cell = tmp_path / "s" / "fcfs"
    before = {p.name: p.read_bytes() for p in cell.iterdir() if p.is_file()}
    for command in (["simulate", "--trace", str(EXCERPT), "--limit", "20"],
                    ["replay", "--target", "http://127.0.0.1:9", "--trace", str(EXCERPT),
                     "--limit", "20"]):
        assert cli_main([*command, "--out", str(cell), "--overwrite"]) == 2
        assert "is a cell of a scenario or capacity search" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in cell.iterdir() if p.is_file()} == before


@pytest.mark.parametrize("where", ["simulate", "write"])
def test_a_simulation_that_fails_or_is_interrupted_says_so_in_its_manifest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    import harness.sim.run as sim_run

    def broken(*args: object, **kw: object) -> object:
        raise RuntimeError("boom")

    def interrupted(*args: object, **kw: object) -> object:
        raise KeyboardInterrupt

    target = "simulate" if where == "simulate" else "_write_results"
    args = ["simulate", "--trace", str(EXCERPT), "--limit", "20", "--no-report"]
    monkeypatch.setattr(sim_run, target, broken)
    with pytest.raises(RuntimeError, match="boom"):
        cli_main([*args, "--out", str(tmp_path / "failed")])
    manifest = json.loads((tmp_path / "failed" / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "RuntimeError: boom" in manifest["error"]

    monkeypatch.setattr(sim_run, target, interrupted)
    assert cli_main([*args, "--out", str(tmp_path / "stopped")]) == 130
    manifest = json.loads((tmp_path / "stopped" / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    err = capsys.readouterr().err
    assert "results measured so far are on disk" not in err
    assert ("nothing was measured" if where == "simulate" else "some files may be missing") \
        in err


def test_summarize_refuses_tables_it_cannot_trust(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Another run's tables copied in, or chunks.parquet gone: summarize says so and leaves
    the summary as it was, rather than stamping a false one with this run's id."""
    small = ["--trace", "synthetic", "--rate", "20", "--prompt-tokens", "8",
             "--output-tokens", "4", "--no-report"]
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    assert cli_main(["simulate", *small, "--num-requests", "50", "--out", str(ours)]) == 0
    assert cli_main(["simulate", *small, "--num-requests", "7", "--out", str(theirs)]) == 0
    good = (ours / "summary.json").read_bytes()
    for name in ("requests.parquet", "chunks.parquet"):
        (ours / name).rename(ours / f"{name}.kept")
        (ours / name).write_bytes((theirs / name).read_bytes())
    assert cli_main(["summarize", str(ours)]) == 2
    assert "written by run" in capsys.readouterr().err
    assert (ours / "summary.json").read_bytes() == good
    for name in ("requests.parquet", "chunks.parquet"):
        (ours / f"{name}.kept").replace(ours / name)
    (ours / "chunks.parquet").unlink()
    assert cli_main(["summarize", str(ours)]) == 2
    assert "requests.parquet without chunks.parquet" in capsys.readouterr().err
    assert (ours / "summary.json").read_bytes() == good


def test_a_report_says_how_a_run_that_did_not_finish_ended(tmp_path: Path) -> None:
    """A report used to take any folder with a summary for a finished run, and one whose
    engine never started for a cell 'not run (excluded by --only)'."""
    from harness.report import load_run

    never = tmp_path / "never"
    never.mkdir()
    (never / "manifest.json").write_text(json.dumps(
        {"status": "failed", "error": "EngineStartError: the server exited (code 2)"}))
    cell = load_run(never)
    assert (cell.state, cell.reason) == ("failed", "EngineStartError: the server exited (code 2)")

    stopped = tmp_path / "stopped"
    stopped.mkdir()
    (stopped / "summary.json").write_text(json.dumps({"num_requests": 11, "num_completed": 7}))
    for status, said in (("interrupted", "interrupted (Ctrl-C or SIGTERM); 29 requests of the "
                                         "trace were never sent"),
                         ("running", "killed while it ran (its manifest still says running); "
                                     "the requests in flight then are not among its figures; "
                                     "29 requests of the trace were never sent"),
                         ("finished", None)):
        (stopped / "manifest.json").write_text(json.dumps({"status": status,
                                                           "num_not_sent": 29}))
        cell = load_run(stopped)
        assert cell.ok and cell.ended_early == said, status


def test_summarize_says_when_the_run_never_said_how_it_ended(
        tmp_path: Path, loopback: str, capsys: pytest.CaptureFixture[str]) -> None:
    """batchlab itself killed outright: the manifest stays 'running', and summarize used to
    print a plain headline as if the run had finished."""
    out = tmp_path / "run"
    assert cli_main(["replay", "--target", loopback, "--trace", "synthetic", "--num-requests",
                     "4", "--rate", "20", "--prompt-tokens", "8", "--output-tokens", "4",
                     "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "status": "running"}))
    capsys.readouterr()
    assert cli_main(["summarize", str(out)]) == 0
    # no process holds the folder (summarize refuses one that is held): killed outright
    err = capsys.readouterr().err
    assert ("manifest still says 'running', and no batchlab process is writing it: the run "
            "was killed outright") in err
    assert "server logs" not in err  # attached: batchlab launched no server, kept no log
    # a launched server's logs are scrubbed only by the run that launched it
    launched = {**manifest, "status": "running", "engine": {**(manifest.get("engine") or {}),
                                                            "mode": "launch"}}
    (out / "manifest.json").write_text(json.dumps(launched))
    assert cli_main(["summarize", str(out)]) == 0
    assert "server logs (*.log) were never scrubbed" in capsys.readouterr().err
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert cli_main(["summarize", str(out)]) == 0
    assert "killed outright" not in capsys.readouterr().err


def test_a_live_runs_preemptions_per_class_are_not_known_either(tmp_path: Path,
                                                                 loopback: str) -> None:
    """A client cannot see preemptions: a live run's total is the engine's counter, or null,
    and no priority class claims the requests' zero (the counter does not say whose)."""
    out = tmp_path / "run"
    assert cli_main(["replay", "--target", loopback, "--trace", "synthetic", "--num-requests",
                     "6", "--rate", "20", "--prompt-tokens", "8", "--output-tokens", "4",
                     "--priority-fraction", "0.5", "--out", str(out)]) == 0
    for _ in range(2):  # as written by the run, then rebuilt
        summary = json.loads((out / "summary.json").read_text())
        assert summary["num_preemptions"] is None
        assert set(summary["by_priority"]) == {"0", "1"}
        assert all(cls["num_preemptions"] is None for cls in summary["by_priority"].values())
        assert cli_main(["summarize", str(out)]) == 0


def test_a_rerun_refused_for_bad_input_leaves_the_earlier_run_as_it_was(
        tmp_path: Path, loopback: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A missing --tokenizer is refused before the folder is claimed: the finished run in it
    keeps every file, byte for byte."""
    out = tmp_path / "run"
    small = ["--trace", "synthetic", "--num-requests", "3", "--rate", "20", "--prompt-tokens",
             "8", "--output-tokens", "4", "--out", str(out)]
    assert cli_main(["replay", "--target", loopback, *small]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    capsys.readouterr()
    assert cli_main(["replay", "--target", loopback, *small, "--num-requests", "5",
                     "--overwrite", "--tokenizer", str(tmp_path / "nonexistent")]) == 2
    assert "--tokenizer" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    (tmp_path / "tok").mkdir()  # a folder with no tokenizer in it: refused as early
    assert cli_main(["replay", "--target", loopback, *small, "--num-requests", "5",
                     "--overwrite", "--tokenizer", str(tmp_path / "tok")]) == 2
    assert "--tokenizer" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_a_replay_stopped_before_its_first_request_says_so(
        tmp_path: Path, loopback: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C during the warm-up (a slow or hung server), or a tokenizer that will not load:
    nothing was sent, and the manifest says how the run ended instead of "running"."""
    import harness.live.replay as live_replay

    async def hung(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(live_replay, "_warm_up", hung)
    out = tmp_path / "early"
    small = ["--trace", "synthetic", "--num-requests", "3", "--rate", "20", "--prompt-tokens",
             "8", "--output-tokens", "4"]
    assert cli_main(["replay", "--target", loopback, *small, "--out", str(out)]) == 130
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    assert manifest["error"] == ("interrupted before the first request was sent: nothing was "
                                 "measured")
    assert (manifest["num_sent"], manifest["num_not_sent"]) == (0, 3)
    monkeypatch.undo()

    def breaks(*args: object) -> None:
        raise RuntimeError("the body builder broke")

    monkeypatch.setattr(live_replay._Bodies, "prebuild", breaks)
    bad = tmp_path / "bad"
    with pytest.raises(RuntimeError, match="the body builder broke"):
        cli_main(["replay", "--target", loopback, *small, "--out", str(bad)])
    manifest = json.loads((bad / "manifest.json").read_text())
    assert manifest["status"] == "failed"
    assert manifest["error"] == ("failed before the first request was sent: RuntimeError: the "
                                 "body builder broke: nothing was measured")


def test_a_replay_killed_outright_is_reported_as_such_not_as_not_run(
        tmp_path: Path, loopback: str) -> None:
    """SIGKILL leaves records.jsonl and a manifest that says running: the report says the
    run was killed and how to rebuild it, not "not run"."""
    out = tmp_path / "killed"
    assert cli_main(["replay", "--target", loopback, "--trace", "synthetic", "--num-requests",
                     "3", "--rate", "20", "--prompt-tokens", "8", "--output-tokens", "4",
                     "--out", str(out)]) == 0
    for name in ("summary.json", "requests.parquet", "chunks.parquet", "report.md"):
        (out / name).unlink(missing_ok=True)
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "status": "running"}))
    assert cli_main(["report", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert "not run" not in report
    assert "killed while it ran: its manifest still says running; `batchlab summarize" in report


def test_summarize_takes_nothing_from_another_runs_summary(tmp_path: Path,
                                                           loopback: str) -> None:
    """A summary.json another run left in the folder (two runs into one --out) lends the
    rebuilt summary none of its keys: not its status, not its counts."""
    out = tmp_path / "run"
    assert cli_main(["replay", "--target", loopback, "--trace", "synthetic", "--num-requests",
                     "3", "--rate", "20", "--prompt-tokens", "8", "--output-tokens", "4",
                     "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    other = {**summary, "run_id": "another-run", "num_not_sent": 37, "workers": ["w"]}
    del other["status"]
    (out / "summary.json").write_text(json.dumps(other))
    assert cli_main(["summarize", str(out)]) == 0
    rebuilt = json.loads((out / "summary.json").read_text())
    assert rebuilt["run_id"] == summary["run_id"]
    assert rebuilt["num_not_sent"] == 0 and "workers" not in rebuilt
    assert rebuilt["status"] == "finished"  # from this run's manifest


def test_a_finished_run_lets_go_of_its_folder(tmp_path: Path, loopback: str) -> None:
    """The folder's lock lasts as long as the run: once simulate or replay returns, another
    process may write there (no lock file is left)."""
    small = ["--trace", "synthetic", "--num-requests", "3", "--rate", "20", "--prompt-tokens",
             "8", "--output-tokens", "4"]
    assert cli_main(["simulate", *small, "--no-report", "--out", str(tmp_path / "sim")]) == 0
    assert cli_main(["replay", "--target", loopback, *small, "--out",
                     str(tmp_path / "live")]) == 0
    for name in ("sim", "live"):
        assert not (tmp_path / name / LOCK_FILE).exists()


def test_a_workers_replay_killed_before_its_merge_is_rebuilt_from_its_workers(
        tmp_path: Path, loopback: str) -> None:
    """replay --workers whose parent was killed outright: the workers' records are all there
    is; summarize merges them as the run would have, and the report says it was killed."""
    out = tmp_path / "w"
    assert cli_main(["replay", "--target", loopback, "--trace", "synthetic", "--num-requests",
                     "6", "--rate", "20", "--prompt-tokens", "8", "--output-tokens", "4",
                     "--workers", "2", "--out", str(out)]) == 0
    merged = json.loads((out / "summary.json").read_text())
    for name in ("summary.json", "requests.parquet", "chunks.parquet", "report.md"):
        (out / name).unlink(missing_ok=True)
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "status": "running"}))
    assert cli_main(["report", str(out)]) == 0
    assert "killed while it ran" in (out / "report.md").read_text()
    assert cli_main(["summarize", str(out)]) == 0
    rebuilt = json.loads((out / "summary.json").read_text())
    assert rebuilt["num_requests"] == merged["num_requests"] == 6
    assert rebuilt["num_completed"] == merged["num_completed"]


def test_a_refused_replay_leaves_the_folders_manifest_as_it_was(
        tmp_path: Path, loopback: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay refused because --out holds another run (or another process holds it) wrote
    its own server's record into that run's manifest on the way out: the report then named the
    wrong engine and knobs for results measured on another server."""
    from harness.cli import live

    server = {"name": "reference", "mode": "attach", "base_url": "http://elsewhere:1",
              "version": "x", "version_probe": {}}
    monkeypatch.setattr(live, "_who_answers", lambda url: dict(server))
    out = tmp_path / "run"
    small = ["--trace", "synthetic", "--num-requests", "3", "--rate", "20", "--prompt-tokens",
             "8", "--output-tokens", "4"]
    assert cli_main(["replay", "--target", loopback, *small, "--out", str(out)]) == 0
    assert json.loads((out / "manifest.json").read_text())["engine"]["base_url"] == \
        "http://elsewhere:1"  # this run's server is recorded
    before = (out / "manifest.json").read_bytes()
    server["base_url"] = "http://another:2"
    other = ["--trace", "synthetic", "--num-requests", "5", "--rate", "20", "--prompt-tokens",
             "8", "--output-tokens", "4"]
    assert cli_main(["replay", "--target", loopback, *other, "--out", str(out)]) == 2
    assert (out / "manifest.json").read_bytes() == before
    assert cli_main(["replay", "--target", loopback, *other, "--workers", "2",
                     "--out", str(out)]) == 2
    assert (out / "manifest.json").read_bytes() == before
    holder = subprocess.Popen(  # another process writing it: refused too, and untouched
        [sys.executable, "-c", "import sys; from harness.runfolder import hold_dir; "
         "hold_dir(sys.argv[1]); print('held', flush=True); sys.stdin.read()", str(out)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=Path(live.__file__)
        .resolve().parents[2])
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert cli_main(["replay", "--target", loopback, *small, "--out", str(out)]) == 2
    finally:
        holder.communicate("")
    assert (out / "manifest.json").read_bytes() == before
