"""The live replay client against the scheduled-stream loopback server (harness.live.testing).

No timed assertions: the checks are about ordering, counts, error kinds and what lands on disk.
Physical lower bounds (a chunk cannot arrive before the server sent it) are fine.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from harness.cli import main as cli_main
from harness.live.recorder import RECORDS_FILE, read_records
from harness.live.replay import ReplayConfig, replay
from harness.live.rundir import rebuild_summary
from harness.live.testing import ScheduledStreamServer
from harness.live.testing import server_process as loopback_process
from harness.metrics import Slo
from harness.timeline import ERROR_KINDS, RequestTimeline
from harness.traces import Trace, TraceRequest

REPO = Path(__file__).resolve().parents[2]
PROTOCOLS = ("openai", "openai-chat", "tgi")


def make_trace(n: int, *, gap_s: float = 0.01, prompt: int = 32, output: int = 6,
               priorities: bool = False) -> Trace:
    reqs = tuple(
        TraceRequest(f"r{i}", i * gap_s, prompt, output, priority=(i % 2) if priorities else None)
        for i in range(n)
    )
    return Trace(reqs, source="test", format="test", digest="0" * 64)


def run(trace: Trace, out: Path, server_kw: dict[str, Any] | None = None,
        **config_kw: Any) -> tuple[dict[str, Any], list[RequestTimeline], ScheduledStreamServer]:
    async def go() -> tuple[dict[str, Any], ScheduledStreamServer]:
        async with ScheduledStreamServer(**{"ttft_s": 0.02, "itl_s": 0.004,
                                            **(server_kw or {})}) as server:
            config = ReplayConfig(target_url=server.url, **config_kw)
            return await replay(trace, config, out), server

    summary, server = asyncio.run(go())
    rows = read_records(out / RECORDS_FILE)
    return summary, rows, server


def by_id(rows: list[RequestTimeline]) -> dict[str, RequestTimeline]:
    ids = [r.request_id for r in rows]
    assert len(ids) == len(set(ids)), "a request has more than one row"
    return {r.request_id: r for r in rows}


# ---------------------------------------------------------------- open loop


@pytest.mark.parametrize("http_client", ["lean", "httpx"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_open_loop_records_every_chunk(tmp_path: Path, protocol: str, http_client: str) -> None:
    trace = make_trace(12, priorities=True)
    summary, rows, server = run(trace, tmp_path, {"keep_bodies": True}, protocol=protocol,
                                http_client=http_client)
    got = by_id(rows)
    assert set(got) == {r.request_id for r in trace.requests}
    for req in trace.requests:
        tl = got[req.request_id]
        assert tl.ok, (tl.error_kind, tl.error_message)
        assert tl.chunk_num_tokens == (1,) * 6
        assert tl.num_output_tokens == 6 and tl.token_count_source == "usage"
        assert tl.sent_s is not None and tl.sent_s >= tl.arrival_s  # never early
        assert tl.send_lag_s >= 0.0  # measured, from the instant it was due
        assert tl.ttft_s() >= 0.02  # the server waits 20 ms before the first chunk
        assert list(tl.chunk_times_s) == sorted(tl.chunk_times_s)
        assert tl.finished_s is not None and tl.finished_s >= tl.chunk_times_s[-1]
    assert summary["num_requests"] == 12 and summary["num_completed"] == 12
    assert summary["send_lag_s"]["count"] == 12
    assert summary["output_length_fidelity"]["num_reached_target"] == 12
    assert "by_priority" in summary

    req_table = pq.read_table(tmp_path / "requests.parquet")
    for col in ("sent_s", "send_lag_s", "num_chunks", "token_count_source",
                "reached_target_length", "scheduled_s"):
        assert col in req_table.column_names
    assert pq.read_table(tmp_path / "chunks.parquet").num_rows == 12 * 6
    assert json.loads((tmp_path / "summary.json").read_text())["num_completed"] == 12

    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["protocol"] == protocol and manifest["status"] == "finished"
    assert manifest["trace"]["digest"] == "0" * 64
    assert manifest["num_sent"] == 12
    if protocol == "tgi":
        assert manifest["prompt_mode"] == "approx_text"
        assert manifest["priority"] == "not applied: the tgi protocol has no priority field"
        assert all("priority" not in b for b in server.stats.bodies)
    else:  # a plain --target replay: vLLM's convention, the server's policy not known
        assert manifest["priority"] == (
            "sent; the server's policy is not known; in vLLM's convention (lower is served "
            "first), as no --engine names the server")
        bodies = dict(zip(server.stats.request_ids, server.stats.bodies, strict=True))
        assert {rid: b["priority"] for rid, b in bodies.items()} == {
            f"r{i}": i % 2 for i in range(12)}
    if protocol == "openai":
        assert manifest["prompt_mode"] == "token_ids"
        assert all(len(b["prompt"]) == 32 for b in server.stats.bodies)


def test_multi_token_chunks_and_counts_without_usage(tmp_path: Path) -> None:
    trace = make_trace(4, output=7)
    _, rows, _ = run(trace, tmp_path / "a", {"tokens_per_chunk": 3})
    for tl in rows:
        assert tl.chunk_num_tokens == (3, 3, 1) and tl.output_tokens == 7
    _, rows, _ = run(trace, tmp_path / "b", {"send_usage": False}, protocol="openai-chat")
    for tl in rows:
        assert tl.ok and tl.token_count_source == "chunks" and tl.output_tokens == 7


def test_tgi_cannot_force_length_and_says_so(tmp_path: Path) -> None:
    trace = make_trace(3, output=8)
    summary, rows, _ = run(trace, tmp_path / "tgi", {"eos_after_tokens": 3}, protocol="tgi")
    assert all(tl.ok and tl.output_tokens == 3 and tl.finish_reason == "eos_token" for tl in rows)
    assert summary["output_length_fidelity"]["num_reached_target"] == 0
    assert not any(pq.read_table(tmp_path / "tgi" / "requests.parquet")
                   .column("reached_target_length").to_pylist())
    summary, rows, _ = run(trace, tmp_path / "oai", {"eos_after_tokens": 3}, protocol="openai")
    assert summary["output_length_fidelity"]["num_reached_target"] == 3  # ignore_eos honoured


def test_max_concurrency_gate(tmp_path: Path) -> None:
    trace = make_trace(10, gap_s=0.001)  # 1 ms apart, each lasting > 40 ms
    summary, rows, server = run(trace, tmp_path, {"ttft_s": 0.02, "itl_s": 0.005},
                                max_concurrency=2)
    assert server.stats.max_active <= 2
    ordered = sorted(rows, key=lambda tl: tl.arrival_s)
    starts = [tl.scheduled_s if tl.scheduled_s is not None else tl.arrival_s for tl in ordered]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # released in arrival order, and held requests never leave in a burst
    assert all(g >= 0.001 - 1e-9 for g in gaps)
    assert sum(tl.scheduled_s is not None for tl in rows) >= 1
    assert all(tl.ok for tl in rows)
    # over every request sent, as docs/metrics.md says: not the held ones only
    assert summary["gate_wait_s"]["count"] == 10
    assert summary["gate_wait_s"]["max"] == pytest.approx(max(tl.gate_wait_s for tl in rows))


# ---------------------------------------------------------------- closed loop


def test_closed_loop_never_exceeds_its_users(tmp_path: Path) -> None:
    trace = make_trace(24, gap_s=10.0)  # arrival times are ignored in the closed loop
    _, rows, server = run(trace, tmp_path, mode="closed", concurrency=3)
    assert server.stats.max_active <= 3
    assert len(by_id(rows)) == 24 and all(tl.ok for tl in rows)
    # users take requests in trace order (arrival_s: the instant a user became free and took one)
    assert [tl.request_id for tl in sorted(rows, key=lambda tl: tl.arrival_s)] == [
        r.request_id for r in trace.requests]
    # after the first wave, the k-th request arrived only once k - 2 had finished (a user
    # became free): arrivals follow finishes, not the trace's times
    arrivals = sorted(tl.arrival_s for tl in rows)
    finishes = sorted(tl.finished_s for tl in rows if tl.finished_s is not None)
    assert all(arrivals[k] >= finishes[k - 3] for k in range(3, len(arrivals)))


# ---------------------------------------------------------------- failures are rows


FAULT_KINDS = {
    "kill": "stream_cut", "close": "stream_cut", "hang": "timeout", "malformed": "invalid_json",
    "error_event": "stream_error", "429": "overloaded", "503": "overloaded", "500": "http_error",
}


@pytest.mark.parametrize("http_client", ["lean", "httpx"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_faults_are_rows_and_none_are_lost(tmp_path: Path, protocol: str,
                                           http_client: str) -> None:
    faults = dict(FAULT_KINDS)
    if protocol == "tgi":
        faults["overload_event"] = "overloaded"
    names = list(faults)
    trace = make_trace(len(names) + 4)
    server_faults = {f"r{i}": name for i, name in enumerate(names)}
    # The hung stream ends at the timeout; healthy ones must finish well within it even on a
    # loaded 2-core machine.
    summary, rows, _ = run(trace, tmp_path, {"faults": server_faults}, protocol=protocol,
                           timeout_s=2.0, slo=Slo(ttft_s=10.0), http_client=http_client)
    got = by_id(rows)
    assert set(got) == {r.request_id for r in trace.requests}
    for i, name in enumerate(names):
        tl = got[f"r{i}"]
        assert tl.error_kind == faults[name], (name, tl.error_kind, tl.error_message)
        assert tl.error_kind in ERROR_KINDS and tl.error_message
        assert not tl.ok
    for i in range(len(names), len(names) + 4):
        assert got[f"r{i}"].ok
    # partial streams keep the chunks that did arrive
    assert got[f"r{names.index('kill')}"].chunk_num_tokens == (1, 1)
    assert summary["num_failed"] == len(names)
    # goodput divides by requests sent, failures included
    assert summary["goodput"]["num_good"] == 4
    assert summary["goodput"]["slo_attainment"] == pytest.approx(4 / len(trace.requests))


@pytest.mark.parametrize("http_client", ["lean", "httpx"])
def test_server_killed_mid_run(tmp_path: Path, http_client: str) -> None:
    reqs = [TraceRequest(f"a{i}", 0.0, 8, 60) for i in range(3)]
    reqs += [TraceRequest(f"b{i}", 0.6, 8, 60) for i in range(3)]
    trace = Trace(tuple(reqs), source="test", format="test", digest="1" * 64)

    async def go() -> None:
        server = ScheduledStreamServer(ttft_s=0.01, itl_s=0.01)
        await server.start()
        killer = asyncio.create_task(asyncio.sleep(0.25))
        killer.add_done_callback(lambda _t: asyncio.ensure_future(server.stop()))
        await replay(trace, ReplayConfig(target_url=server.url, timeout_s=5.0,
                                         http_client=http_client), tmp_path)
        await killer

    asyncio.run(go())
    got = by_id(read_records(tmp_path / RECORDS_FILE))
    assert set(got) == {r.request_id for r in reqs}
    assert {got[f"a{i}"].error_kind for i in range(3)} == {"stream_cut"}
    assert {got[f"b{i}"].error_kind for i in range(3)} == {"connect_error"}
    assert all(got[f"a{i}"].chunk_times_s for i in range(3))


def test_nothing_listening_is_connect_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    trace = make_trace(3)
    summary = asyncio.run(replay(trace, ReplayConfig(target_url=f"http://127.0.0.1:{port}"),
                                 tmp_path))
    assert summary["failures"] == {"connect_error": 3}
    assert summary["ttft_s"]["count"] == 0


# ---------------------------------------------------------------- interruption and rebuild


def test_cancel_mid_run_keeps_what_was_measured(tmp_path: Path) -> None:
    trace = make_trace(40, gap_s=0.02, output=30)  # ~0.8 s of arrivals, each ~0.14 s long

    async def go() -> None:
        async with ScheduledStreamServer(ttft_s=0.01, itl_s=0.004) as server:
            done = asyncio.Event()

            def progress(n: int, total: int) -> None:
                if n >= 3:
                    done.set()

            task = asyncio.create_task(replay(
                trace, ReplayConfig(target_url=server.url, slo=Slo(ttft_s=5.0)), tmp_path,
                progress=progress))
            await done.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(go())
    rows = read_records(tmp_path / RECORDS_FILE)
    got = by_id(rows)
    assert 3 <= len(got) < 40  # requests never sent have no row
    kinds = {tl.error_kind for tl in rows}
    assert kinds <= {None, "not_finished"} and "not_finished" in kinds
    for tl in rows:
        if tl.error_kind == "not_finished":
            assert tl.finished_s is None and tl.sent_s is not None
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["num_requests"] == len(rows)
    assert summary["goodput"]["slo_attainment"] == pytest.approx(
        summary["num_completed"] / len(rows))  # divided by requests sent
    # the summary alone says the run did not finish, and how much of the trace it left
    assert summary["status"] == "interrupted"
    assert summary["num_planned"] == 40 and summary["num_not_sent"] == 40 - len(rows)

    for name in ("summary.json", "requests.parquet", "chunks.parquet"):
        (tmp_path / name).unlink()
    rebuilt = rebuild_summary(tmp_path)
    assert rebuilt["num_requests"] == len(rows)
    assert rebuilt["slo"] == {"ttft_s": 5.0}  # taken from the manifest
    assert rebuilt["status"] == "interrupted"  # and how the run ended
    assert rebuilt["num_planned"] == 40 and rebuilt["num_not_sent"] == 40 - len(rows)
    assert pq.read_table(tmp_path / "requests.parquet").num_rows == len(rows)


def test_rebuild_after_a_crash_mid_line(tmp_path: Path) -> None:
    trace = make_trace(6)
    run(trace, tmp_path)
    records = tmp_path / RECORDS_FILE
    text = records.read_text()
    records.write_text(text + text.splitlines()[0][:40])  # a crash in the middle of a write
    for name in ("summary.json", "requests.parquet", "chunks.parquet"):
        (tmp_path / name).unlink()
    summary = rebuild_summary(tmp_path, slo=Slo(e2e_s=30.0))
    assert summary["num_requests"] == 6 and summary["goodput"]["num_good"] == 6


def test_rebuild_without_anything_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"records\.jsonl"):
        rebuild_summary(tmp_path)


# ---------------------------------------------------------------- telemetry and config


def test_telemetry_runs_alongside_and_stops(tmp_path: Path) -> None:
    class Ticker:
        def __init__(self) -> None:
            self.ticks = 0
            self.stopped = False

        async def run(self, stop: asyncio.Event) -> None:
            while not stop.is_set():
                self.ticks += 1
                await asyncio.sleep(0.005)
            self.stopped = True

    ticker = Ticker()

    async def go() -> None:
        async with ScheduledStreamServer() as server:
            await replay(make_trace(4), ReplayConfig(target_url=server.url), tmp_path,
                         telemetry=ticker)

    asyncio.run(go())
    assert ticker.ticks > 0 and ticker.stopped


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"target_url": "localhost:8000"}, "target_url"),
    ({"protocol": "grpc"}, "protocol"),
    ({"mode": "closed"}, "concurrency"),
    ({"concurrency": 4}, "concurrency"),
    ({"mode": "closed", "concurrency": 2, "max_concurrency": 2}, "max_concurrency"),
    ({"max_concurrency": 0}, "max_concurrency"),
    ({"timeout_s": 0}, "timeout_s"),
    ({"api_key_env": "BATCHLAB_TEST_SURELY_UNSET"}, "api_key_env"),
    ({"http_client": "curl"}, "http_client"),
])
def test_config_errors_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    base: dict[str, Any] = {"target_url": "http://127.0.0.1:1"}
    with pytest.raises(ValueError, match=field):
        ReplayConfig(**{**base, **kwargs}).validate()


@pytest.mark.parametrize("http_client", ["lean", "httpx"])
def test_api_key_goes_in_the_header_and_nowhere_else(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, http_client: str) -> None:
    monkeypatch.setenv("BATCHLAB_TEST_KEY", "sk-secret-123")
    _, rows, server = run(make_trace(2), tmp_path, {"keep_bodies": True},
                          api_key_env="BATCHLAB_TEST_KEY", http_client=http_client)
    assert all(tl.ok for tl in rows)
    assert [h["authorization"] for h in server.stats.headers] == ["Bearer sk-secret-123"] * 2
    for path in tmp_path.iterdir():
        assert b"sk-secret-123" not in path.read_bytes(), path.name


# ---------------------------------------------------------------- command line


@pytest.fixture(scope="module")
def server_process() -> Iterator[str]:
    with loopback_process("--ttft-s", "0.01", "--itl-s", "0.01") as server:
        yield server.url


def test_cli_replay_and_summarize(tmp_path: Path, server_process: str,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    code = cli_main([
        "replay", "--target", server_process, "--protocol", "openai-chat", "--trace",
        "synthetic", "--num-requests", "8", "--rate", "50", "--prompt-tokens", "16",
        "--output-tokens", "4", "--mode", "closed", "--concurrency", "2",
        "--slo", "ttft_s=5", "--out", str(out),
    ])
    assert code == 0
    printed = capsys.readouterr().out
    assert "8/8 requests completed" in printed
    assert json.loads((out / "summary.json").read_text())["goodput"]["num_good"] == 8
    assert cli_main(["summarize", str(out), "--slo", "ttft_s=0.000001"]) == 0
    assert json.loads((out / "summary.json").read_text())["goodput"]["num_good"] == 0


def test_cli_user_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["replay", "--trace", "synthetic", "--num-requests", "2", "--rate", "1",
                     "--prompt-tokens", "4", "--output-tokens", "2"]) == 2
    assert "--target" in capsys.readouterr().err
    assert cli_main(["replay", "--target", "http://127.0.0.1:1", "--trace", "synthetic",
                     "--num-requests", "2", "--rate", "1", "--prompt-tokens", "4",
                     "--output-tokens", "2", "--mode", "closed"]) == 2
    assert "concurrency" in capsys.readouterr().err
    assert cli_main(["summarize", str(tmp_path)]) == 2


def test_ctrl_c_on_the_command_line(tmp_path: Path, server_process: str) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "replay", "--target", server_process,
         "--trace", "synthetic", "--num-requests", "200", "--rate", "20", "--prompt-tokens",
         "8", "--output-tokens", "40", "--out", str(out)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    records = out / RECORDS_FILE
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if records.exists() and len(read_records(records)) >= 3:  # finished, not just sent
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    rows = read_records(records)
    assert 3 <= len(rows) < 200
    assert json.loads((out / "manifest.json").read_text())["status"] == "interrupted"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_requests"] == len(rows)
    assert pq.read_table(out / "requests.parquet").num_rows == len(rows)


def test_a_replay_where_no_request_succeeded_fails_the_command(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Its files are kept (every failure counted), but the exit status says it is no
    measurement: a CI job must not pass on it."""
    import socket

    from harness.cli import main

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "run"
    assert main(["replay", "--target", f"http://127.0.0.1:{port}", "--trace", "synthetic",
                 "--num-requests", "3", "--rate", "50", "--prompt-tokens", "8",
                 "--output-tokens", "4", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "error: none of the 3 requests completed (connect_error 3); the first: " in err
    assert f"; is the server at http://127.0.0.1:{port} up?" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failures"] == {"connect_error": 3}
    # a job that reads only the summary, or the manifest, sees a failure, not a finished run
    manifest = json.loads((out / "manifest.json").read_text())
    assert summary["status"] == manifest["status"] == "failed"
    # the same words as a simulated run, a scenario cell or a capacity probe that served none
    assert manifest["error"].startswith("none of the 3 requests completed (connect_error 3); "
                                        "the first: ")
