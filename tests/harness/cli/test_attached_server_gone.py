"""An attached server that stops answering mid-replay fails the run, as a launched engine's
exit does. It used to end "finished" with exit 0: every later request a connect_error, the
run's throughput averaged over the time the server was gone, and nothing said it had died.

So does one restarted under the run with another configuration: it answers again, but the run
measured two configurations, and used to end "finished" with exit 0 under the first."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from harness.cli import main
from harness.live.recorder import RECORDS_FILE, read_records
from harness.live.testing import ScheduledStreamServer, _respond

REPO = Path(__file__).resolve().parents[3]
TRACE = str(REPO / "harness" / "data" / "azure_conv_excerpt.csv")


class Reconfigured(ScheduledStreamServer):
    """The stand-in server with vLLM's ``/version``: ``versions[0]`` until it has read
    ``after`` requests, ``versions[1]`` from then on (restarted under the run with another
    release, as far as its clients can tell)."""

    def __init__(self, *, versions: tuple[str, str], after: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.versions = versions
        self.after = after

    async def _dispatch(self, method: str, path: str, headers: dict[str, str], body: bytes,
                        recv_ns: int, writer: asyncio.StreamWriter) -> bool:
        if method == "GET" and path == "/version":
            version = self.versions[self.stats.num_requests >= self.after]
            return await _respond(writer, 200, json.dumps({"version": version}).encode())
        return await super()._dispatch(method, path, headers, body, recv_ns, writer)


@contextmanager
def serving_until(out: Path | None,
                  server_type: Callable[..., ScheduledStreamServer] = ScheduledStreamServer,
                  **kw: Any) -> Iterator[str]:
    """The stand-in server (``server_type``) in a thread; stopped for good (its port closed)
    once a request of the replay into ``out`` is on disk, when ``out`` is given."""
    started, stop = threading.Event(), threading.Event()
    url: list[str] = []

    async def run() -> None:
        async with server_type(ttft_s=0.005, itl_s=0.02, **kw) as server:
            url.append(server.url)
            started.set()
            while not stop.is_set():
                await asyncio.sleep(0.005)

    def watch() -> None:  # the first finished request recorded: the server goes away
        assert out is not None
        while not stop.is_set():
            records = out / RECORDS_FILE
            if records.exists() and read_records(records):  # one finished (not just sent)
                stop.set()
            time.sleep(0.005)

    thread = threading.Thread(target=asyncio.run, args=(run(),), daemon=True)
    thread.start()
    assert started.wait(10)
    if out is not None:
        threading.Thread(target=watch, daemon=True).start()
    try:
        yield url[0]
    finally:
        stop.set()
        thread.join(10)


def replay(url: str, out: Path) -> list[str]:
    return ["replay", "--target", url, "--trace", TRACE, "--limit", "12", "--rate", "8",
            "--output-tokens", "20", "--out", str(out)]


def attached_scenario(folder: Path, name: str, question: str, url: str) -> Path:
    """A scenario of one cell attached to the server at ``url`` (``url:``), replaying the
    replay's 12 requests."""
    scenario = folder / "s.yaml"
    scenario.write_text(
        f"name: {name}\nquestion: {question}\n"
        f"trace:\n  path: {TRACE}\n  limit: 12\n  rate: 8\n  output_tokens: 20\n"
        "model: llama-3.1-8b\ngpu: h100-sxm\nengines:\n"
        f"  - name: attached\n    engine: openai\n    url: {url}\n")
    return scenario


