"""The one seam for running a trace: a ``Target`` the harness drives the same way whether it is
the simulated reference engine (virtual clock) or a live engine (launched or attached, over a
protocol).

    TargetSpec ─► harness.targets.make_target ─► sim.SimulatedTarget.run ─┐
                                                live.LiveTarget.run      ─┴─► run folder
    (run folder: requests.parquet, chunks.parquet, summary.json, manifest.json)

Either way the run folder has the same files and the same manifest fields, so ``scenario``,
``simulate``, ``replay`` and ``validate`` never branch on the mode: they build a ``TargetSpec``
and call ``run``. This module holds the records; the targets live beside the code they drive
(``harness.sim.target``, ``harness.live.target``) and ``harness.targets`` picks one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from adapters.knobs import Knobs, ReferenceKnobs
from harness.metrics import Slo

if TYPE_CHECKING:
    from harness.sim.report_process import ReportProcess
    from harness.traces import Trace

Mode = Literal["simulate", "launch", "attach"]
ProgressFn = Callable[[int, int], None]
UNSET = Knobs(given=frozenset())
NO_REFERENCE_KNOBS = ReferenceKnobs()


# Options of a live target that only some engines read (``adapters.catalog.get_adapter``), and
# those only a launch reads. Given where nothing reads them they would be ignored without a
# word, and the run folder would record a setting the engine never had: they are refused.
ENGINE_OPTIONS: Mapping[str, tuple[str, ...]] = {
    "runtime": ("tgi",),  # the container runtime of text-generation-launcher
    "executable": ("vllm", "trtllm", "llamacpp", "reference"),
    "metric_map": ("openai",),  # other engines' metric names are known
}
LAUNCH_OPTIONS = ("runtime", "executable", "engine_env", "port")


def unused_option(option: str, engine: str, value: object, *, launch: bool) -> str | None:
    """Why ``option`` (a ``TargetSpec`` field) given as ``value`` would not be used by
    ``engine``, launched or attached (``launch``); None when it is used, or not given (a false
    ``value``). ``runtime`` native is what every engine but TGI does: saying so changes
    nothing, and is accepted everywhere."""
    if not value or (option == "runtime" and value == "native"):
        return None
    engines = ENGINE_OPTIONS.get(option)
    if engines is not None and engine not in engines:
        return f"applies to {', '.join(engines)} only, not {engine}"
    if option in LAUNCH_OPTIONS and not launch:
        return "applies only to an engine batchlab launches, not to one it attaches to"
    return None


@dataclass(frozen=True, slots=True)
class TargetSpec:
    """What a trace runs on, and how: one typed record instead of long parameter lists.

    ``model`` is the catalog model (or config.json) for the simulated reference, and what a
    launched engine loads for a live one; requests carry ``served_model_name`` (default: model).
    """

    engine: str  # "reference" when simulated; an adapter name (vllm, tgi, ...) when live
    mode: Mode
    knobs: Knobs = UNSET
    reference: ReferenceKnobs = NO_REFERENCE_KNOBS  # the reference (simulated or served) only
    model: str = "llama-3.1-8b"
    served_model_name: str | None = None
    gpu: str | None = None
    profile: str | None = None  # the reference (simulated or served): profile name or path
    url: str | None = None  # attach: the running server
    allow_approximate: bool = False
    engine_env: Mapping[str, str] = field(default_factory=dict)
    executable: str | None = None
    runtime: str | None = None
    metric_map: str | Mapping[str, str] | None = None
    port: int | None = None
    ready_timeout_s: float | None = None
    telemetry_interval_s: float | None = None

    @property
    def simulated(self) -> bool:
        return self.mode == "simulate"


@dataclass(frozen=True, slots=True)
class ClosedLoop:
    """A closed loop: ``concurrency`` users, each sending its next request (the next one of the
    trace, in order) ``think_time_s`` after its last one ended. Trace arrival times are not
    used: a request's arrival is the instant its user sent it. The live ``--mode closed``
    replay has the same semantics (without think time)."""

    concurrency: int
    think_time_s: float = 0.0

    def validate(self) -> None:
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int) \
                or self.concurrency < 1:
            raise ValueError(f"concurrency: must be a positive integer, got {self.concurrency!r}")
        if not (isinstance(self.think_time_s, int | float) and math.isfinite(self.think_time_s)
                and self.think_time_s >= 0):
            raise ValueError(f"think_time_s: must be a number of seconds >= 0, got "
                             f"{self.think_time_s!r}")


@dataclass(frozen=True, slots=True)
class LoadState:
    """What an early-stop check sees of a run in progress (``t_s``: the run's clock)."""

    t_s: float
    num_sent: int  # requests handed to the engine so far
    num_done: int  # of those, finished or failed
    num_waiting: int | None = None  # the engine's waiting queue; None when not known
    send_lag_s: float | None = None  # live: how late the latest request went out

    @property
    def num_in_flight(self) -> int:
        return self.num_sent - self.num_done


# A reason to stop the run now (it is recorded), or None to go on.
EarlyStop = Callable[[LoadState], str | None]


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How one run is driven and recorded, whatever the target."""

    slo: Slo | None = None
    progress: ProgressFn | None = None
    command: Sequence[str] | None = None
    replay: Mapping[str, Any] = field(default_factory=dict)  # live: ReplayConfig fields
    write_report: bool = True  # a per-run report.md (scenarios write one report instead)
    overwrite: bool = False  # replace another run's folder (harness.runfolder.claim_run_dir)
    closed_loop: ClosedLoop | None = None  # simulated: N users instead of trace arrivals
    early_stop: EarlyStop | None = None  # checked now and then; a reason stops the run
    # simulated, with write_report: the report process the caller started before loading the
    # engine (harness.sim.report_process); the run uses and closes it. None: the run starts one
    report_process: ReportProcess | None = None


class Target(Protocol):
    """Runs a trace into a run folder and returns its summary (``summary.json``)."""

    spec: TargetSpec

    def run(self, trace: Trace, out_dir: Path, options: RunOptions) -> dict[str, Any]: ...
