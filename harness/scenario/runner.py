"""Running a scenario's cells here: resume, failed cells recorded, progress lines, the report."""

from __future__ import annotations

import contextlib
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from harness.behind import fell_behind_warning
from harness.redact import redact_tree
from harness.results import REPORT_FILE, REPORT_PLOTS, write_json_atomic
from harness.runfolder import check_each, holding_dir, refuse_results_folder
from harness.scenario._text import REPO_ROOT, display_path, exception_reason
from harness.scenario.cell import CellJob, CellRunner, run_cell
from harness.scenario.expand import load_cell_trace, select
from harness.scenario.ray import run_ray
from harness.scenario.schema import SCENARIO_FILE, Cell, LoadPoint, Scenario, ScenarioError
from harness.scenario.status import (
    ERROR_FILE,
    CellOutcome,
    check_cell_dir,
    check_done_cell,
    finish_status,
    interrupted_reason,
    mark_pending,
    prepare_cell_dir,
    read_status,
)


class SweepProgress:
    """Cells done out of the total and, for the current cell, requests done, elapsed, ETA.

    On a terminal: two tqdm bars. Otherwise: plain lines, at most one every few seconds.
    """

    def __init__(self, num_cells: int, *, stream: TextIO | None = None,
                 tty: bool | None = None, interval_s: float = 5.0) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.num_cells = num_cells
        self.num_done = 0
        self.interval_s = interval_s
        self._cell = ""
        self._started = 0.0
        self._last_line = 0.0
        self._cells_bar: Any = None
        self._req_bar: Any = None
        if self.tty and num_cells:
            from tqdm import tqdm

            self._cells_bar = tqdm(total=num_cells, desc="cells", unit="cell", position=0,
                                   file=self.stream, leave=True)

    def start_cell(self, name: str, num_requests: int | None = None) -> None:
        self._cell = name
        self._started = self._last_line = time.monotonic()
        if self._cells_bar is not None:
            from tqdm import tqdm

            self._cells_bar.set_postfix_str(name)
            self._req_bar = tqdm(total=num_requests, desc=name, unit="req", position=1,
                                 file=self.stream, leave=False)
        else:
            self._line(f"{name}: started" + (f" ({num_requests} requests)"
                                              if num_requests else ""))

    def requests(self, done: int, total: int | None = None) -> None:
        """Called by the cell as requests finish (total may be given the first time)."""
        if self._req_bar is not None:
            if total is not None and self._req_bar.total != total:
                self._req_bar.total = total
            self._req_bar.n = done
            self._req_bar.refresh()
            return
        now = time.monotonic()
        if now - self._last_line < self.interval_s:
            return
        self._last_line = now
        elapsed = now - self._started
        text = f"{self._cell}: {done}" + (f"/{total}" if total else "") + " requests"
        text += f", {elapsed:.0f} s elapsed"
        if total and done:
            text += f", ETA {elapsed * (total - done) / done:.0f} s"
        self._line(text)

    def finish_cell(self, name: str, state: str, reason: str = "") -> None:
        self.num_done += 1
        elapsed = time.monotonic() - self._started if self._started else 0.0
        if self._req_bar is not None:
            self._req_bar.close()
            self._req_bar = None
        if self._cells_bar is not None:
            self._cells_bar.update(1)
            if state != "done":
                self._cells_bar.write(f"{name}: {state}: {reason}", file=self.stream)
            return
        suffix = f" in {elapsed:.1f} s" if state == "done" else f": {reason}"
        self._line(f"{name}: {state}{suffix}")

    def skip_cell(self, name: str, why: str) -> None:
        self.num_done += 1
        if self._cells_bar is not None:
            self._cells_bar.update(1)
        else:
            self._line(f"{name}: skipped ({why})")

    def message(self, text: str) -> None:
        if self._cells_bar is not None:
            self._cells_bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        for bar in (self._req_bar, self._cells_bar):
            if bar is not None:
                bar.close()
        self._req_bar = self._cells_bar = None

    def _line(self, text: str) -> None:
        print(f"[{self.num_done}/{self.num_cells}] {text}", file=self.stream, flush=True)


@dataclass(frozen=True, slots=True)
class SweepResult:
    """What a sweep did: its folder, its report, and how each cell ended (in scenario order)."""

    scenario_dir: Path
    report: Path | None
    outcomes: tuple[CellOutcome, ...]

    @property
    def num_failed(self) -> int:
        return sum(1 for o in self.outcomes if o.state == "failed")


