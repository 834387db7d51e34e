"""``harness.cli.run``: main, then an exit that skips the interpreter's teardown but nothing
else (output flushed, exit handlers run, the exit status kept)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from adapters.reference.cost_model import shipped_profiles

REPO = Path(__file__).resolve().parents[3]


def _python(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False)


def test_piped_output_arrives_whole() -> None:
    done = _python("-m", "harness.cli", "profiles")
    assert done.returncode == 0, done.stderr
    for name in shipped_profiles():
        assert name in done.stdout
    assert done.stdout.rstrip().endswith("(docs/fidelity.md)")


def test_exit_handlers_run_and_the_status_is_kept() -> None:
    code = ("import atexit, sys\n"
            "from harness.cli import run\n"
            "atexit.register(lambda: print('exit handler ran', flush=True))\n"
            "sys.argv = ['batchlab', 'check-published', '--profile', 'no-such-profile']\n"
            "run()\n")
    done = _python("-c", code)
    assert done.returncode == 2
    assert "exit handler ran" in done.stdout
    assert "--profile" in done.stderr
