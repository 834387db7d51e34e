"""Server lifecycle: launch an argv in its own process group, wait until ready, tear it all down.

No server outlives batchlab. Every launched server is its own session (``start_new_session``),
so one signal reaches it and every child it forked (vLLM's EngineCore and workers, TGI's
shards). Teardown sends SIGTERM to the group, waits, then SIGKILL to whatever is left of it. It
runs on normal exit, on failure, on Ctrl-C (``with`` blocks), on SIGTERM/SIGHUP to batchlab
(``terminate_on_signals``), and at interpreter exit as a last resort (``atexit``). When
batchlab itself is killed (SIGKILL, OOM), the kernel signals the leader (``PR_SET_PDEATHSIG``)
and a watchdog tears down the group (``adapters.ownership``).

The server batchlab measures is the one it started: the port must be free before launch, and
at ready the listening socket must belong to the launched group (Linux ``/proc``) and a server
that echoes ``launch_nonce`` in its version answer (``batchlab serve reference``) must echo
this launch's ``BATCHLAB_LAUNCH_NONCE``.

    batchlab ── Popen(start_new_session) ──► server (pgid = its pid)
                                               ├── child      } killpg(pgid, SIGTERM)
                                               └── grandchild }   ... grace ... killpg(SIGKILL)

stdout and stderr go to files in the run folder, so a failed start can quote the log's last
lines instead of "it did not come up". A server may print its argv and environment there, so
the logs are its owner's only (created 0600, an existing one's mode tightened): the run scrubs
them of its secrets when the server is gone (``harness.live.session``), never while it writes.
The logs of a run that was itself killed (SIGKILL, OOM) are never scrubbed: they stay as the
server wrote them, owner-only; batchlab keeps no secret's value, so no later command
(``summarize``, ``report``) can scrub them.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import httpx

from adapters.base import shown_url
from adapters.ownership import (
    describe_pid,
    die_with_parent,
    listener_pids,
    owned_by_group,
    port_in_use,
    release_reaper,
    start_reaper,
)

DEFAULT_GRACE_S = 20.0  # vLLM exits within about 8 s of SIGTERM on 2 CPU cores
LOG_TAIL_LINES = 30
NONCE_ENV = "BATCHLAB_LAUNCH_NONCE"  # echoed as "launch_nonce" by servers that support it


class EngineStartError(RuntimeError):
    """The server did not become ready: it died, or the readiness wait timed out."""


class EngineExited(RuntimeError):
    """A launched server exited while the run was replaying against it. Raised once what was
    measured is on disk; ``summary`` is the run's summary."""

    def __init__(self, message: str, summary: dict[str, Any]) -> None:
        super().__init__(message)
        self.summary = summary


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the OS picks it; a small race is accepted)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def tail(path: Path, num_lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a log file (empty if it does not exist)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read()
    except OSError:
        return ""
    lines = data.decode("utf-8", errors="replace").splitlines()
    return "\n".join(lines[-num_lines:])


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group; Linux /proc, else a signal-0 probe."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


LOG_MODE = 0o600  # a server log may hold secrets until the run scrubs it


def _private_log(path: Path) -> BinaryIO:
    """``path`` opened to append, readable and writable by its owner only: created with
    ``LOG_MODE``, and an existing one (an earlier launch's, appended to) tightened to it."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, LOG_MODE)
    with contextlib.suppress(OSError):  # another user's file we may write to: as it is
        os.fchmod(fd, LOG_MODE)
    return os.fdopen(fd, "ab")


_LIVE: set[ServerProcess] = set()
_LIVE_LOCK = threading.Lock()


def stop_all() -> None:
    """Tear down every server still running (atexit and signal paths)."""
    with _LIVE_LOCK:
        servers = list(_LIVE)
    for server in servers:
        server.stop()


atexit.register(stop_all)


@contextlib.contextmanager
def terminate_on_signals() -> Iterator[None]:
    """Turn SIGTERM/SIGHUP into SystemExit while the block runs, so ``finally`` teardown runs.

    Python's default for SIGTERM is to die without unwinding, which would orphan servers.
    A handler someone already installed (the command line turns these signals into Ctrl-C) is
    kept. Only possible from the main thread; elsewhere the block runs unchanged.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, _raise) for sig in (signal.SIGTERM, signal.SIGHUP)
                if signal.getsignal(sig) in (signal.SIG_DFL, None)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@dataclass(frozen=True, slots=True)
class ExitInfo:
    """How a server ended."""

    returncode: int | None  # None: could not be reaped
    signal_used: str  # "none" (it had exited), "SIGTERM", "SIGKILL"
    stop_s: float


