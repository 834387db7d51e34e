"""What a server replayed with ``--target`` says of itself is in the run's manifest before the
first request: a run killed outright keeps it, and the summary of a finished run against the
served reference says its figures are predictions. Both used to be written only after the
replay: a killed run's report said "every knob was applied as given" and named no engine, and
the summary of a finished one lacked ``prediction`` until ``batchlab summarize`` ran."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness.live.recorder import RECORDS_FILE, read_records
from harness.serve import launch_server_process

REPO = Path(__file__).resolve().parents[3]
TRACE = str(REPO / "harness" / "data" / "azure_conv_excerpt.csv")


def _replay(url: str, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "harness.cli", "replay", "--target", url, "--trace", TRACE,
            "--limit", "8", "--rate", "4", "--output-tokens", "100", "--out", str(out), *extra]


def test_a_finished_replay_of_the_served_reference_says_it_is_predicted(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with launch_server_process(("--model", "llama-3.1-8b"),
                               log_path=tmp_path / "server.log") as server:
        done = subprocess.run(_replay(server.url, out), cwd=REPO, capture_output=True,
                              text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["prediction"]["served"] is True
    assert "predicted by the reference engine served over HTTP" in summary["prediction"]["text"]


def test_a_replay_killed_outright_keeps_what_the_server_said_of_itself(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with launch_server_process(("--model", "llama-3.1-8b"),
                               log_path=tmp_path / "server.log") as server:
        proc = subprocess.Popen(_replay(server.url, out), cwd=REPO, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while not ((out / RECORDS_FILE).exists() and read_records(out / RECORDS_FILE)):
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.01)
            os.kill(proc.pid, signal.SIGKILL)  # no finally, no atexit: what is on disk stays
        finally:
            proc.wait(30)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "running"  # killed: nothing said how it ended
    assert manifest["engine"]["name"] == "reference"
    assert manifest["engine"]["version_probe"]["body"]["prediction"]
    assert manifest["model"] == "llama-3.1-8b"
