"""A run's ``report.md`` rendered by a child process started before the run.

Loading the report's plotting stack (matplotlib) and drawing a first figure costs about a
second of one core, and each figure a few tenths more. Started before the simulation (by
``batchlab simulate`` before it loads the engine, the results code and pyarrow), a child
process loads on another core meanwhile. As soon as the results files a figure is drawn from
are on disk, it forks a process that draws that figure
(``harness.report.render.draw_run_figure``, forked by ``harness.report.side_by_side``): the
forked process starts with the report code loaded and warm, and the figures are drawn side by
side, beside the parent writing the rest of the folder. The child writes ``report.md`` once
every result is on disk and every figure drawn, as ``batchlab report`` would. The child only
reads the folder, so a report that fails never costs a result::

    parent (the run)                              child process (main below)
    ReportProcess.start()  ── spawn ───────────►  import harness.report, draw a warm-up
    simulate                                      wait for a line on stdin
    write steps.parquet ── {"written": ...} ──►   (engine_state.png needs requests.parquet)
    write requests.parquet ───────────────────►   fork: latency_cdf.png; fork: engine_state.png
    write chunks.parquet ─────────────────────►   fork: throughput.png
    write summary.json, manifest.json
    folder_written() ── {"render": ...} ──────►   wait for the forked figures; write report.md
                                                  (figures drawn: kept; any that failed is
                                                  drawn again, and its error reported)
    wait()          ◄── {"status": "ok"} ─────    exit
    close(): the child and its forked figures are killed if they still run (Ctrl-C,
             SIGTERM, an error before render)

The child and the processes it forks are a process group of their own, which ``close`` kills
whole; Ctrl-C at a terminal reaches the parent alone, which stops them (the child ignores
SIGINT all the same). A parent that dies closes the child's stdin, and the child exits. A run
stopped after a file was written may keep the figure drawn from it, whole: a figure replaces
its file in one step (``harness.report.plots``), so one killed while drawn leaves none. Where
a process cannot be forked (no ``os.fork``), the child draws the figures itself, one after
another. A child that cannot import the report (no matplotlib) answers "unavailable" and the
run has no report, as in-process rendering had none; any other failure is raised in the
parent with the child's traceback (an OSError as an OSError, so the command line prints its
usual one-line error).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.report.side_by_side import SideBySide

# The child's command: `-c` rather than `-m`, which would run this module a second time
# beside the copy that importing the harness.sim package loads.
_CHILD = "import sys; from harness.sim.report_process import main; sys.exit(main())"
_REPO_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds the harness package


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP that arrive while the block runs are handled when it ends,
    by the handlers they would have met (a KeyboardInterrupt is then raised from the ``with``
    statement, after the block has run to its end). Used where a child process is started and
    kept: an interrupt between its fork and the line that keeps it would leave it unseen.

    Only Python-level handlers are held (signals ignored or left to the system are not
    touched), and only in the main thread, where Python runs them; elsewhere nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous: dict[int, Callable[[int, FrameType | None], Any]] = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        handler = signal.getsignal(sig)
        if callable(handler):
            previous[sig] = handler
            signal.signal(sig, lambda signum, _frame: held.append(signum))
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for signum in held:
            previous[signum](signum, None)


class ReportError(RuntimeError):
    """The child process could not render the report of ``run_dir``, whose results are on
    disk: ``reason`` says why in a line, ``detail`` is the child's traceback or error output
    ("" when it left none); the message carries both."""

    def __init__(self, run_dir: Path, reason: str, detail: str = "") -> None:
        self.run_dir, self.reason, self.detail = run_dir, reason, detail.rstrip()
        super().__init__(f"report.md of {run_dir} could not be rendered: {reason} (the "
                         f"results are on disk; `batchlab report {run_dir}` renders it "
                         "again)" + (f":\n{self.detail}" if self.detail else ""))


class ReportProcess:
    """A report renderer in a child process (module doc)."""

    def __init__(self, proc: subprocess.Popen[str], stderr: IO[str]) -> None:
        self._proc = proc
        self._stderr = stderr  # a file, not a pipe: nothing blocks while the parent simulates

    @classmethod
    def start(cls) -> ReportProcess | None:
        """The child, loading the report code from now on; None when no process can be
        started here (then render in this process)."""
        stderr = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed by close())
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(_REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        try:
            # a process group of its own, with the processes it forks to draw figures:
            # close() stops them all
            proc = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=stderr, text=True, env=env,
                                    process_group=0)
        except OSError:
            stderr.close()
            return None
        return cls(proc, stderr)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def file_written(self, run_dir: Path, name: str) -> None:
        """``run_dir/name`` is complete on disk: the figures drawn from it can be drawn."""
        self._send({"written": name, "run_dir": str(run_dir)})

    def folder_written(self, run_dir: Path) -> None:
        """Every result of ``run_dir`` is on disk: the child writes ``report.md`` (``wait``)."""
        self._send({"render": str(run_dir)})

    def wait(self, run_dir: Path) -> bool:
        """Wait for ``run_dir/report.md``; False when the child has no report code (no
        matplotlib). Raises what the child raised (module doc)."""
        out = ""
        with contextlib.suppress(OSError):  # a child gone already: its exit status says more
            out, _ = self._proc.communicate()
        self._stop_group()  # a child killed while figures were drawn leaves none drawing
        self._proc.wait()
        self._stderr.seek(0)
        err = self._stderr.read()
        answer = _parse_answer(out)
        if answer is None:
            raise ReportError(run_dir, "the report renderer exited with status "
                                       f"{self._proc.returncode} without an answer", err)
        if err.strip():  # warnings (a font cache being built): shown, as they were in-process
            sys.stderr.write(err)
        status = answer.get("status")
        if status == "ok":
            return True
        if status == "unavailable":
            return False
        if answer.get("errno") is not None:
            raise OSError(answer["errno"], answer.get("strerror"), answer.get("filename"))
        raise ReportError(run_dir, "the report renderer raised an error",
                          str(answer.get("traceback", "")))

    def close(self) -> None:
        """Stop the child if it still runs, and release its files. Safe to call twice."""
        if self._proc.returncode is None:
            self._stop_group()
            self._proc.wait()
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self._stderr.close()

    def _stop_group(self) -> None:
        """Kill the child and the figure processes it forked (its process group), if any
        still run. Only before the child is waited for: until then its process ID, the
        group's, cannot name another process."""
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except AttributeError:  # no process groups here (nor forked figures): the child
            with contextlib.suppress(OSError):
                self._proc.kill()
        except OSError:  # none left (ProcessLookupError)
            pass

    def _send(self, message: dict[str, Any]) -> None:
        stdin = self._proc.stdin
        if stdin is None or stdin.closed:
            return
        with contextlib.suppress(OSError):  # the child is gone: render() says why
            stdin.write(json.dumps(message) + "\n")
            stdin.flush()


