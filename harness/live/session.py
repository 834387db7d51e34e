"""The one way a live engine is held for a run: launched and always torn down, or attached.

    with engine_session(spec, log_dir) as session:     # plan, start, one readiness wait
        session.plan.base_url ...                        # replay, calibrate, validate
    # SIGTERM, then SIGKILL, of the server's process group, however the block ends

A launch refuses a port something already listens on, and the ready answer must come from the
launched process group (``adapters.process.ServerProcess``): batchlab never measures a server
it did not start while believing it did.

A server that does not become ready raises ``EngineStartError`` quoting its argv and log tail:
scrubbed here of the plan's secrets and those the caller adds (the replay's API key:
``harness.redact``), so that no caller prints them. Every pass masks the run's whole set of
secrets at once: a first pass without the API key would mask only the head it shares with
another secret (``sk-PLANTED-``), and a later pass could no longer find the rest of it.

Used by ``run_live`` (one replay), ``calibrate`` and ``validate`` (several replays).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

from adapters.base import KnobError, Knobs, LaunchPlan, LogCheck
from adapters.catalog import ENGINES, make_adapter
from adapters.process import EngineStartError, ServerProcess, terminate_on_signals, wait_healthy
from harness.redact import redact_url, scrub_files, scrub_text, secret_values
from harness.target import TargetSpec

DEFAULT_READY_TIMEOUT_S = 900.0  # vLLM takes 60-110 s on 2 CPU cores; big models far longer
ATTACH_READY_TIMEOUT_S = 30.0


@dataclass(slots=True)
class EngineSession:
    """A ready engine: its plan, the server process when batchlab launched it, and the knobs
    its log showed it ignored (``ignored_knobs``)."""

    plan: LaunchPlan
    server: ServerProcess | None
    ready_s: float
    ignored: tuple[LogCheck, ...] = ()

    def ran_with(self, knobs: Knobs) -> Knobs:
        """``knobs`` as the engine runs with them (what a simulation of the same run must
        use): a knob its log showed it ignored has the value the engine ran with instead,
        and a knob left unset that the plan derived from it (``LogCheck.derived``) the value
        the plan passed, given from now on."""
        if not self.ignored:
            return knobs
        values = {check.knob: check.runs_with for check in self.ignored}
        passed = {m.knob: m.value for m in self.plan.mapping if m.status == "applied"}
        for check in self.ignored:
            values.update({name: passed[name] for name in check.derived
                           if not knobs.is_given(name) and isinstance(passed.get(name), int)})
        return replace(knobs, **values,
                       given=frozenset(knobs.given_names()) | frozenset(values))


@contextlib.contextmanager
def engine_session(spec: TargetSpec, log_dir: Path, *, plan: LaunchPlan | None = None,
                   on_start: Callable[[ServerProcess], None] | None = None,
                   secrets: frozenset[str] = frozenset(),
                   ) -> Iterator[EngineSession]:
    """Launch (or attach to) the engine ``spec`` describes and wait until it is ready.

    ``plan`` is ``plan_for(spec)`` when the caller already made it (to record it first);
    ``on_start`` sees a launched server as soon as it starts (to record its exit even when it
    never becomes ready); ``secrets`` are scrubbed from its logs and start error besides the
    plan's own (``plan_secrets``): the run's API key.
    A launched server's logs go to ``log_dir``; it is stopped when the block ends, also on
    an exception, Ctrl-C, SIGTERM or SIGHUP.
    """
    plan = plan or plan_for(spec)
    health = plan.base_url + plan.health_path
    secrets = plan_secrets(plan) | secrets
    if not plan.launch:
        # a running server answers at once or not at all: --ready-timeout-s may shorten the
        # wait, never lengthen it past ATTACH_READY_TIMEOUT_S (its 900 s default is a launch's)
        wait_s = min(ATTACH_READY_TIMEOUT_S, spec.ready_timeout_s or ATTACH_READY_TIMEOUT_S)
        with _scrubbed(secrets):
            ready_s = asyncio.run(wait_healthy(
                health, timeout_s=wait_s,
                timeout_note=f"no ready server at {redact_url(plan.base_url)}"))
        yield EngineSession(plan, None, ready_s)
        return
    log_dir.mkdir(parents=True, exist_ok=True)
    server = ServerProcess(plan.resolved_argv(str(log_dir.resolve())), log_dir=log_dir,
                           name=f"{plan.engine}-server", env=plan.env, stop_argv=plan.stop_argv,
                           listen=_listen_address(plan.base_url),
                           check_listener=not plan.stop_argv)
    version_url = plan.base_url + plan.version_paths[0] if plan.version_paths else None
    try:
        with terminate_on_signals(), server:
            with _scrubbed(secrets):
                # the logs are appended to: this launch's lines start at their sizes now
                starts = {path: _size(path) for path in (server.stdout_path, server.stderr_path)}
                server.start()
                if on_start is not None:
                    on_start(server)
                ready_s = asyncio.run(server.wait_ready(
                    health, timeout_s=spec.ready_timeout_s or DEFAULT_READY_TIMEOUT_S,
                    version_url=version_url))
            ignored = ignored_knobs(plan, starts)
            for check in ignored:
                print(f"warning: {plan.engine}: {check.knob} not applied: "
                      f"{scrub_text(check.note, secrets)}", file=sys.stderr)
            yield EngineSession(_marked_ignored(plan, ignored), server, ready_s, ignored)
    finally:  # the server is gone: its logs may have printed its argv or environment
        scrub_files(log_dir, secrets)


# how much of each server log is read for ``LogCheck``s: the start-up lines they look for
# come first, and a log can grow without bound
LOG_CHECK_BYTES = 4 << 20


def ignored_knobs(plan: LaunchPlan, logs: dict[Path, int]) -> tuple[LogCheck, ...]:
    """The plan's ``log_checks`` that the ready server's logs match: knobs it ignored.
    ``logs``: each log file (stdout, stderr) and the offset this launch's lines start at; up
    to ``LOG_CHECK_BYTES`` of each are read from there."""
    if not plan.log_checks:
        return ()
    text = ""
    for path, start in logs.items():
        with contextlib.suppress(OSError), path.open("rb") as f:
            f.seek(start)
            text += f.read(LOG_CHECK_BYTES).decode("utf-8", "replace") + "\n"
    return tuple(check for check in plan.log_checks if check.found_in(text))


def _marked_ignored(plan: LaunchPlan, ignored: tuple[LogCheck, ...]) -> LaunchPlan:
    """``plan`` with each knob the server ignored marked not applied in its mapping, with
    why: what a run records of it (validate, calibrate)."""
    if not ignored:
        return plan
    notes = {check.knob: check.note for check in ignored}
    return replace(plan, mapping=tuple(
        replace(m, status="not_applied", note=notes[m.knob]) if m.knob in notes else m
        for m in plan.mapping))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def plan_secrets(plan: LaunchPlan) -> frozenset[str]:
    """What of ``plan`` must not be shown: environment off the allow-list, secret flag values
    of its argv, its URL's credentials (``harness.redact.secret_values``)."""
    return secret_values(env=plan.env, argv=plan.argv, urls=(plan.base_url,))