def scenario_command(scenario: Scenario, out_root: Path, only: str | None = None) -> list[str]:
    """The ``batchlab run`` argv that reproduces the sweep, or one cell of it with ``only``."""
    argv = ["batchlab", "run", display_path(scenario.source)]
    if scenario.trace_override is not None:  # the file's own trace alone is another sweep
        # as the scenario's path: from the repository, else absolute (not from where the
        # command happened to be typed)
        argv += ["--trace", display_path(Path(scenario.trace_override).resolve())]
    if Path(out_root).resolve() != (REPO_ROOT / "reports").resolve():
        argv += ["--out", str(out_root)]
    if only:
        argv += ["--only", only]
    return argv


def run_scenario(
    scenario: Scenario,
    out_root: str | Path = "reports",
    *,
    only: str | Sequence[str] | None = None,
    resume: bool = False,
    ray_address: str | None = None,
    use_ray: bool = False,
    runner: CellRunner | None = None,
    progress: SweepProgress | None = None,
    write_report: bool = True,
) -> SweepResult:
    """Run the scenario's cells (those matching ``only``) and write the comparative report.

    Each cell runs into ``<out>/<scenario>/<cell>/`` (a run folder, the same files as
    ``batchlab simulate`` or ``batchlab replay`` write), then ``<out>/<scenario>/report.md``
    compares them. A cell that raises is recorded as failed with its reason and the sweep goes
    on; Ctrl-C (KeyboardInterrupt) stops the sweep and marks the current cell "interrupted", which
    ``resume=True`` redoes.
    """
    out_root = Path(out_root)
    scenario_dir = out_root / scenario.name
    all_cells = scenario.cells()
    chosen = select(all_cells, only)
    if not chosen:
        names = ", ".join(c.name for c in all_cells)
        raise ScenarioError(scenario.source, None, "--only",
                            f"no cell matches {only!r}; cells: {names}")
    meta = scenario.as_dict()
    # the command that ran these cells: with --only when it left cells out, so that running it
    # again never starts cells (live engines, GPUs) the user did not ask for
    picked = None if len(chosen) == len(all_cells) else (
        only if isinstance(only, str) else ",".join(only or ()))
    meta["command"] = scenario_command(scenario, out_root, picked)
    # what each cell's results must have been made from: the report flags a cell on disk
    # made from an earlier definition (one --only or --resume left as it was)
    meta["digests"] = {c.name: scenario.cell_digest(c) for c in all_cells}
    # and each cell's definition, as its cell.json will hold it: a cell not run yet (a sweep
    # stopped before it, or left out by --only) is reported with its engine and load
    meta["definitions"] = {c.name: redact_tree(c.as_dict()) for c in all_cells}

    progress = progress or SweepProgress(len(chosen))
    # one sweep writes the folder at a time (harness.runfolder.holding_dir): one already there
    # is held before its cells are read (resume), a new one as soon as it is made
    with contextlib.ExitStack() as holding:
        # another run's folder, a capacity search's, or one inside a run's: refused before
        # anything in it is locked, read, written or deleted (a scenario's own is resumed)
        refuse_results_folder(scenario_dir, allow=("scenario",))
        if scenario_dir.is_dir():
            holding.enter_context(holding_dir(scenario_dir))
        todo, outcomes = _cells_to_run(scenario, scenario_dir, chosen, resume, progress)
        _refuse_unplannable(scenario, todo)
        traces: dict[LoadPoint, Any] = {}
        for cell in todo:
            if cell.load not in traces:
                traces[cell.load] = load_cell_trace(scenario, cell.load)
        _refuse_rejected(scenario, todo, traces)
        # a folder of the user's files, or one being written: refused now, every one named
        check_each((scenario_dir / cell.name for cell in todo), _check_cell_folder)
        # only now, with every check passed and every trace read: a run refused above leaves
        # the folder (and the definition of results already in it) as it was
        holding.enter_context(holding_dir(scenario_dir))
        write_json_atomic(meta, scenario_dir / SCENARIO_FILE)
        # the last sweep's report no longer describes the folder: gone until this sweep's is
        # written (also when it is interrupted), so that no report outlives what it says; its
        # figures with it
        for left in (REPORT_FILE, *REPORT_PLOTS):
            (scenario_dir / left).unlink(missing_ok=True)
        # and the cells to run again are pending: a sweep stopped before it reached one leaves
        # it not run, not an earlier sweep's figures read as this one's (they stay on disk)
        for cell in todo:
            mark_pending(scenario_dir / cell.name)
        outcomes.update(_run_cells(scenario, scenario_dir, out_root, todo, traces,
                                   use_ray=use_ray, ray_address=ray_address,
                                   runner=runner or run_cell, progress=progress,
                                   write_report=write_report))
        report = write_scenario_report(scenario_dir) if write_report else None
    ordered = tuple(
        outcomes.get(c.name, CellOutcome(c.name, "not_run", "not selected by --only"))
        for c in all_cells
    )
    return SweepResult(scenario_dir=scenario_dir, report=report, outcomes=ordered)


