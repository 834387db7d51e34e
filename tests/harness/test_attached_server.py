"""Capacity searches and sweeps against a server batchlab attached to and did not start (the
served reference engine, on a port of the test's choosing so that it can be started again at
the same URL): a server that dies during a probe, and one restarted with another
configuration before a resume."""

from __future__ import annotations

import contextlib
import io
import json
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import scenario as sc
from harness.capacity.probe import read_probe
from harness.cli import main
from harness.results import PROBE_FILE, SEARCH_FILE
from harness.serve.process import ReferenceChild

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]
SERVED = ("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--max-num-batched-tokens", "2048",
          "--max-model-len", "2048")
TRACE = ["--trace", "synthetic", "--num-requests", "24", "--prompt-tokens", "64",
         "--output-tokens", "16"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def served(port: int, log: Path, *args: str) -> Iterator[ReferenceChild]:
    """``batchlab serve reference ARGS`` on ``port`` in a child process, stopped on exit."""
    argv = [sys.executable, "-m", "harness.cli", "serve", "reference", *SERVED, *args,
            "--host", "127.0.0.1", "--port", str(port)]
    deadline = time.monotonic() + 60
    while True:  # the port may still be held a moment by the server before
        with log.open("wb") as out:
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, cwd=REPO)
        child = ReferenceChild(f"http://127.0.0.1:{port}", process, log)
        while "listening on" not in log.read_text(errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if "listening on" in log.read_text(errors="replace"):
            break
        child.stop()
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server did not start:\n{log.read_text()[-2000:]}")
        time.sleep(0.5)
    try:
        yield child
    finally:
        child.stop()


def kill_during(child: ReferenceChild, started: Path, after_s: float) -> threading.Thread:
    """Kill the server (SIGKILL) ``after_s`` after the file ``started`` appears."""
    def watch() -> None:
        deadline = time.monotonic() + 120
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(after_s)
        child.process.kill()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def capacity_args(url: str, out: Path, *extra: str) -> list[str]:
    return ["capacity", "--engine", "reference", "--url", url, *TRACE, "--slo", "ttft_s=1",
            "--start", "8", "--out", str(out), *extra]


def test_a_probe_during_which_the_attached_server_died_fails_and_is_run_again(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An attached server killed during a probe used to count the requests it never answered
    (no connection, a stream cut) as missed SLOs: the probe failed as if over capacity, the
    search went on below it, and --resume reused it as a verdict. The probe fails instead,
    the search stops naming the server and what happened, and --resume runs it again."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    out = tmp_path / "cap"
    probe_dir = out / "reference" / "rate-8"
    with served(port, tmp_path / "server1.log", "--max-num-seqs", "8") as child:
        killer = kill_during(child, probe_dir / "status.json", 1.0)  # 3 s of arrivals
        code = main(capacity_args(url, out, "--max-probes", "2"))
        killer.join()
    said = capsys.readouterr()
    assert code == 1, said.err
    text = said.out + said.err
    assert (f"reference: search failed: the server at {url} stopped "
            "answering during the probe at 8 req/s") in text
    assert "could not connect or were cut off" in text and "--resume" in text
    assert "8 req/s: SLO attainment" not in text  # no verdict about the load
    status = json.loads((probe_dir / "status.json").read_text())
    assert status["state"] == "failed" and url in status["reason"]
    assert not (probe_dir / PROBE_FILE).exists()
    for name in ("summary.json", "manifest.json"):  # failed, as after a launched engine's exit
        assert json.loads((probe_dir / name).read_text())["status"] == "failed", name
    search = json.loads((out / "reference" / SEARCH_FILE).read_text())
    assert search["status"] == "failed" and search["probes"] == []
    assert url in search["error"]
    capacity = json.loads((out / "capacity.json").read_text())
    assert capacity["settings"][0]["status"] == "failed"

    with served(port, tmp_path / "server2.log", "--max-num-seqs", "8"):
        code = main(capacity_args(url, out, "--max-probes", "2", "--resume"))
    said = capsys.readouterr()
    assert code == 0, said.err
    text = said.out + said.err
    assert "reference: probe 8 req/s\n" in text  # run again, not reused
    assert "reference: 8 req/s: SLO attainment 100%, passed\n" in text
    assert read_probe(probe_dir, search["digest"]) is not None


def test_a_probe_kept_as_a_verdict_though_most_requests_never_reached_the_server_is_not_reused(
        tmp_path: Path) -> None:
    """A probe an earlier search kept as a load verdict when half its requests or more could
    not connect or were cut off (its server died) is no verdict: a resumed search runs it
    again. One with a stray connection failure is kept."""
    probe = {"digest": "d", "kind": "rate", "target": 0.99, "load": 8.0, "attainment": 0.2,
             "passed": False}
    for name, failures, kept in (("dead", {"connect_error": 40, "stream_cut": 7}, False),
                                 ("stray", {"stream_cut": 1}, True)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / PROBE_FILE).write_text(json.dumps(probe))
        (folder / "summary.json").write_text(json.dumps({"num_requests": 60,
                                                         "failures": failures}))
        assert (read_probe(folder, "d") is not None) is kept, name


def test_resuming_a_capacity_search_refuses_probes_of_a_server_since_reconfigured(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The digest of a search attached to a server covered the URL and the command line, not
    what the server runs: restarted at the same URL with another max_num_seqs, --resume mixed
    probes of both configurations. The resume is refused, naming what changed, as one with
    another SLO or trace is; the same configuration again resumes."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    out = tmp_path / "cap"
    args = capacity_args(url, out, "--max-probes", "2")
    with served(port, tmp_path / "server1.log", "--max-num-seqs", "8"):
        assert main(args) == 0
    capsys.readouterr()
    with served(port, tmp_path / "server2.log", "--max-num-seqs", "8"):  # restarted, the same
        assert main([*args, "--resume"]) == 0
    said = capsys.readouterr()
    assert "(resumed)" in said.err
    with served(port, tmp_path / "server3.log", "--max-num-seqs", "16"):
        assert main([*args, "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"was measured against the server at {url}, which reports another configuration" \
        in err
    assert "max_num_seqs: 8 then, 16 now" in err and "drop --resume" in err
    assert "max_num_batched_tokens" not in err  # only what changed


def test_resuming_a_sweep_runs_again_a_cell_whose_server_was_reconfigured(
        tmp_path: Path) -> None:
    """A scenario cell with ``url:`` was kept by --resume when the server at that URL had been
    restarted with another configuration since it was measured (its digest covers the url,
    not what the server runs). It is run again, as a cell whose definition changed is, and
    the sweep says why; restarted with the same configuration, it is kept."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: attached
        question: How does the served engine do?
        trace:
          path: synthetic
          num_requests: 12
          rate: 8
          prompt_tokens: 64
          output_tokens: 8
        model: llama-3.1-8b
        gpu: h100-sxm
        engines:
          - name: served
            engine: reference
            mode: live
            url: {url}
        """))
    scenario = sc.load_scenario(path)

    def sweep(log: io.StringIO) -> list[str]:
        result = sc.run_scenario(scenario, tmp_path / "out", resume=True, write_report=False,
                                 progress=sc.SweepProgress(1, stream=log, tty=False))
        return [o.state for o in result.outcomes]

    with served(port, tmp_path / "server1.log", "--max-num-seqs", "8"):
        assert sweep(io.StringIO()) == ["done"]
    with served(port, tmp_path / "server2.log", "--max-num-seqs", "8"):
        log = io.StringIO()
        assert sweep(log) == ["skipped"], log.getvalue()
    with served(port, tmp_path / "server3.log", "--max-num-seqs", "16"):
        log = io.StringIO()
        assert sweep(log) == ["done"], log.getvalue()
    said = log.getvalue()
    assert (f"served: finished earlier, but the server at {url} reports another "
            "configuration now than when it was measured (changed: ") in said
    assert "max_num_seqs: 8 then, 16 now" in said and "): running it again" in said
    manifest = json.loads((tmp_path / "out" / "attached" / "served" / "manifest.json")
                          .read_text())
    assert manifest["knobs"]["max_num_seqs"] == 16


def test_a_setting_only_one_answer_reports_is_no_change() -> None:
    """A server's answer of a newer batchlab reports a setting an older run's did not
    (cost_model_digest): "not reported then" counted as a change, so every resume against an
    unchanged server was refused (capacity) or re-ran its cells (sweep)."""
    from harness.scenario.attached import identity_changes

    then = {"engine version": "0.1.0", "max_num_seqs": 8}
    now = {**then, "cost_model_digest": "13f7481f4c62d15f"}
    assert identity_changes(then, now) == []
    assert identity_changes(then, {**now, "max_num_seqs": 16}) == ["max_num_seqs: 8 then, 16 now"]
