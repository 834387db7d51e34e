"""Server lifecycle: readiness, log quoting on early death, group teardown, no orphans."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from adapters.process import (
    EngineStartError,
    ServerProcess,
    _group_members,
    free_port,
    probe_version,
    tail,
    wait_healthy,
)

PY = sys.executable
REPO = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    """Running, not a zombie (an orphan's zombie may linger if nothing reaps it here)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def wait_for_file(path: Path, timeout_s: float = 10.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text()
        time.sleep(0.02)
    raise AssertionError(f"{path} never appeared")


def http_server(port: int, directory: Path) -> list[str]:
    return [PY, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory",
            str(directory)]


def test_argv_must_be_a_list(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="never a shell string"):
        ServerProcess("python -m http.server", log_dir=tmp_path)
    with pytest.raises(ValueError):
        ServerProcess([], log_dir=tmp_path)


def test_ready_then_stopped_with_sigterm(tmp_path: Path) -> None:
    port = free_port()
    (tmp_path / "health").write_text("ok")
    server = ServerProcess(http_server(port, tmp_path), log_dir=tmp_path / "logs", name="web")
    with server:
        server.start()
        waited = asyncio.run(server.wait_ready(f"http://127.0.0.1:{port}/health", timeout_s=30))
        assert waited >= 0
        assert httpx.get(f"http://127.0.0.1:{port}/health").text == "ok"
        pid = server.pid
        assert pid is not None and os.getpgid(pid) == pid  # its own process group
    info = server.stop()  # idempotent: the with block already stopped it
    assert info is not None and info.signal_used == "SIGTERM"
    assert not alive(pid)
    assert (tmp_path / "logs" / "web.stderr.log").exists()


def test_early_death_quotes_the_log(tmp_path: Path) -> None:
    script = "import sys; print('loading weights'); " \
             "print('error: unrecognized argument --max-num-sqs', file=sys.stderr); sys.exit(3)"
    server = ServerProcess([PY, "-c", script], log_dir=tmp_path, name="eng")
    with server:
        server.start()
        with pytest.raises(EngineStartError) as err:
            asyncio.run(server.wait_ready(f"http://127.0.0.1:{free_port()}/health",
                                          timeout_s=60))
    message = str(err.value)
    assert "exited with code 3 before it was ready" in message
    assert "unrecognized argument --max-num-sqs" in message
    assert "loading weights" in message
    assert "eng.stderr.log" in message


def test_timeout_quotes_the_log_and_the_last_answer(tmp_path: Path) -> None:
    script = "import time; print('still compiling', flush=True); time.sleep(60)"
    server = ServerProcess([PY, "-c", script], log_dir=tmp_path, grace_s=2)
    with server:
        server.start()
        with pytest.raises(EngineStartError) as err:
            asyncio.run(server.wait_ready(f"http://127.0.0.1:{free_port()}/health",
                                          timeout_s=0.5, poll_s=0.1))
    assert "not ready after" in str(err.value)
    assert "ConnectError" in str(err.value)


def test_a_timeout_is_quoted_as_given() -> None:
    """1.5 s is not "2 s": the message says the timeout that was set."""
    with pytest.raises(EngineStartError) as err:
        asyncio.run(wait_healthy(f"http://127.0.0.1:{free_port()}/health", timeout_s=0.25,
                                 poll_s=0.05))
    assert "after 0.25 s" in str(err.value)


def test_missing_command_is_a_clear_error(tmp_path: Path) -> None:
    server = ServerProcess(["batchlab-no-such-engine", "--port", "1"], log_dir=tmp_path)
    with pytest.raises(EngineStartError, match="command not found"):
        server.start()


GROUP_SCRIPT = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "open(sys.argv[1], 'w').write('x'); time.sleep(600)", sys.argv[2]])
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.01)
    open(sys.argv[1], "w").write(str(child.pid))
    time.sleep(600)
""")


def test_whole_group_killed_even_a_child_that_ignores_sigterm(tmp_path: Path) -> None:
    pid_file, ready_file = tmp_path / "child.pid", tmp_path / "child.ready"
    # the child writes the ready file once it ignores SIGTERM; the leader then its pid
    server = ServerProcess([PY, "-c", GROUP_SCRIPT, str(pid_file), str(ready_file)],
                           log_dir=tmp_path, grace_s=1.0)
    with server:
        server.start()
        child_pid = int(wait_for_file(pid_file))
        leader = server.pid
        assert leader is not None and alive(child_pid)
        assert os.getpgid(child_pid) == leader
        info = server.stop()
    assert info is not None and info.signal_used == "SIGKILL"
    assert not alive(child_pid) and not alive(leader)
    assert _group_members(leader) == []


def _driver(tmp_path: Path, ending: str) -> subprocess.Popen[bytes]:
    """A batchlab-like process that launches a server, then ends as ``ending`` says."""
    code = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from adapters.process import ServerProcess, terminate_on_signals
        out = Path({str(tmp_path)!r})
        server = ServerProcess([sys.executable, "-c", "import time; time.sleep(600)"],
                               log_dir=out, grace_s=5)
        ending = {ending!r}
        if ending == "atexit":
            server.start()
            (out / "server.pid").write_text(str(server.pid))
            sys.exit(0)  # no stop(): the atexit hook must do it
        with terminate_on_signals(), server:
            server.start()
            (out / "server.pid").write_text(str(server.pid))
            time.sleep(600)
    """)
    return subprocess.Popen([PY, "-c", code], cwd=REPO, stderr=subprocess.PIPE)


@pytest.mark.parametrize("ending", ["SIGTERM", "SIGINT", "SIGHUP", "atexit"])
def test_no_server_outlives_its_launcher(tmp_path: Path, ending: str) -> None:
    driver = _driver(tmp_path, ending)
    try:
        server_pid = int(wait_for_file(tmp_path / "server.pid", 30))
        if ending != "atexit":
            assert alive(server_pid)
            driver.send_signal(getattr(signal, ending))
        driver.wait(timeout=30)
        assert not alive(server_pid), driver.stderr.read().decode() if driver.stderr else ""
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()


def test_tail_reads_the_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert tail(log, 3) == "line 97\nline 98\nline 99"
    assert tail(tmp_path / "missing.log") == ""


def test_probe_version_takes_the_first_json_answer() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/version":
            return httpx.Response(404)
        if request.url.path == "/info":
            return httpx.Response(200, json={"version": "3.3.6", "sha": "abc"})
        return httpx.Response(500)

    async def go() -> dict[str, object]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await probe_version("http://e", ("/version", "/info"), client=client)

    result = asyncio.run(go())
    assert result["version"] == "3.3.6" and result["path"] == "/info"


def test_probe_version_unknown_is_none_not_a_guess() -> None:
    async def go() -> dict[str, object]:
        transport = httpx.MockTransport(lambda r: httpx.Response(404))
        async with httpx.AsyncClient(transport=transport) as client:
            return await probe_version("http://e", ("/version",), client=client)

    result = asyncio.run(go())
    assert result["version"] is None and result["tried"] == ["/version: HTTP 404"]