def _parse_answer(text: str) -> dict[str, Any] | None:
    lines = text.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


# ---------------------------------------------------------------- the child


def main() -> int:
    """The child: warm up, draw figures as their files are announced, render on request."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops this process (close())
    answers = sys.stdout
    sys.stdout = sys.stderr  # nothing but the answer goes to the parent's pipe
    try:
        from harness.report.render import warm_up
        from harness.report.side_by_side import SideBySide
    except ImportError as exc:  # the report's optional dependencies are missing
        unavailable: str | None = str(exc)
    else:
        unavailable = None
        figures = SideBySide()
        with tempfile.TemporaryDirectory() as tmp:  # not when results arrive first (short runs)
            warm_up(Path(tmp), stop=lambda: bool(select.select([sys.stdin], [], [], 0)[0]))
    for line in sys.stdin:
        message = json.loads(line)
        if "render" not in message:
            if unavailable is None:
                start_figures(figures, Path(message["run_dir"]), message["written"])
            continue
        if unavailable is not None:
            answer: dict[str, Any] = {"status": "unavailable", "reason": unavailable}
        else:
            answer = _render(Path(message["render"]), figures.wait())
        answers.write(json.dumps(answer) + "\n")
        answers.flush()
        sys.stderr.flush()
        # the parent waits for this process to end: no interpreter teardown (matplotlib,
        # pandas), which takes longer than the report itself
        os._exit(0)
    return 0  # stdin closed: the run ended without a report to render


def start_figures(figures: SideBySide, run_dir: Path, written: str) -> None:
    """Start the run figures ``written`` was the last file of, each in a process forked from
    this one (``harness.report.side_by_side``): the report code is loaded and warm in each,
    and they are drawn side by side, on as many cores as the machine has, beside the parent
    writing the rest of the folder. Where there is no fork, one after another here, where one
    that fails is left to the render, which draws it again and reports its error."""
    from harness.report.render import draw_run_figure, run_figures_after

    for png in run_figures_after(written):
        with contextlib.suppress(Exception):
            figures.start(png, functools.partial(draw_run_figure, run_dir, png))


def _render(run_dir: Path, drawn: dict[str, bool]) -> dict[str, Any]:
    from harness.report.render import render_run_report

    try:
        render_run_report(run_dir, drawn=drawn)
    except OSError as exc:
        return {"status": "failed", "errno": exc.errno, "strerror": exc.strerror,
                "filename": None if exc.filename is None else str(exc.filename),
                "traceback": traceback.format_exc()}
    except Exception:  # reported to the parent, which raises it
        return {"status": "failed", "traceback": traceback.format_exc()}
    return {"status": "ok"}
