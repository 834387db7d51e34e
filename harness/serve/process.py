"""``batchlab serve reference`` in a child process, for benchmarks and tests whose timing must not
share a GIL with the server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass
class ReferenceChild:
    """A ``batchlab serve reference`` child process (no shared GIL with the caller)."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path  # its stdout and stderr

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM (a graceful shutdown), then SIGKILL if it is still there after timeout_s."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> ReferenceChild:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def launch_server_process(engine_args: Sequence[str] = (), *, host: str = "127.0.0.1",
                          log_path: str | Path | None = None,
                          startup_timeout_s: float = 60.0) -> ReferenceChild:
    """Start ``batchlab serve reference ENGINE_ARGS --port 0`` in a child process and wait until
    it prints its URL. For benchmarks and tests whose timing must not share a GIL with the
    server. Raises RuntimeError (with the log's tail) if it exits or does not start in time."""
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="batchlab-serve-", suffix=".log")
        os.close(fd)
        log_path = name
    path = Path(log_path)
    argv = [sys.executable, "-m", "harness.cli", "serve", "reference", *engine_args,
            "--host", host, "--port", "0"]
    with path.open("wb") as log_file:
        process = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + startup_timeout_s
    while True:
        text = path.read_text(errors="replace")
        found = re.search(r"listening on (http://\S+)", text)
        if found:
            return ReferenceChild(found.group(1), process, path)
        if process.poll() is not None or time.monotonic() > deadline:
            ReferenceChild("", process, path).stop()
            raise RuntimeError(f"batchlab serve reference did not start ({' '.join(argv)}):\n"
                               f"{text[-2000:]}")
        time.sleep(0.05)