def _check_cell_folder(cell_dir: Path) -> None:
    """RunDirError unless the sweep may (re)write ``cell_dir``: none there, or a cell's
    (``refuse_results_folder``: not another run's folder, a scenario's or a capacity
    search's, each named as what it is), that ``check_cell_dir`` lets it empty."""
    refuse_results_folder(cell_dir, "cell folder", allow=("cell",),
                          instead="move it, or choose another --out")
    check_cell_dir(cell_dir)


def _cells_to_run(scenario: Scenario, scenario_dir: Path, chosen: Sequence[Cell], resume: bool,
                  progress: SweepProgress) -> tuple[list[Cell], dict[str, CellOutcome]]:
    """The chosen cells to run, and those kept (``resume``: finished earlier, intact, and,
    attached to a server, measured while it reported what it reports now)."""
    todo: list[Cell] = []
    outcomes: dict[str, CellOutcome] = {}
    server = _ServerNow(scenario)
    for cell in chosen:
        cell_dir = scenario_dir / cell.name
        status = read_status(cell_dir)
        if (resume and status.get("state") == "done"
                and status.get("digest") == scenario.cell_digest(cell)):
            damage = check_done_cell(cell_dir, status) or server.changed(cell, cell_dir)
            if not damage:
                progress.skip_cell(cell.name, "finished earlier")
                outcomes[cell.name] = CellOutcome(cell.name, "skipped", "finished earlier",
                                                  cell_dir)
                continue
            progress.message(f"{cell.name}: finished earlier, but {damage}: running it again")
        todo.append(cell)
    return todo, outcomes


class _ServerNow:
    """What the attached servers of a sweep's cells report about themselves now, each asked
    once (``harness.scenario.attached``)."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.now: dict[tuple[str, str], dict[str, Any] | None] = {}

    def changed(self, cell: Cell, cell_dir: Path) -> str:
        """Why a finished cell attached to a server cannot be kept ('' when it can): the
        server reported another configuration (knobs, model, engine version) when the cell
        was measured than it reports now. Its url and knobs are the cell's definition, its
        configuration is not: restarted with other settings, it answers another question."""
        from harness.scenario.attached import changed_since, identity_now, is_attached
        from harness.scenario.cell import target_spec

        if cell.engine.mode != "live":
            return ""
        spec = target_spec(cell, self.scenario.model, self.scenario.gpu)
        if not is_attached(spec) or spec.url is None:
            return ""
        key = (spec.engine, spec.url)
        if key not in self.now:
            self.now[key] = identity_now(spec)
        changes = changed_since(cell_dir, self.now[key])
        if not changes:
            return ""
        return (f"the server at {spec.url} reports another configuration now than when it "
                f"was measured (changed: {'; '.join(changes)})")


def _run_cells(scenario: Scenario, scenario_dir: Path, out_root: Path, todo: Sequence[Cell],
               traces: Mapping[LoadPoint, Any], *, use_ray: bool, ray_address: str | None,
               runner: CellRunner, progress: SweepProgress,
               write_report: bool) -> dict[str, CellOutcome]:
    """Run ``todo`` here or on Ray. Ctrl-C stops the sweep: the report of what finished is
    written first (``write_report``; a second Ctrl-C skips it)."""
    def job_for(cell: Cell) -> CellJob:
        return CellJob(
            cell=cell, trace=traces[cell.load], model=scenario.model, gpu=scenario.gpu,
            slo=scenario.slo,
            command=tuple(scenario_command(scenario, out_root, cell.name)),
        )

    outcomes: dict[str, CellOutcome] = {}
    try:
        if use_ray:
            outcomes.update(run_ray(scenario, scenario_dir, [job_for(c) for c in todo],
                                    ray_address, progress))
        else:
            for cell in todo:
                outcomes[cell.name] = _run_local(scenario, scenario_dir, job_for(cell),
                                                 runner, progress)
    except KeyboardInterrupt:
        progress.close()
        if write_report:  # what finished, and which cells did not; a second Ctrl-C skips it
            with contextlib.suppress(Exception, KeyboardInterrupt):
                write_scenario_report(scenario_dir)
        raise
    finally:
        progress.close()
    return outcomes


def _refuse_rejected(scenario: Scenario, cells: Sequence[Cell],
                     traces: Mapping[LoadPoint, Any]) -> None:
    """A simulated cell whose engine would reject requests of its trace as too long for its
    max_model_len is refused before any cell runs: the trace's own max_model_len and
    on_too_long say what to do with them (drop or clip), the engine's knob cannot."""
    from harness.scenario.cell import reference_config

    for cell in cells:
        if cell.engine.mode != "simulated":
            continue
        limit = reference_config(cell, scenario.model, scenario.gpu).resolved_max_model_len
        requests = traces[cell.load].requests
        too_long = [r for r in requests
                    if r.num_prompt_tokens + r.num_output_tokens > limit]
        if too_long:
            first = too_long[0]
            where = _max_model_len_key(scenario, cell)
            raise ScenarioError(
                scenario.source, scenario.line_of(where, "trace"), where,
                f"cell {cell.name}: {len(too_long)} of {len(requests)} requests of its trace "
                f"need more than its engine's max_model_len ({limit}; first: request "
                f"{first.request_id}, {first.num_prompt_tokens} prompt + "
                f"{first.num_output_tokens} output tokens) and would be rejected; give the "
                f"trace max_model_len: {limit} with on_too_long: drop or clip")