class ServerProcess:
    """One launched server: argv in its own session, logs in ``log_dir``.

    ``listen`` (host, port) is where it will listen: the port must be free at ``start`` and,
    with ``check_listener``, held by this process group when it answers ready (a container
    runtime's proxy holds it instead, so launches with ``stop_argv`` skip that check).
    Use as a context manager; ``stop()`` is idempotent and safe to call from anywhere.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        log_dir: Path,
        name: str = "server",
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        grace_s: float = DEFAULT_GRACE_S,
        stop_argv: Sequence[str] = (),
        listen: tuple[str, int] | None = None,
        check_listener: bool = True,
    ) -> None:
        if isinstance(argv, str) or not argv:
            raise ValueError("argv must be a non-empty list of arguments, never a shell string")
        self.argv = tuple(str(a) for a in argv)
        self.log_dir = Path(log_dir)
        self.name = name
        self.env = dict(env or {})
        self.cwd = cwd
        self.grace_s = grace_s
        self.stop_argv = tuple(stop_argv)
        self.listen = listen
        self.check_listener = check_listener
        self.nonce = uuid.uuid4().hex
        self.stdout_path = self.log_dir / f"{name}.stdout.log"
        self.stderr_path = self.log_dir / f"{name}.stderr.log"
        self._popen: subprocess.Popen[bytes] | None = None
        self._exit: ExitInfo | None = None
        self._reaper: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------ start

    def start(self) -> None:
        if self.listen is not None and port_in_use(*self.listen):
            host, port = self.listen
            raise EngineStartError(
                f"{self.name}: port {port} on {host} is already in use by another server; "
                "batchlab measures only a server it started. Stop that server, or choose "
                "another --port (unset: a free one)")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env, NONCE_ENV: self.nonce}
        with _private_log(self.stdout_path) as out, _private_log(self.stderr_path) as err:
            try:
                self._popen = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    env=env,
                    cwd=self.cwd,
                    start_new_session=True,  # own session and process group: pgid == pid
                    preexec_fn=die_with_parent(),
                )
            except FileNotFoundError as exc:
                raise EngineStartError(
                    f"{self.name}: cannot start {self.argv[0]!r}: command not found "
                    f"(argv: {self.argv})"
                ) from exc
        self._reaper = start_reaper(self._popen.pid, self.grace_s)
        with _LIVE_LOCK:
            _LIVE.add(self)

    @property
    def pid(self) -> int | None:
        return None if self._popen is None else self._popen.pid

    @property
    def pgid(self) -> int | None:
        """The server's process group (its own session: the leader's pid)."""
        return self.pid

    def poll(self) -> int | None:
        """The exit code if the server process has exited, else None."""
        return None if self._popen is None else self._popen.poll()

    def log_tail(self, num_lines: int = LOG_TAIL_LINES) -> str:
        parts = []
        for path in (self.stderr_path, self.stdout_path):
            text = tail(path, num_lines)
            if text:
                parts.append(f"--- last lines of {path}:\n{text}")
        return "\n".join(parts) or "(the server wrote no output)"

    async def wait_ready(
        self, url: str, *, timeout_s: float, poll_s: float = 0.5, client: httpx.AsyncClient | None
        = None, version_url: str | None = None,
    ) -> float:
        """Poll ``url`` until it answers 200; return the seconds waited.

        Raises EngineStartError quoting the log when the process dies first or time runs out,
        and when the answer came from another server: the listener is not this process group,
        or ``version_url`` answers a ``launch_nonce`` that is not this launch's.
        """

        def died() -> str | None:
            code = self.poll()
            if code is None:
                return None
            return (f"{self.name} exited with code {code} before it was ready "
                    f"(argv: {list(self.argv)})\n{self.log_tail()}")

        waited = await wait_healthy(
            url, timeout_s=timeout_s, poll_s=poll_s, client=client, died=died,
            answered=self._foreign_listener,
            timeout_note=f"{self.name} not ready", detail=lambda: (
                f"; argv: {list(self.argv)})\n{self.log_tail()}"))
        if version_url is not None:
            await self._check_nonce(version_url, client)
        return waited

    def _foreign_listener(self) -> str | None:
        """Why the ready answer came from someone else's server, or None (ours, or unknown)."""
        if self.listen is None or not self.check_listener or self._popen is None:
            return None
        holders = listener_pids(self.listen[1])
        if holders is None or any(owned_by_group(pid, self._popen.pid) for pid in holders):
            return None
        others = ", ".join(describe_pid(pid) for pid in sorted(holders))
        return (f"{self.name}: port {self.listen[1]} answered ready, but it is held by "
                f"{others}, not by the server batchlab started (pid {self._popen.pid}); "
                "batchlab measures only its own server")

    async def _check_nonce(self, version_url: str, client: httpx.AsyncClient | None) -> None:
        own = client is None
        http = client or httpx.AsyncClient(timeout=httpx.Timeout(5.0), trust_env=False)
        try:
            body = (await http.get(version_url)).json()
        except (httpx.HTTPError, ValueError):
            return  # no version answer: nothing to compare
        finally:
            if own:
                await http.aclose()
        if isinstance(body, dict) and "launch_nonce" in body and body["launch_nonce"] != \
                self.nonce:
            raise EngineStartError(
                f"{self.name}: {shown_url(version_url)} answered for another launch (its "
                "launch_nonce is not this one's): another server holds the port; batchlab "
                "measures only its own server")

    # ------------------------------------------------------------ stop

    def stop(self, grace_s: float | None = None) -> ExitInfo | None:
        """SIGTERM the whole group, wait up to ``grace_s``, then SIGKILL what is left."""
        with self._lock:
            if self._popen is None or self._exit is not None:
                return self._exit
            grace = self.grace_s if grace_s is None else grace_s
            popen = self._popen
            pgid = popen.pid  # start_new_session: the group id is the leader's pid
            start = time.monotonic()
            used = "none"
            if popen.poll() is None or _group_members(pgid):
                used = "SIGTERM"
                self._signal_group(pgid, signal.SIGTERM)
                deadline = start + grace
                while time.monotonic() < deadline:
                    popen.poll()  # reap the leader so it stops counting as a member
                    if not _group_members(pgid):
                        break
                    time.sleep(0.05)
                else:
                    used = "SIGKILL"
                    self._signal_group(pgid, signal.SIGKILL)
                    kill_deadline = time.monotonic() + 5.0
                    while _group_members(pgid) and time.monotonic() < kill_deadline:
                        popen.poll()
                        time.sleep(0.05)
            if self.stop_argv:  # e.g. `docker rm -f NAME`: a container outlives its client
                with contextlib.suppress(OSError, subprocess.SubprocessError):
                    subprocess.run(
                        self.stop_argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                        timeout=30, check=False,
                    )
            try:
                code = popen.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                code = None
            self._exit = ExitInfo(code, used, time.monotonic() - start)
            release_reaper(self._reaper)  # the group is gone: the watchdog finds nothing
            self._reaper = None
            with _LIVE_LOCK:
                _LIVE.discard(self)
            return self._exit

    @staticmethod
    def _signal_group(pgid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---------------------------------------------------------------- probes


async def probe_version(
    base_url: str, paths: Sequence[str], *, client: httpx.AsyncClient | None = None
) -> dict[str, Any]:
    """Ask the server who it is: the first of ``paths`` that answers JSON.

    Returns ``{"version": str | None, "path": ..., "body": ...}``; ``version`` is None when no
    path answered (recorded as unknown, never guessed).
    """
    own = client is None
    http = client or httpx.AsyncClient(timeout=httpx.Timeout(10.0))
    tried: list[str] = []
    try:
        for path in paths:
            try:
                response = await http.get(base_url.rstrip("/") + path)
            except httpx.HTTPError as exc:
                tried.append(f"{path}: {type(exc).__name__}")
                continue
            if response.status_code != 200:
                tried.append(f"{path}: HTTP {response.status_code}")
                continue
            try:
                body = response.json()
            except ValueError:
                tried.append(f"{path}: not JSON")
                continue
            return {"version": _find_version(body), "path": path, "body": body}
        return {"version": None, "path": None, "body": None, "tried": tried}
    finally:
        if own:
            await http.aclose()


def _find_version(body: Any) -> str | None:
    """``version`` at the top (vLLM, TGI, TRT-LLM) or one level down (llama.cpp build_info)."""
    if isinstance(body, dict):
        for key in ("version", "build_info"):
            if isinstance(body.get(key), str | int | float):
                return str(body[key])
        for value in body.values():
            if isinstance(value, dict) and isinstance(value.get("version"), str):
                return str(value["version"])
    return None


async def wait_healthy(
    url: str,
    *,
    timeout_s: float,
    poll_s: float = 0.5,
    client: httpx.AsyncClient | None = None,
    died: Callable[[], str | None] | None = None,
    answered: Callable[[], str | None] | None = None,
    timeout_note: str = "no ready server",
    detail: Callable[[], str] = lambda: ")",
) -> float:
    """The one readiness wait: poll ``url`` until it answers 200; return the seconds waited.

    ``died`` (a launched server) returns why the server can no longer become ready, which is
    raised at once, also when it is found right after a 200 (then the answer came from
    another server); ``answered`` returns why a 200 did not come from the launched server.
    Otherwise EngineStartError names the last answer when time runs out.
    """
    start = time.monotonic()
    own = client is None
    http = client or httpx.AsyncClient(timeout=httpx.Timeout(5.0), trust_env=False)
    last_error = "no answer yet"
    try:
        while True:
            reason = died() if died is not None else None
            if reason is not None:
                raise EngineStartError(reason)
            try:
                response = await http.get(url)
                if response.status_code == 200:
                    for check in (died, answered):
                        reason = check() if check is not None else None
                        if reason is not None:
                            raise EngineStartError(reason)
                    return time.monotonic() - start
                last_error = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                last_error = type(exc).__name__
            waited = time.monotonic() - start
            if waited >= timeout_s:
                raise EngineStartError(
                    f"{timeout_note} after {timeout_s:g} s (last answer from "
                    f"{shown_url(url)}: {last_error}{detail()}")
            await asyncio.sleep(min(poll_s, max(0.0, timeout_s - waited)))
    finally:
        if own:
            await http.aclose()
