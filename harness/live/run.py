"""A live run against a real engine: plan, record, launch (or attach), replay, always tear down.

    knobs ──► adapter.plan ──► LaunchPlan ──► manifest.json (argv, config, mapping, ...)
                                   │
                                   ▼
              ServerProcess (own process group, logs in the run folder)
                                   │ wait_ready (/health) ── probe_version (/version, /info)
                                   ▼
              harness.live.replay.replay(trace, ..., telemetry=TelemetryScraper) ──► run folder
                                   │
                                   ▼
              teardown: SIGTERM ─► SIGKILL the group (also on failure, Ctrl-C, SIGTERM)

The run folder is claimed first (``harness.runfolder``: another run's folder is refused unless
``overwrite``); the manifest records the server's pid and process group as soon as it starts.
Secrets (engine environment off the allow-list, secret flag values, the API key) are redacted
in the manifest and scrubbed from the server logs and error messages (``harness.redact``).

``--dry-run`` stops after planning: it prints the argv, the generated config file, the
mapping and what the trace's priorities become, with the same secrets redacted, and starts
nothing. Priorities an engine would answer with HTTP 400 (vLLM under a policy other than
priority) are not sent, and the manifest's ``priority`` says so
(``harness.live.protocols.plan_priority``).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, TextIO

from adapters.base import Knobs, LaunchPlan, MappedKnob
from adapters.catalog import UNKNOWN_KNOB, attached_manifest, replay_defaults
from adapters.process import EngineExited, EngineStartError, ServerProcess, probe_version
from harness.live.replay import ReplayConfig, replay
from harness.live.rundir import with_engine_counters
from harness.live.session import EngineSession, engine_session, plan_for
from harness.live.telemetry import DEFAULT_INTERVAL_S, TELEMETRY_FILE, TelemetryScraper, source_for
from harness.manifest import (
    jsonable,
    read_manifest,
    run_fields,
    trace_manifest,
    update_manifest,
)
from harness.redact import (
    redact_argv,
    redact_env,
    redact_tree,
    scrub_files,
    scrub_text,
    secret_values,
)
from harness.results import SUMMARY_FILE, write_json_atomic
from harness.runfolder import RunIdentity, claim_run_dir, release_run_dir
from harness.target import EarlyStop, LoadState, RunOptions, TargetSpec
from harness.traces import Trace


def _engine_manifest(plan: LaunchPlan, knobs: Knobs, trace: Trace, *, model: str,
                     allow_approximate: bool, argv: Sequence[str], gpu: str | None,
                     command: Sequence[str] | None) -> dict[str, Any]:
    return {
        **run_fields("live", command),
        "engine": {
            "name": plan.engine,
            "mode": "launch" if plan.launch else "attach",
            "base_url": plan.base_url,
            "protocol": plan.protocol,
            "model": model,
            "served_model_name": plan.model,
            "version": None,
            "status": "starting",
            "notes": list(plan.notes),
        },
        "launch": {
            "argv": list(argv),
            "env": redact_env(plan.env),
            "config_files": dict(plan.config_files),
            "stop_argv": list(plan.stop_argv),
            "launcher": plan.launcher or None,  # which program starts the engine, and why
        } if plan.launch else None,
        "knobs": jsonable(_effective_knobs(plan, knobs)),
        "allow_approximate": allow_approximate,
        "mapping": [jsonable(asdict(m)) for m in plan.mapping],
        # attached: no knob reached the server; each is as stated, reported or "unknown"
        **({} if plan.launch else attached_manifest(knobs)),
        "trace": trace_manifest(trace),
        "model": model,
        "gpu": gpu,
        "status": "starting",
    }


def _effective_knobs(plan: LaunchPlan, knobs: Knobs) -> dict[str, Any]:
    """The knobs a launched engine runs with: each mapped knob's value (the engine's own
    default for one left unset, as its adapter states it), the rest as given. Attached, the
    knobs as given (``attached_manifest`` says which are known)."""
    effective = dict(knobs.as_dict())
    if plan.launch:
        effective.update({m.knob: m.value for m in plan.mapping})
    return effective


def _ignored_in_manifest(out_dir: Path, session: EngineSession) -> dict[str, Any]:
    """The manifest's ``mapping`` and ``knobs`` once the server's log showed it ignored
    knobs: the session's plan has each such knob marked not applied (with why), and the knobs
    take the value the engine runs with."""
    knobs = dict(read_manifest(out_dir).get("knobs") or {})
    knobs.update({check.knob: check.runs_with for check in session.ignored})
    return {"mapping": [jsonable(asdict(m)) for m in session.plan.mapping], "knobs": knobs}


def redacted_plan(plan: LaunchPlan) -> LaunchPlan:
    """The plan as it may be shown: environment values off the allow-list, secret flag values
    (``--api-key X``, docker's ``-e K=V``) and the same values in the extra_args mapping masked
    (``harness.redact``, as in the manifest). Only for showing: the launch needs the values."""
    mapping = tuple(_redacted_knob(m) for m in plan.mapping)
    return replace(plan, argv=tuple(redact_argv(plan.argv)), env=redact_env(plan.env),
                   stop_argv=tuple(redact_argv(plan.stop_argv)), mapping=mapping)


def _redacted_knob(mapped: MappedKnob) -> MappedKnob:
    if mapped.knob != "extra_args":
        return mapped
    record = redact_tree(asdict(mapped))
    value = record["value"]
    return replace(mapped, value=tuple(value) if isinstance(value, list) else value,
                   flags=tuple(record["flags"]))


def planned_policy(plan: LaunchPlan, knobs: Knobs) -> str | None:
    """The scheduling policy (the uniform knob's value) the server runs with, as far as the
    plan knows it; None when not known.

    Launched: the mapped value (an unset knob's is the engine's default). A policy the adapter
    could not honour (approximated or not applied, allowed by --allow-approximate) falls back
    to the engine's first-come-first-served queue in every adapter (vLLM's static -> fcfs,
    llama-server's priority -> -cb, TGI's FIFO); one that extra_args or --engine-env override
    is not known.
    Attached: the policy stated on the command line, else not known (what the server reports
    of itself is read after its version probe: ``_replay_on``)."""
    if not plan.launch:
        return _known_policy(attached_manifest(knobs)["knobs"].get("policy"))
    for mapped in plan.mapping:
        if mapped.knob != "policy":
            continue
        if mapped.status in ("applied", "default"):
            return mapped.value if isinstance(mapped.value, str) else None
        if mapped.overridden_by:  # extra_args or --engine-env decide (adapters.base.map_knobs)
            return None
        return "fcfs"
    return None


def _known_policy(value: Any) -> str | None:
    return value if isinstance(value, str) and value != UNKNOWN_KNOB else None


def _default_tokenizer(model: str, replay_kwargs: Mapping[str, Any]) -> str | None:
    """A local model folder's own tokenizer makes prompts of exact length; use it by default."""
    if replay_kwargs.get("tokenizer_path"):
        return str(replay_kwargs["tokenizer_path"])
    folder = Path(model)
    if folder.is_dir() and (folder / "tokenizer.json").exists():
        return str(folder)
    return None


def run_live(
    spec: TargetSpec,
    trace: Trace,
    out_dir: Path | str,
    options: RunOptions,
    *,
    dry_run: bool = False,
    out: TextIO | None = None,
) -> dict[str, Any]:
    """Plan, launch (or attach), replay ``trace`` with telemetry, and always tear down.

    ``options.replay`` are ``ReplayConfig`` fields other than the target, protocol and model,
    which the plan decides. Returns the replay's summary; with ``dry_run``, ``{"dry_run": True,
    "argv": ..., ...}`` and nothing started. Raises KnobError at plan time and EngineStartError
    when the engine does not come up; the run folder's ``manifest.json`` records either.
    """
    plan = plan_for(spec)
    model = spec.model
    replay_kwargs = {**replay_defaults(plan.engine), **options.replay}  # the engine's, then ours
    tokenizer = _default_tokenizer(model, replay_kwargs)
    # TGI is replayed through its native /generate_stream; other engines speak OpenAI, over
    # completions unless chat was asked for.
    requested = replay_kwargs.get("protocol")
    protocol = plan.protocol if plan.protocol == "tgi" or requested is None else requested
    # the engine and its policy decide whether and how priorities are sent (ReplayConfig)
    replay_kwargs.update(target_url=plan.base_url, protocol=protocol, model=plan.model,
                         engine=plan.engine, server_policy=planned_policy(plan, spec.knobs))
    if tokenizer is not None:
        replay_kwargs["tokenizer_path"] = tokenizer
    if options.slo is not None:
        replay_kwargs["slo"] = options.slo
    config = ReplayConfig(**replay_kwargs)
    if dry_run:
        shown = redacted_plan(plan)
        priority = config.priority_plan(trace.requests).note  # as the manifest would say
        folder = str(Path(out_dir).resolve())  # where a run writes the generated files
        print(shown.describe(config_dir=folder), end="", file=out or sys.stdout)
        print(f"request priority: {priority}", file=out or sys.stdout)
        return {
            "dry_run": True,
            "priority": priority,
            "argv": list(shown.resolved_argv(folder)),
            "env": dict(shown.env),
            "config_files": dict(shown.config_files),
            "mapping": [jsonable(asdict(m)) for m in shown.mapping],
            "launcher": shown.launcher or None,
        }
    config.validate()

    out_path = Path(out_dir)
    secrets = secret_values(env=plan.env, argv=plan.argv, api_key_env=config.api_key_env,
                            urls=(plan.base_url,))
    run_id = claim_run_dir(out_path, RunIdentity(
        "live", trace.digest, engine=plan.engine,
        target=None if plan.launch else plan.base_url), overwrite=options.overwrite)
    engine: dict[str, Any] = {}
    started: list[ServerProcess] = []
    scraper: TelemetryScraper | None = None

    def on_start(server: ServerProcess) -> None:
        started.append(server)
        engine.update(pid=server.pid, pgid=server.pgid)
        update_manifest(out_path, {"engine": _merged_engine(out_path, engine)})

    try:  # from the claim on: a failure or Ctrl-C anywhere leaves a manifest that says so
        (out_path / TELEMETRY_FILE).unlink(missing_ok=True)
        for name, content in plan.config_files.items():
            (out_path / name).write_text(content)
        argv = plan.resolved_argv(str(out_path.resolve()))
        update_manifest(out_path, _engine_manifest(
            plan, spec.knobs, trace, model=model, allow_approximate=spec.allow_approximate,
            argv=argv, gpu=spec.gpu, command=options.command,
        ))
        scraper = TelemetryScraper(
            source_for(plan.telemetry, plan.base_url), out_path / TELEMETRY_FILE,
            interval_s=spec.telemetry_interval_s or DEFAULT_INTERVAL_S, run_id=run_id,
        )
        # the whole set, the API key too: a pass without it would leave part of it
        with engine_session(spec, out_path, plan=plan, on_start=on_start,
                            secrets=secrets) as session:
            engine["ready_s"] = round(session.ready_s, 3)
            if session.ignored:  # before the first request: the run says what it measured
                update_manifest(out_path, _ignored_in_manifest(out_path, session))
            server = session.server
            early_stop = (options.early_stop if server is None
                          else _stop_when_it_exits(server, options.early_stop))
            summary = asyncio.run(_replay_on(
                plan, trace, config, out_path, scraper, engine, progress=options.progress,
                command=options.command, run_id=run_id, early_stop=early_stop,
                knobs=spec.knobs, secrets=secrets,
            ))
            died = server.poll() if server is not None else None
            if died is not None:
                engine["note"] = f"the server had exited (code {died}) before teardown"
        exited = str(summary.get("stopped_early") or "")
        if exited.startswith(ENGINE_EXITED):
            not_sent = int(read_manifest(out_path).get("num_not_sent") or 0)
            # not stopped by an early-stop check: the run failed, and says so in its summary
            # as in its manifest (a job that reads only summary.json must see it)
            summary["status"] = "failed"
            with contextlib.suppress(OSError):  # a full disk must not hide the engine's exit
                write_json_atomic(summary, out_path / SUMMARY_FILE)
            raise EngineExited(f"{exited}: {summary.get('num_completed', 0)} of "
                               f"{summary.get('num_requests', 0)} requests sent completed, "
                               f"{not_sent} never sent (the results are in {out_path}; the "
                               "server's logs there say why it exited)", summary)
        engine["status"] = "finished"
        return summary
    except BaseException as exc:
        interrupted = isinstance(exc, KeyboardInterrupt | SystemExit | asyncio.CancelledError)
        engine["status"] = "interrupted" if interrupted else "failed"
        if isinstance(exc, EngineExited):  # its message says what happened
            said = str(exc)
        elif interrupted:
            said = str(exc) or "interrupted (Ctrl-C or SIGTERM)"
        else:
            said = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        engine["error"] = scrub_text(said, secrets)
        if isinstance(exc, EngineStartError) and secrets:  # it quotes argv and the log tail
            raise EngineStartError(scrub_text(str(exc), secrets)) from None
        raise
    finally:
        for server in started:
            exit_info = server.stop()  # already stopped by the session: its recorded exit
            engine["exit"] = asdict(exit_info) if exit_info else None
            engine["logs"] = [server.stdout_path.name, server.stderr_path.name]
        with contextlib.suppress(OSError):  # a full disk must not hide the run's outcome
            _finish_manifest(out_path, engine, scraper)
        scrub_files(out_path, secrets)  # server logs may print their argv or environment
        release_run_dir(out_path)  # the run has ended: another process may write the folder


ENGINE_EXITED = "the engine exited"


def _stop_when_it_exits(server: ServerProcess, inner: EarlyStop | None) -> EarlyStop:
    """An early-stop check that ends the replay as soon as the launched server has exited (a
    crash, an out-of-memory kill): requests sent after it would all fail at once and stretch
    the run. ``inner``: the caller's own check, asked while the server runs."""
    def check(state: LoadState) -> str | None:
        code = server.poll()
        if code is not None:
            return f"{ENGINE_EXITED} (code {code}) {state.t_s:.3g} s into the run"
        return inner(state) if inner is not None else None
    return check


async def _replay_on(
    plan: LaunchPlan,
    trace: Trace,
    config: ReplayConfig,
    out_dir: Path,
    scraper: TelemetryScraper,
    engine: dict[str, Any],
    *,
    progress: Callable[[int, int], None] | None,
    command: Sequence[str] | None,
    run_id: str,
    early_stop: EarlyStop | None = None,
    knobs: Knobs | None = None,
    secrets: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    engine["version_probe"] = await probe_version(plan.base_url, plan.version_paths)
    engine["version"] = engine["version_probe"].get("version")
    if not plan.launch and knobs is not None:  # what the server says about itself
        attached = attached_manifest(knobs, engine["version_probe"].get("body"),
                                     known=read_manifest(out_dir))
        update_manifest(out_dir, attached)
        # a policy the server reports (the served reference's /version) is now known: still
        # before the first request, so priorities it would refuse are not sent
        config = replace(config, server_policy=_known_policy(attached["knobs"].get("policy")))
    engine["status"] = "running"
    update_manifest(out_dir, {"engine": _merged_engine(out_dir, engine)})
    origin: list[int] = []
    summary = await replay(trace, config, out_dir, telemetry=scraper, progress=progress,
                           command=command, on_t0=origin.append, run_id=run_id,
                           early_stop=early_stop, secrets=secrets)
    if origin:
        _align_telemetry(out_dir, scraper, origin[0])
    # the engine's own counters, now that its telemetry is on disk
    summary = with_engine_counters(summary, out_dir)
    with contextlib.suppress(OSError):
        write_json_atomic(summary, out_dir / SUMMARY_FILE)
    return summary


def _align_telemetry(out_dir: Path, scraper: TelemetryScraper, t0_ns: int) -> None:
    """Put telemetry on the replay's clock (t0 = the replay's start), then rewrite the file."""
    if scraper.origin_ns is None or not scraper.rows:
        return
    shift_s = (scraper.origin_ns - t0_ns) / 1e9
    for row in scraper.rows:
        row["t_s"] += shift_s
    scraper.origin_ns = t0_ns
    scraper.write(out_dir / TELEMETRY_FILE)


def _merged_engine(out_dir: Path, engine: Mapping[str, Any]) -> dict[str, Any]:
    return {**(read_manifest(out_dir).get("engine") or {}), **engine}


def _finish_manifest(out_dir: Path, engine: Mapping[str, Any],
                     scraper: TelemetryScraper | None) -> None:
    """``scraper``: None when the run failed before it was made."""
    fields: dict[str, Any] = {"engine": _merged_engine(out_dir, engine)}
    if scraper is not None and scraper.rows:
        fields["telemetry"] = {
            "file": TELEMETRY_FILE,
            "interval_s": scraper.interval_s,
            "num_scrapes": len(scraper.rows),
            "num_failed_scrapes": sum(1 for r in scraper.rows if r["scrape_error"]),
            "missing": scraper.missing_signals(),
            "clock": "t_s on the replay's clock (0 = the run's t0)",
        }
    if engine.get("status") in ("failed", "interrupted"):
        fields["status"] = engine["status"]
        fields["error"] = engine.get("error")
    update_manifest(out_dir, fields)
