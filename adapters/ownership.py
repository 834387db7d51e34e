"""Whose server is it: a free port before launch, the listener's owner at ready, no orphan after.

Three checks keep batchlab from measuring a server it did not start, and one mechanism keeps
a server it did start from outliving it, even when batchlab is killed with SIGKILL:

- ``port_in_use``: a bind test on the launch address before anything starts.
- ``listener_pids``: at ready, the pids holding the listening socket of the port (Linux:
  ``/proc/net/tcp{,6}`` inode matched against ``/proc/<pid>/fd``); ``owned_by_group`` says
  whether one of them belongs to the launched process group (or descends from its leader).
- ``die_with_parent``: a ``preexec_fn`` that sets ``PR_SET_PDEATHSIG`` (SIGTERM) on the
  launched leader, so the kernel signals it when batchlab dies. It reaches the leader only (and
  only while the thread that started it lives), so
- ``start_reaper``: a tiny watchdog process, in its own session, blocked reading a pipe whose
  write end only batchlab holds. When batchlab exits for any reason the pipe reaches EOF, and
  the watchdog sends SIGTERM to the server's whole process group, then SIGKILL after a grace.

    batchlab ──pipe──► reaper (own session)         kernel: PDEATHSIG ──► leader
        │                 │ EOF: killpg(TERM) … killpg(KILL)
        └──Popen──► server leader (pgid) ── children ── grandchildren
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

_PR_SET_PDEATHSIG = 1
_LISTEN = "0A"  # TCP state LISTEN in /proc/net/tcp

_REAPER = r"""
import os, signal, sys, time
pgid, grace = int(sys.argv[1]), float(sys.argv[2])
signal.signal(signal.SIGINT, signal.SIG_IGN)
sys.stdin.buffer.read()  # returns at EOF: batchlab closed the pipe, or died

def alive():
    try:
        os.killpg(pgid, 0)
    except OSError:
        return False
    return True

if alive():
    os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive():
        os.killpg(pgid, signal.SIGKILL)
"""


def port_in_use(host: str, port: int) -> bool:
    """Whether something listens on ``host:port`` (a bind test; TIME_WAIT does not count)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == _LISTEN and \
                    int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    inodes.discard("0")
    return inodes


def listener_pids(port: int) -> set[int] | None:
    """Pids holding a socket listening on ``port``; None when that cannot be told (no /proc,
    the listener in another network namespace, or its owner's fds not readable)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes}
    holders: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                if os.readlink(fd) in wanted:
                    holders.add(int(entry.name))
                    break
    return holders or None


def _stat_fields(pid: int) -> list[str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
    return stat[stat.rfind(")") + 2:].split()


def owned_by_group(pid: int, pgid: int) -> bool:
    """Whether ``pid`` is in process group ``pgid`` or descends from its leader."""
    seen = 0
    while pid > 1 and seen < 64:
        if pid == pgid:
            return True
        fields = _stat_fields(pid)
        if fields is None or len(fields) < 3:
            return False
        if int(fields[2]) == pgid:
            return True
        pid = int(fields[1])
        seen += 1
    return False


def describe_pid(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace").strip()
    except OSError:
        cmd = ""
    return f"pid {pid}" + (f" ({cmd[:80]})" if cmd else "")


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
        return prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` asking the kernel to SIGTERM the child when batchlab dies (Linux).

    The kernel tracks the *thread* that forked, so this is only used from the main thread
    (whose end is the process's end); elsewhere the reaper alone covers it."""
    prctl = _PRCTL
    if prctl is None or threading.current_thread() is not threading.main_thread():
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # batchlab died before the request took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def start_reaper(pgid: int, grace_s: float) -> subprocess.Popen[bytes] | None:
    """The watchdog for process group ``pgid`` (module doc); None if it cannot start.

    Close its stdin to let it go: it then tears down what is left of the group (normally
    nothing, after ``ServerProcess.stop``)."""
    try:
        return subprocess.Popen(
            [sys.executable, "-c", _REAPER, str(pgid), str(grace_s)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True,
        )
    except OSError:
        return None


def release_reaper(reaper: subprocess.Popen[bytes] | None, timeout_s: float = 5.0) -> None:
    """Close the watchdog's pipe and reap it."""
    if reaper is None:
        return
    with contextlib.suppress(OSError, ValueError):
        if reaper.stdin is not None:
            reaper.stdin.close()
    try:
        reaper.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        reaper.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            reaper.wait(timeout=1.0)