@contextlib.contextmanager
def _scrubbed(secrets: frozenset[str]) -> Iterator[None]:
    """An ``EngineStartError`` raised in the block, raised again without ``secrets``: it
    quotes the server's argv and the last lines of its logs."""
    try:
        yield
    except EngineStartError as exc:
        said = str(exc)
        shown = scrub_text(said, secrets)
        if shown == said:
            raise
        raise EngineStartError(shown) from None


def _listen_address(base_url: str) -> tuple[str, int] | None:
    """(host, port) a launched server's base URL says it listens on."""
    parts = urlsplit(base_url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    return (parts.hostname or "127.0.0.1", port)


def plan_for(spec: TargetSpec) -> LaunchPlan:
    """The launch plan of a live target; raises KnobError for what cannot be honoured.

    Unset knobs are the engine's own defaults and are never refused. An attached server was
    configured by whoever started it: a knob given for it is refused unless approximation is
    allowed (then recorded as not applied); ``max_model_len`` is also the trace's clipping
    option, so it is accepted either way.
    """
    if spec.engine not in ENGINES:
        raise KnobError(f"unknown engine {spec.engine!r}; engines: {', '.join(ENGINES)}")
    if spec.mode == "simulate":
        raise KnobError(f"{spec.engine}: a simulated target has no launch plan")
    if (spec.mode == "attach") != (spec.url is not None):
        raise KnobError("give exactly one of --launch (start the engine) or --url URL (attach)")
    try:
        adapter = make_adapter(
            spec.engine, model=spec.model, served_model_name=spec.served_model_name,
            port=spec.port, env=spec.engine_env, executable=spec.executable,
            runtime=spec.runtime, metric_map=spec.metric_map, gpu=spec.gpu,
            profile=spec.profile, reference=spec.reference,
        )
    except ValueError as exc:
        raise KnobError(str(exc)) from None
    if spec.url is not None:
        given = [n for n in spec.knobs.given_names() if n != "max_model_len"]
        # the served reference's own settings cannot reach it either (its block size is 16
        # unless it was started with another: a scenario states 16 by default)
        given += [n for n, v in (("profile", spec.profile),
                                 ("admission", spec.reference.admission),
                                 ("num_gpu_blocks", spec.reference.num_gpu_blocks),
                                 ("swap_space_gib", spec.reference.swap_space_gib))
                  if v is not None]
        if given and not spec.allow_approximate:
            raise KnobError(
                f"{spec.engine} at {redact_url(spec.url)} was started outside batchlab, so "
                f"knobs cannot reach it ({', '.join(given)}). Set them where the server is "
                "started, or pass --allow-approximate to record them as not applied."
            )
        return adapter.attach(spec.url, spec.knobs)
    return adapter.plan(spec.knobs, allow_approximate=spec.allow_approximate)
