"""Launch ownership: batchlab measures only a server it started, records its pid and process
group, and no server outlives batchlab, even when batchlab is killed with SIGKILL.

The kill tests run real processes and look for survivors with ``ps``."""

from __future__ import annotations

import asyncio
import http.server
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.ownership import port_in_use
from adapters.process import EngineStartError, ServerProcess, free_port

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # http.server's name for it
        body = b'{"version": "someone else", "launch_nonce": null}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


def _serve_ok(port: int) -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def served_reference(bl: type) -> Iterator[int]:
    """`batchlab serve reference` started by hand (not by a launch): its port."""
    port = free_port()
    proc = subprocess.Popen(bl.batchlab("serve", "reference", "--port", str(port)),
                            cwd=bl.REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "listening on" in line, line
    try:
        yield port
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_a_busy_port_is_refused_before_anything_starts(tmp_path: Path,
                                                       served_reference: int, bl: type) -> None:
    """Issue case: `serve reference --port P &` then `replay --engine reference --launch
    --port P` measured the server already there and ended "finished" with rc 0."""
    out = tmp_path / "d1"
    result = bl.run("replay", "--engine", "reference", "--launch", "--port",
                    str(served_reference), *bl.SMALL_TRACE, "--out", str(out))
    assert result.returncode == 2
    assert f"port {served_reference} on 127.0.0.1 is already in use" in result.stderr
    manifest = bl.read_json(out / "manifest.json")
    assert manifest["status"] == "failed" and "already in use" in manifest["error"]
    assert not (out / "requests.parquet").exists()
    assert "pid" not in manifest["engine"]  # nothing was started


def test_port_in_use_is_a_bind_test() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert port_in_use("127.0.0.1", port)
    assert not port_in_use("127.0.0.1", port)


def test_ready_answered_by_another_process_is_refused(tmp_path: Path) -> None:
    """The port was free at launch, then someone else bound it and answered /health while the
    launched process was still starting: the listener's owner is checked (/proc)."""
    port = free_port()
    server = ServerProcess(SLEEPER, log_dir=tmp_path, listen=("127.0.0.1", port))
    with server:
        server.start()
        foreign = _serve_ok(port)
        try:
            with pytest.raises(EngineStartError, match=f"port {port} answered ready, but it "
                               f"is held by pid {os.getpid()}"):
                asyncio.run(server.wait_ready(f"http://127.0.0.1:{port}/health",
                                              timeout_s=30, poll_s=0.05))
        finally:
            foreign.shutdown()
            foreign.server_close()


def test_a_nonce_that_is_not_ours_is_refused(tmp_path: Path, served_reference: int) -> None:
    """The served reference echoes its launcher's nonce in /version; one started by hand
    echoes none. (The /proc check is off here, as for a containerised engine.)"""
    server = ServerProcess(SLEEPER, log_dir=tmp_path, check_listener=False)
    base = f"http://127.0.0.1:{served_reference}"
    with server:
        server.start()
        with pytest.raises(EngineStartError, match="answered for another launch"):
            asyncio.run(server.wait_ready(base + "/health", timeout_s=30, poll_s=0.05,
                                          version_url=base + "/version"))


def test_a_launch_records_pid_and_group_and_leaves_no_server(tmp_path: Path, bl: type) -> None:
    out = tmp_path / "run"
    result = bl.run("replay", "--engine", "reference", "--launch", *bl.SMALL_TRACE,
                    "--out", str(out))
    assert result.returncode == 0, result.stderr
    engine = bl.read_json(out / "manifest.json")["engine"]
    assert engine["pid"] > 1 and engine["pgid"] == engine["pid"]
    assert engine["version_probe"]["body"]["launch_nonce"]  # the launch's own, matched
    assert bl.wait_no_survivors({engine["pid"]}, engine["pgid"]) == []


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killing_batchlab_leaves_no_launched_server(tmp_path: Path, bl: type,
                                                    sig: signal.Signals) -> None:
    """Issue case: SIGKILL of batchlab left the launched server running (parent pid 1, port
    held). SIGTERM also ends the run as "interrupted"."""
    out = tmp_path / "run"
    proc = bl.start("replay", "--engine", "reference", "--launch", "--model", "llama-3.1-8b",
                    "--trace", "synthetic", "--num-requests", "2000", "--rate", "5",
                    "--prompt-tokens", "8", "--output-tokens", "64", "--out", str(out))
    server_pid = 0
    try:
        def running() -> int:
            manifest = bl.read_json(out / "manifest.json")
            engine = manifest.get("engine") or {}
            return int(engine.get("pid") or 0) if engine.get("status") == "running" else 0

        server_pid = bl.wait_for(running, "the launched server to be running")
        assert bl.ps_survivors({server_pid}), "the server should be alive while the run is"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == -sig if sig == signal.SIGKILL else 128 + sig, err
        assert bl.wait_no_survivors({server_pid}, server_pid) == []
        if sig == signal.SIGTERM:
            manifest = bl.read_json(out / "manifest.json")
            assert manifest["status"] == "interrupted"
            assert manifest["engine"]["exit"]["signal_used"] in ("SIGTERM", "SIGKILL")
    finally:
        if proc.poll() is None:
            proc.kill()
        bl.kill_quietly({server_pid} if server_pid else set())


def test_sigkill_of_the_launcher_takes_the_whole_group(tmp_path: Path, bl: type) -> None:
    """The kernel's parent-death signal reaches only the leader; the watchdog takes its
    children too (a server that forks workers, as vLLM and TGI do)."""
    script = tmp_path / "launcher.py"
    script.write_text(textwrap.dedent(f"""\
        import sys, time
        from pathlib import Path
        from adapters.process import ServerProcess
        server = ServerProcess(["sh", "-c", "sleep 300 & sleep 300 & wait"],
                               log_dir=Path({str(tmp_path)!r}), grace_s=2.0)
        server.start()
        print(server.pgid, flush=True)
        time.sleep(300)
        """))
    proc = subprocess.Popen([sys.executable, str(script)], cwd=bl.REPO,
                            stdout=subprocess.PIPE, text=True)
    pgid = 0
    try:
        assert proc.stdout is not None
        pgid = int(proc.stdout.readline())
        bl.wait_for(lambda: len(bl.ps_survivors(set(), pgid)) >= 3, "the group's 3 processes")
        proc.kill()  # SIGKILL: no atexit, no finally
        proc.wait(timeout=30)
        assert bl.wait_no_survivors(set(), pgid) == []
    finally:
        if proc.poll() is None:
            proc.kill()
        bl.kill_quietly({pgid} if pgid else set())