def _max_model_len_key(scenario: Scenario, cell: Cell) -> str:
    """The key that set a cell's engine max_model_len: the engine's knob, the grid's, else
    (the model's own length) the trace, whose max_model_len and on_too_long can fit it."""
    engine = scenario.engine_key(cell.engine)
    if "max_model_len" in cell.grid:
        return "grid.max_model_len"
    if "max_model_len" in cell.engine.knobs:
        return f"{engine}.knobs.max_model_len"
    return "trace"


def _refuse_unplannable(scenario: Scenario, cells: Sequence[Cell]) -> None:
    """A live cell whose knobs its engine cannot take (a knob for an attached server) is
    refused before any cell runs, naming the engine's line, rather than failing mid-sweep."""
    from adapters.knobs import KnobError
    from harness.live.session import plan_for
    from harness.scenario.cell import target_spec

    for cell in cells:
        if cell.engine.mode == "simulated":
            continue
        try:
            plan_for(target_spec(cell, scenario.model, scenario.gpu))
        except KnobError as exc:  # anything else fails the cell when it runs, as it did
            said = str(exc).replace("pass --allow-approximate",
                                    "set allow_approximate: true on the engine")
            raise ScenarioError(scenario.source, cell.engine.line,
                                scenario.engine_key(cell.engine),
                                f"cell {cell.name}: {said}") from None


def _run_local(scenario: Scenario, scenario_dir: Path, job: CellJob, runner: CellRunner,
               progress: SweepProgress) -> CellOutcome:
    cell = job.cell
    cell_dir = scenario_dir / cell.name
    attempt = int(read_status(cell_dir).get("attempt", 0)) + 1
    prepare_cell_dir(cell_dir, scenario, cell, attempt)
    status = read_status(cell_dir)
    progress.start_cell(cell.name, len(job.trace.requests))
    try:
        runner(job, cell_dir, progress.requests)
    except KeyboardInterrupt as exc:  # the sweep stops; the cell says it did not finish
        finish_status(cell_dir, "interrupted", interrupted_reason(exc), status)
        raise
    except Exception as exc:  # a failed cell is data: record it and go on
        reason = exception_reason(exc)
        (cell_dir / ERROR_FILE).write_text(traceback.format_exc())
        finish_status(cell_dir, "failed", reason, status)
        progress.finish_cell(cell.name, "failed", reason)
        return CellOutcome(cell.name, "failed", reason, cell_dir)
    finish_status(cell_dir, "done", "", status)
    progress.finish_cell(cell.name, "done")
    behind = fell_behind_warning(cell_dir)
    if behind:
        progress.message(f"warning: {cell.name}: {behind}")
    return CellOutcome(cell.name, "done", "", cell_dir)


def write_scenario_report(scenario_dir: Path) -> Path:
    """Render ``<scenario_dir>/report.md`` from what is on disk."""
    from harness.report import render_scenario_report

    return render_scenario_report(scenario_dir)
