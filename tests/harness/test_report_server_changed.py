"""Cells of one sweep measured against one attached server while it ran with different
settings (restarted between them) are set side by side as if alike: their definitions are the
same, so nothing marked them. The report now says the server described itself differently."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.cli import main

REPO = Path(__file__).resolve().parents[2]


def _scenario(url: str) -> str:
    return f"""\
name: attached
question: which rate?
model: llama-3.1-8b
gpu: h100-sxm
trace:
  path: {REPO / "harness" / "data" / "azure_conv_excerpt.csv"}
  limit: 12
  max_model_len: 4096
  on_too_long: clip
load:
  rates: [3, 6]
engines:
  - name: srv
    engine: reference
    mode: live
    url: {url}
"""


@contextmanager
def _serving(port: int, seqs: str, log: Path) -> Iterator[str]:
    """``batchlab serve reference`` on ``port`` (the same address both times, as a server
    restarted in place keeps it)."""
    argv = [sys.executable, "-m", "harness.cli", "serve", "reference", "--model",
            "llama-3.1-8b", "--max-num-seqs", seqs, "--port", str(port)]
    with log.open("wb") as f:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while "listening on" not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)


def test_cells_measured_against_a_server_restarted_with_other_settings_are_said(
        tmp_path: Path) -> None:
    path = tmp_path / "attached.yaml"
    out = tmp_path / "out"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for seqs, cell in (("4", "srv__rate-3"), ("64", "srv__rate-6")):
        with _serving(port, seqs, tmp_path / f"server-{seqs}.log") as url:
            path.write_text(_scenario(url))
            assert main(["run", str(path), "--only", cell, "--out", str(out)]) == 0
    report = (out / "attached" / "report.md").read_text()
    assert "described itself differently across the cells measured against it" in report
    assert "max_num_seqs" in report.split("described itself differently")[1].split("\n")[0]