def test_a_server_gone_mid_replay_fails_the_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    with serving_until(out) as url:
        assert main(replay(url, out)) == 1
    err = capsys.readouterr().err
    assert f"the server at {url} stopped answering during the run" in err
    assert "connect_error" in err and "/health does not answer (ConnectError)" in err
    summary = json.loads((out / "summary.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    assert summary["status"] == manifest["status"] == "failed"
    assert "stopped answering" in manifest["error"]
    assert 1 <= summary["num_completed"] < 12  # what was measured is kept


def test_connection_failures_from_a_server_still_up_are_counted_not_fatal(
        tmp_path: Path) -> None:
    """A stream cut by a server that still answers is that server's answer: counted as a
    failure (``--max-failed`` decides), not a dead server."""
    out = tmp_path / "run"
    with serving_until(None, faults={"3": "kill"}) as url:
        assert main(replay(url, out)) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failures"] == {"stream_cut": 1}
    assert summary["status"] == "finished"


def test_a_sweep_cell_whose_server_went_away_fails_and_says_why(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same in a scenario cell attached with ``url:``: it ended "done", and the sweep's
    report compared its partial figures with the other cells'."""
    out = tmp_path / "out"
    cell = out / "gone" / "attached"
    with serving_until(cell) as url:
        scenario = attached_scenario(tmp_path, "gone", "Does a server that dies fail its cell?",
                                     url)
        assert main(["run", str(scenario), "--out", str(out)]) == 1
    status = json.loads((cell / "status.json").read_text())
    assert status["state"] == "failed"
    assert f"the server at {url} stopped answering during the run" in status["reason"]
    assert json.loads((cell / "summary.json").read_text())["status"] == "failed"
    assert "stopped answering during the run" in capsys.readouterr().err


@pytest.mark.parametrize("how", ["shut down", "frozen"])
def test_a_served_engine_shut_down_or_frozen_mid_replay_fails_the_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str) -> None:
    """The real `batchlab serve reference`, stopped as an operator would (SIGTERM: it ends
    its streams with an error event, then closes its port) or frozen (SIGSTOP: every request
    times out). Neither is a connection refused or a stream cut, and both runs used to end
    "finished" with exit 0, their failures counted as the engine's answer to the load."""
    import os
    import signal

    from harness.serve import launch_server_process

    out = tmp_path / "run"
    with launch_server_process(("--model", "llama-3.1-8b"),
                               log_path=tmp_path / "server.log") as server:
        def stop() -> None:  # a first request finished: the server goes, or freezes
            records = out / RECORDS_FILE
            while not (records.exists() and read_records(records)):
                time.sleep(0.01)
            os.kill(server.process.pid, signal.SIGTERM if how == "shut down" else signal.SIGSTOP)

        stopper = threading.Thread(target=stop, daemon=True)
        stopper.start()
        try:
            # shut down: every request sent before the first finishes (about 10 s), half of
            # them with more than the server's 5 s graceful period still to go
            load = (["--rate", "1.2", "--output-tokens", "1500"] if how == "shut down" else
                    ["--rate", "8", "--output-tokens", "200", "--timeout-s", "3"])
            code = main(["replay", "--target", server.url, "--trace", TRACE, "--limit", "12",
                         *load, "--out", str(out)])
        finally:
            if how == "frozen":
                os.kill(server.process.pid, signal.SIGCONT)
    err = capsys.readouterr().err
    assert code == 1, err
    assert f"the server at {server.url} stopped answering during the run" in err
    summary = json.loads((out / "summary.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    assert summary["status"] == manifest["status"] == "failed"
    assert 1 <= summary["num_completed"] < 12
    # neither a connection refused nor a stream cut: what the rule once required
    assert set(summary["failures"]) == ({"stream_error"} if how == "shut down" else {"timeout"})


# ---------------------------------------------------------------- restarted under the run


def test_a_server_restarted_with_another_version_mid_replay_fails_the_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Its /version is asked again once the last request has ended: another answer than
    before the first request fails the run, naming what changed, in its summary, manifest,
    console line and report."""
    out = tmp_path / "run"
    with serving_until(None, Reconfigured, versions=("0.6.0", "0.7.0"), after=3) as url:
        assert main(replay(url, out)) == 1
    changed = "engine version: 0.6.0 at start, 0.7.0 at end"
    err = capsys.readouterr().err
    assert (f"error: the server at {url} restarted during the run with another configuration "
            f"({changed}): its figures are of two configurations (the results are in {out})"
            in err.splitlines())
    summary = json.loads((out / "summary.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    assert summary["status"] == manifest["status"] == "failed"
    assert summary["server_changed_during_run"] == manifest["server_changed_during_run"] \
        == [changed]
    assert "restarted during the run" in manifest["error"]
    assert manifest["engine"]["version"] == "0.6.0"  # what it said before the first request
    assert manifest["engine"]["version_probe_at_end"]["body"] == {"version": "0.7.0"}
    assert summary["num_completed"] == 12  # what was measured is kept
    assert main(["report", str(out)]) == 0  # the report says why, as for a failed run
    assert f"restarted during the run with another configuration ({changed})" in \
        (out / "report.md").read_text()


def test_a_server_that_says_the_same_after_the_replay_leaves_it_finished(
        tmp_path: Path) -> None:
    out = tmp_path / "run"
    with serving_until(None, Reconfigured, versions=("0.6.0", "0.6.0"), after=3) as url:
        assert main(replay(url, out)) == 0
    summary = json.loads((out / "summary.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    assert summary["status"] == manifest["status"] == "finished"
    assert "server_changed_during_run" not in summary and "server_changed_during_run" \
        not in manifest
    assert manifest["engine"]["version_probe_at_end"]["body"] == {"version": "0.6.0"}


def test_a_sweep_cell_whose_server_was_restarted_under_it_fails_and_says_why(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same in a scenario cell attached with ``url:`` (``replay --engine E --url``'s
    path): the cell fails, and ``--resume`` runs it again."""
    out = tmp_path / "out"
    cell = out / "restarted" / "attached"
    with serving_until(None, Reconfigured, versions=("0.6.0", "0.7.0"), after=3) as url:
        scenario = attached_scenario(tmp_path, "restarted",
                                     "Does a server restarted under a cell fail it?", url)
        assert main(["run", str(scenario), "--out", str(out)]) == 1
    status = json.loads((cell / "status.json").read_text())
    assert status["state"] == "failed"
    assert status["reason"] == (
        f"ServerRestarted: the server at {url} restarted during the run with another "
        "configuration (engine version: 0.6.0 at start, 0.7.0 at end): its figures are of "
        "two configurations")
    summary = json.loads((cell / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert summary["server_changed_during_run"] == ["engine version: 0.6.0 at start, 0.7.0 at end"]
    assert "restarted during the run" in capsys.readouterr().err


def test_a_capacity_probe_whose_server_was_restarted_under_it_is_no_verdict(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same in a capacity search's probe: its figures are of two configurations, so it
    neither passes nor fails the load; the search stops, and --resume runs the probe again."""
    out = tmp_path / "search"
    with serving_until(None, Reconfigured, versions=("0.6.0", "0.7.0"), after=3) as url:
        code = main(["capacity", "--engine", "openai", "--url", url, "--trace", TRACE,
                     "--limit", "12", "--output-tokens", "20", "--slo", "ttft_s=5",
                     "--start", "8", "--max-probes", "2", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1, err
    changed = "engine version: 0.6.0 at start, 0.7.0 at end"
    assert f"restarted during the run with another configuration ({changed})" in err
    probes = [p for p in out.rglob("status.json") if p.parent != out]
    states = [json.loads(p.read_text()) for p in probes]
    assert [s["state"] for s in states] == ["failed"]
    assert states[0]["reason"].startswith(f"the server at {url} restarted during the run")
    assert not list(out.rglob("probe.json"))  # no verdict about the load
