"""How well the reference engine predicts a real one: the same trace, live and simulated.

``batchlab validate`` replays a held-out trace against a live engine (``harness.live``) and
simulates it on the reference engine with the same knobs and a calibration profile
(``harness.calibrate``), then compares the two run folders::

    OUT/live/        requests.parquet, chunks.parquet, telemetry.parquet, summary.json, ...
    OUT/simulated/   requests.parquet, chunks.parquet, steps.parquet, summary.json, ...
    OUT/fidelity.json            predicted vs measured (below)
    OUT/per_request_errors.parquet   one row per request present in both runs
    OUT/fidelity.md              the same as the report's "Prediction fidelity" section
    OUT/probes/{before,after}/   a calibration burst again, around the replay: speed drift

``fidelity.json`` is ``harness.report.fidelity.fidelity``'s dict (its shape is documented there)
plus ``engine_speed_vs_calibration`` (``{"before": e, "after": e, "burst": name}``) and
``context`` (profile, device, knobs, trace). The comparison and its markdown live in the report
package, which renders the same section for any live run paired with a simulated one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from adapters.base import Knobs, LaunchPlan
from adapters.catalog import attached_knobs, attached_mapping, replay_defaults
from harness.calibrate.measure import SpeedProbe
from harness.live.telemetry import DEFAULT_INTERVAL_S, TELEMETRY_FILE
from harness.manifest import jsonable, read_manifest, update_manifest
from harness.metrics import Slo
from harness.redact import redact_env
from harness.report.fidelity import fidelity, per_request_errors, render_fidelity_markdown
from harness.report.runs import read_table
from harness.results import STEPS_FILE, read_timelines, write_json_atomic, write_parquet_atomic
from harness.target import RunOptions, TargetSpec
from harness.targets import LiveTarget
from harness.timeline import RequestTimeline
from harness.traces import Trace

FIDELITY_FILE = "fidelity.json"
FIDELITY_MARKDOWN_FILE = "fidelity.md"
PER_REQUEST_FILE = "per_request_errors.parquet"
LIVE_DIR = "live"
PROBE_DIR = "probes"
SIMULATED_DIR = "simulated"

# ---------------------------------------------------------------- batchlab validate


def run_validation(
    plan: LaunchPlan,
    knobs: Knobs,
    trace: Trace,
    *,
    profile: str,
    reference_model: str,
    out_dir: Path,
    model: str,
    replay_kwargs: Mapping[str, Any] | None = None,
    slo: Slo | None = None,
    command: Sequence[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    telemetry_interval_s: float = DEFAULT_INTERVAL_S,
    metric_map: str | Mapping[str, str] | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Replay ``trace`` live against the server ``plan`` describes and simulate it on the
    reference engine (same knobs, ``profile``, the engine's KV cache); write both run folders
    and the comparison (module doc) under ``out_dir``; return the fidelity dict.

    ``knobs`` are the server's: launched with them, or declared for an attached server (they
    reach the simulation either way). ``model`` is what the engine loaded (its tokenizer folder
    makes prompts of exact length). ``metric_map``: the telemetry names of a generic
    (``openai``) server, as for the session (the live half re-plans the attached target).
    ``log`` gets what the console should say (a speed probe that measured nothing, and why).
    """
    from adapters.reference.cost_model import load_profile
    from harness.calibrate import (
        KvCacheInfo,
        probe_kv_cache,
        probe_reference,
        probe_server_knobs,
        reference_config,
        speed_probe,
    )
    from harness.sim import run_simulation

    params = load_profile(profile)
    meta = _profile_metadata(profile)
    device = params.device or "h100-sxm"
    kv = probe_kv_cache(plan.base_url)
    engine_meta = meta.get("engine") or {}
    if kv is None and engine_meta.get("num_kv_blocks") and engine_meta.get("block_size"):
        kv = KvCacheInfo(int(engine_meta["block_size"]), int(engine_meta["num_kv_blocks"]))
    config = reference_config(reference_model, knobs, device, profile=profile, kv=kv)

    out_dir = Path(out_dir)
    live_dir, sim_dir = out_dir / LIVE_DIR, out_dir / SIMULATED_DIR
    tokenizer = (replay_kwargs or {}).get("tokenizer_path") or (
        model if (Path(model) / "tokenizer.json").is_file() else None)
    probes = out_dir / PROBE_DIR
    replay = {**replay_defaults(plan.engine), **(replay_kwargs or {})}
    reference = probe_reference(meta.get("workload") or [], knobs.max_num_seqs)

    def probe(when: str) -> SpeedProbe:
        if reference is None:
            result = SpeedProbe(None, f"{profile} records no decode burst of at most "
                                f"{knobs.max_num_seqs} requests to repeat")
        else:
            result = speed_probe(plan, reference, probes / when, tokenizer_path=tokenizer,
                                 telemetry_interval_s=telemetry_interval_s,
                                 replay=replay)
        if result.reason:
            log(f"speed probe {when} the replay: not measured: {result.reason}")
        return result

    speed_before = probe("before")
    # The server is up (launched by the caller's session, or attached): the live half
    # attaches to it, so its knobs are the server's, recorded below.
    attached = TargetSpec(plan.engine, "attach", model=model, served_model_name=plan.model,
                          url=plan.base_url, telemetry_interval_s=telemetry_interval_s,
                          metric_map=metric_map)
    measured = LiveTarget(attached).run(trace, live_dir, RunOptions(  # validate's own folders:
        slo=slo, progress=progress, command=command, replay=replay,
        overwrite=True))
    speed_after = probe("after")
    _record_knobs(live_dir, plan, knobs,
                  reported={} if plan.launch else probe_server_knobs(plan.base_url))
    live_timelines = read_timelines(live_dir)
    predicted = run_simulation(as_sent(trace, live_timelines), config, sim_dir, slo=slo,
                               command=command, knobs=jsonable(knobs.as_dict()), overwrite=True)
    fid = fidelity(
        predicted, measured, read_timelines(sim_dir), live_timelines,
        predicted_steps=read_table(sim_dir / STEPS_FILE),
        measured_telemetry=read_table(live_dir / TELEMETRY_FILE),
    )
    # A calibration burst again, right before and after the replay: how far the machine's
    # speed has drifted since calibration (a shared host drifts by 10-30%).
    fid["engine_speed_vs_calibration"] = {
        "before": speed_before.drift, "after": speed_after.drift,
        "burst": None if reference is None else reference.get("name"),
        "before_reason": speed_before.reason, "after_reason": speed_after.reason}
    fid["context"] = {
        "profile": str(profile),
        "profile_source": params.source,
        "device": device,
        "reference_model": reference_model,
        "engine": plan.engine,
        "base_url": plan.base_url,
        "knobs": jsonable(knobs.as_dict()),
        "kv_cache": None if kv is None else {"block_size": kv.block_size,
                                              "num_blocks": kv.num_blocks},
        "trace": {"source": trace.source, "digest": trace.digest,
                  "num_requests": len(trace.requests)},
        "arrivals": "simulated requests arrive when the live client sent them, so the "
                    "client's own lateness is not counted as a prediction error",
        "live_dir": LIVE_DIR,
        "simulated_dir": SIMULATED_DIR,
    }
    write_json_atomic(fid, out_dir / FIDELITY_FILE)
    write_parquet_atomic(per_request_errors(read_timelines(sim_dir), live_timelines),
                         out_dir / PER_REQUEST_FILE)
    (out_dir / FIDELITY_MARKDOWN_FILE).write_text(render_fidelity_markdown(fid))
    return fid


