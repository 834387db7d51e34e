"""A live run against a real engine: plan, record, launch (or attach), replay, always tear down.

    knobs ──► adapter.plan ──► LaunchPlan ──► manifest.json (argv, config, mapping, ...)
                                   │
                                   ▼
              ServerProcess (own process group, logs in the run folder)
                                   │ wait_ready (/health) ── probe_version (/version, /info)
                                   ▼
              harness.replay.replay(trace, ..., telemetry=TelemetryScraper) ──► run folder
                                   │
                                   ▼
              teardown: SIGTERM ─► SIGKILL the group (also on failure, Ctrl-C, SIGTERM)

``--dry-run`` stops after planning: it prints the argv, the generated config file and the
mapping, and starts nothing.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

import httpx

from adapters.base import KnobError, Knobs, LaunchPlan
from adapters.catalog import ENGINES, make_adapter
from adapters.process import (
    EngineStartError,
    ServerProcess,
    probe_version,
    terminate_on_signals,
)
from harness.manifest import (
    jsonable,
    read_manifest,
    run_fields,
    trace_manifest,
    update_manifest,
)
from harness.metrics import Slo
from harness.replay import ReplayConfig, replay
from harness.telemetry import DEFAULT_INTERVAL_S, TELEMETRY_FILE, TelemetryScraper, source_for
from harness.traces import Trace

DEFAULT_READY_TIMEOUT_S = 900.0  # vLLM takes 60-110 s on 2 CPU cores; big models far longer
ATTACH_READY_TIMEOUT_S = 30.0
_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)


def plan_for(
    engine_name: str,
    knobs: Knobs,
    *,
    launch: bool,
    url: str | None,
    allow_approximate: bool,
    model: str,
    served_model_name: str | None = None,
    engine_env: Mapping[str, str] | None = None,
    executable: str | None = None,
    runtime: str | None = None,
    metric_map: str | Mapping[str, str] | None = None,
    port: int | None = None,
    gpu: str | None = None,
) -> LaunchPlan:
    """The launch plan of a live run; raises KnobError for what cannot be honoured."""
    if engine_name not in ENGINES:
        raise KnobError(f"unknown engine {engine_name!r}; engines: {', '.join(ENGINES)}")
    if launch == (url is not None):
        raise KnobError("give exactly one of --launch (start the engine) or --url URL (attach)")
    adapter = make_adapter(
        engine_name, model=model, served_model_name=served_model_name, port=port,
        env=engine_env, executable=executable, runtime=runtime, metric_map=metric_map,
        gpu=gpu,
    )
    if url is not None:
        if knobs != Knobs() and not allow_approximate:
            changed = [n for n in Knobs.names() if getattr(knobs, n) != getattr(Knobs(), n)]
            raise KnobError(
                f"{engine_name} at {url} was started outside batchlab, so knobs cannot reach it "
                f"({', '.join(changed)}). Set them where the server is started, or pass "
                "--allow-approximate to record them as not applied."
            )
        return adapter.attach(url, knobs)
    return adapter.plan(knobs, allow_approximate=allow_approximate)


def _redact(env: Mapping[str, str]) -> dict[str, str]:
    return {k: ("***" if _SECRET.search(k) else v) for k, v in env.items()}



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
            "env": _redact(plan.env),
            "config_files": dict(plan.config_files),
            "stop_argv": list(plan.stop_argv),
        } if plan.launch else None,
        "knobs": jsonable(knobs.as_dict()),
        "allow_approximate": allow_approximate,
        "mapping": [jsonable(asdict(m)) for m in plan.mapping],
        "trace": trace_manifest(trace),
        "model": model,
        "gpu": gpu,
        "status": "starting",
    }


def _default_tokenizer(model: str, replay_kwargs: Mapping[str, Any]) -> str | None:
    """A local model folder's own tokenizer makes prompts of exact length; use it by default."""
    if replay_kwargs.get("tokenizer_path"):
        return str(replay_kwargs["tokenizer_path"])
    folder = Path(model)
    if folder.is_dir() and (folder / "tokenizer.json").exists():
        return str(folder)
    return None


