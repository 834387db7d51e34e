"""A second Ctrl-C to `batchlab serve reference` (uvicorn's forced exit): the open stream still
ends with the engine's shutdown error and `[DONE]`, the server exits 0, and the log has one
line for it, no traceback.

Issue case: two SIGINTs 0.3 s apart during a stream logged two ERROR tracebacks (the stream's
handler cancelled: "CancelledError: the server is shutting down", and the lifespan's)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[3]
WAIT_S = 120.0  # generous: the machine is shared; nothing below depends on speed
LONG = 5000  # tokens: about two minutes of 23 ms steps, far past the 5 s graceful period


def test_a_second_ctrl_c_ends_the_open_stream_quietly() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "serve", "reference", "--model", "llama-3.1-70b",
         "--gpu", "a100-80gb", "--tensor-parallel-size", "4", "--port", "0"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        assert "listening on " in line, line + proc.stderr.read()
        url = line.split("listening on ")[1].split()[0]

        events: list[str] = []
        first = threading.Event()
        failures: list[BaseException] = []

        def read() -> None:
            try:
                with httpx.stream("POST", url + "/v1/completions", trust_env=False,
                                  timeout=WAIT_S, json={"prompt": "hi", "stream": True,
                                                        "max_tokens": LONG}) as response:
                    for data in response.iter_lines():
                        if data.startswith("data: "):
                            events.append(data.removeprefix("data: "))
                            first.set()
            except BaseException as exc:  # a cut connection: asserted below
                failures.append(exc)
            finally:
                first.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert first.wait(WAIT_S) and not failures, failures
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)  # inside the graceful period: the second one forces the exit
        proc.send_signal(signal.SIGINT)
        reader.join(WAIT_S)
        assert not reader.is_alive() and not failures, failures
        assert proc.wait(timeout=WAIT_S) == 0
        stderr = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=WAIT_S)

    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["message"] == "the server is shutting down"
    assert "Traceback" not in stderr and "ERROR" not in stderr, stderr
    assert stderr.count("Forced exit") == 1, stderr