def as_sent(trace: Trace, live: Sequence[RequestTimeline]) -> Trace:
    """The trace with each request arriving when the live client actually sent it.

    Latencies of a live run are measured from the send (``RequestTimeline.start_s``); a
    client that fell behind the trace's schedule changed the load the engine saw. Simulating
    the sends instead of the schedule compares the engines on the same load. Requests the
    client never sent keep their trace arrival. Same source and digest: the same trace.
    """
    sent = {tl.request_id: tl.sent_s for tl in live if tl.sent_s is not None}
    requests = sorted((replace(r, arrival_s=max(0.0, sent.get(r.request_id, r.arrival_s)))
                       for r in trace.requests), key=lambda r: r.arrival_s)
    return replace(trace, requests=tuple(requests))


def _profile_metadata(profile: str) -> dict[str, Any]:
    try:
        raw = json.loads(Path(profile).read_text())
    except (OSError, ValueError):
        return {}
    meta = raw.get("metadata") if isinstance(raw, dict) else None
    return meta if isinstance(meta, dict) else {}


def _record_knobs(live_dir: Path, plan: LaunchPlan, knobs: Knobs,
                  reported: Mapping[str, Any]) -> None:
    """The live half attached to the server; record the knobs the server runs with. Launched
    by batchlab: the knobs and the launch's mapping. Started elsewhere: only what the user
    stated or the server ``reported`` about itself; every other knob is "unknown" (batchlab's
    own defaults say nothing about that server)."""
    fields: dict[str, Any] = {"knobs": jsonable(knobs.as_dict())}
    if plan.launch:
        engine = dict(read_manifest(live_dir).get("engine") or {})
        engine["mode"] = "launch"
        fields.update(
            engine=engine,
            mapping=[jsonable(asdict(m)) for m in plan.mapping],
            launch={"argv": list(plan.argv), "env": redact_env(plan.env)},
            knobs_note="launched by batchlab validate with these knobs",
        )
    else:
        values, sources = attached_knobs(knobs, reported)
        fields.update(knobs=values, knob_sources=sources,
                      mapping=attached_mapping(values, sources),
                      knobs_note="the server was started outside batchlab: knobs as declared "
                      "on the command line or as the server reports, else unknown")
    update_manifest(live_dir, fields)