def run_live(
    engine_name: str,
    knobs: Knobs,
    trace: Trace,
    replay_config_kwargs: Mapping[str, Any] | None,
    out_dir: Path | str,
    *,
    launch: bool = True,
    url: str | None = None,
    allow_approximate: bool = False,
    dry_run: bool = False,
    model: str,
    served_model_name: str | None = None,
    gpu: str | None = None,
    slo: Slo | None = None,
    progress: Callable[[int, int], None] | None = None,
    command: Sequence[str] | None = None,
    engine_env: Mapping[str, str] | None = None,
    executable: str | None = None,
    runtime: str | None = None,
    metric_map: str | Mapping[str, str] | None = None,
    port: int | None = None,
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
    telemetry_interval_s: float = DEFAULT_INTERVAL_S,
    out: TextIO | None = None,
) -> dict[str, Any]:
    """Plan, launch (or attach), replay ``trace`` with telemetry, and always tear down.

    ``model`` is what the engine loads (a local folder or hub id); requests carry
    ``served_model_name`` (default: ``model``). ``replay_config_kwargs`` are ``ReplayConfig``
    fields other than the target, protocol and model, which the plan decides. Returns the
    replay's summary; with ``dry_run``, ``{"dry_run": True, "argv": ..., ...}`` and nothing
    started. Raises KnobError at plan time and EngineStartError when the engine does not come
    up; the run folder's ``manifest.json`` records either.
    """
    plan = plan_for(
        engine_name, knobs, launch=launch, url=url, allow_approximate=allow_approximate,
        model=model, served_model_name=served_model_name, engine_env=engine_env,
        executable=executable, runtime=runtime, metric_map=metric_map, port=port, gpu=gpu,
    )
    replay_kwargs = dict(replay_config_kwargs or {})
    tokenizer = _default_tokenizer(model, replay_kwargs)
    # TGI is replayed through its native /generate_stream; other engines speak OpenAI, over
    # completions unless chat was asked for.
    requested = replay_kwargs.get("protocol")
    protocol = plan.protocol if plan.protocol == "tgi" or requested is None else requested
    replay_kwargs.update(target_url=plan.base_url, protocol=protocol, model=plan.model)
    if tokenizer is not None:
        replay_kwargs["tokenizer_path"] = tokenizer
    if slo is not None:
        replay_kwargs["slo"] = slo
    config = ReplayConfig(**replay_kwargs)
    if dry_run:
        print(plan.describe(), end="", file=out or sys.stdout)
        return {
            "dry_run": True,
            "argv": list(plan.argv),
            "env": dict(plan.env),
            "config_files": dict(plan.config_files),
            "mapping": [jsonable(asdict(m)) for m in plan.mapping],
        }
    config.validate()

    out_path = Path(out_dir)
    out_path.mkdir(parents=True, exist_ok=True)
    (out_path / TELEMETRY_FILE).unlink(missing_ok=True)
    for name, content in plan.config_files.items():
        (out_path / name).write_text(content)
    argv = plan.resolved_argv(str(out_path.resolve()))
    update_manifest(out_path, _engine_manifest(
        plan, knobs, trace, model=model, allow_approximate=allow_approximate, argv=argv,
        gpu=gpu, command=command,
    ))
    server = (
        ServerProcess(argv, log_dir=out_path, name=f"{plan.engine}-server", env=plan.env,
                      stop_argv=plan.stop_argv)
        if plan.launch else None
    )
    scraper = TelemetryScraper(
        source_for(plan.telemetry, plan.base_url), out_path / TELEMETRY_FILE,
        interval_s=telemetry_interval_s,
    )
    engine: dict[str, Any] = {}
    try:
        with terminate_on_signals():
            if server is not None:
                server.start()
            summary = asyncio.run(_serve_and_replay(
                plan, server, trace, config, out_path, scraper, engine,
                ready_timeout_s=ready_timeout_s, progress=progress, command=command,
            ))
        engine["status"] = "finished"
        return summary
    except BaseException as exc:
        interrupted = isinstance(exc, KeyboardInterrupt | SystemExit | asyncio.CancelledError)
        engine["status"] = "interrupted" if interrupted else "failed"
        engine["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        if server is not None:
            died = server.poll()
            if died is not None and engine.get("status") == "finished":
                engine["note"] = f"the server had exited (code {died}) before teardown"
            exit_info = server.stop()
            engine["exit"] = asdict(exit_info) if exit_info else None
            engine["logs"] = [server.stdout_path.name, server.stderr_path.name]
        _finish_manifest(out_path, engine, scraper)


async def _serve_and_replay(
    plan: LaunchPlan,
    server: ServerProcess | None,
    trace: Trace,
    config: ReplayConfig,
    out_dir: Path,
    scraper: TelemetryScraper,
    engine: dict[str, Any],
    *,
    ready_timeout_s: float,
    progress: Callable[[int, int], None] | None,
    command: Sequence[str] | None,
) -> dict[str, Any]:
    health = plan.base_url + plan.health_path
    if server is not None:
        engine["ready_s"] = round(await server.wait_ready(health, timeout_s=ready_timeout_s), 3)
    else:
        await _wait_attached(health, plan.base_url)
    engine["version_probe"] = await probe_version(plan.base_url, plan.version_paths)
    engine["version"] = engine["version_probe"].get("version")
    engine["status"] = "running"
    update_manifest(out_dir, {"engine": _merged_engine(out_dir, engine)})
    summary = await replay(trace, config, out_dir, telemetry=scraper, progress=progress,
                           command=command)
    _align_telemetry(out_dir, scraper)
    return summary


async def _wait_attached(health: str, base_url: str) -> None:
    deadline = time.monotonic() + ATTACH_READY_TIMEOUT_S
    last = "no answer"
    async with httpx.AsyncClient(timeout=httpx.Timeout(5.0), trust_env=False) as client:
        while time.monotonic() < deadline:
            try:
                response = await client.get(health)
                if response.status_code == 200:
                    return
                last = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                last = type(exc).__name__
            await asyncio.sleep(0.5)
    raise EngineStartError(
        f"no ready server at {base_url} ({health} answered: {last} for "
        f"{ATTACH_READY_TIMEOUT_S:.0f} s)"
    )


def _align_telemetry(out_dir: Path, scraper: TelemetryScraper) -> None:
    """Put telemetry on the replay's clock (t0 = the replay's start), then rewrite the file."""
    t0_ns = read_manifest(out_dir).get("t0_perf_counter_ns")
    if not isinstance(t0_ns, int) or scraper.origin_ns is None or not scraper.rows:
        return
    shift_s = (scraper.origin_ns - t0_ns) / 1e9
    for row in scraper.rows:
        row["t_s"] += shift_s
    scraper.origin_ns = t0_ns
    scraper.write(out_dir / TELEMETRY_FILE)


def _merged_engine(out_dir: Path, engine: Mapping[str, Any]) -> dict[str, Any]:
    return {**(read_manifest(out_dir).get("engine") or {}), **engine}


def _finish_manifest(out_dir: Path, engine: Mapping[str, Any], scraper: TelemetryScraper) -> None:
    fields: dict[str, Any] = {"engine": _merged_engine(out_dir, engine)}
    if scraper.rows:
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
