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
plus ``engine_speed_vs_calibration`` (``{"before": e, "after": e, "burst": name}``),
``context`` (profile, device, knobs, KV cache, trace) and ``warnings`` (what the simulation had
to assume). The comparison and its markdown live in the report package, which renders the same
section for any live run paired with a simulated one.

An engine that stops answering during the live replay, or that completes none of the requests,
fails the validation: everything above is still written (the comparison over the requests
completed on both sides), then ``ValidationFailed`` is raised.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

import httpx

from adapters.base import Knobs, LaunchPlan
from adapters.catalog import attached_knobs, attached_mapping, replay_defaults
from adapters.reference.config import ReferenceConfig
from adapters.reference.cost_model import (
    CostModelParams,
    ProfileError,
    load_profile,
    profile_metadata,
    resolve_gpu,
    resolve_profile,
)
from adapters.reference.models import UnknownModelError, lookup_model
from harness.calibrate.measure import KvCacheInfo, SpeedProbe
from harness.live.telemetry import DEFAULT_INTERVAL_S, TELEMETRY_FILE
from harness.manifest import jsonable, read_manifest, record_failed, update_manifest
from harness.metrics import Slo
from harness.redact import redact_env, redact_tree, redact_url
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

DEFAULT_DEVICE = "h100-sxm"  # a profile that names no device, validated without --gpu


class ValidationFailed(RuntimeError):
    """The engine stopped answering during the live replay. Raised once everything is on
    disk; ``fidelity`` is the dict written to ``fidelity.json`` (its comparison covers what
    both sides completed)."""

    def __init__(self, message: str, fidelity: dict[str, Any]) -> None:
        super().__init__(message)
        self.fidelity = fidelity


# ---------------------------------------------------------------- the profile, checked first


def check_profile(profile: str, *, gpu: str | None, reference_model: str) -> CostModelParams:
    """The profile's coefficients, or ``ValueError`` naming why it cannot predict this engine:
    an unreadable file or unknown key (with the closest known one), ``gpu`` (``--gpu``) naming
    another device than the one it was fitted on (as ``simulate`` refuses), or
    ``reference_model`` of another shape than the model it was fitted with."""
    _check_profile_keys(profile)
    params = load_profile(profile)
    resolve_gpu(gpu, params)  # refuses --gpu X with a profile fitted on device Y
    fitted_with = profile_metadata(profile).get("reference_model")
    if isinstance(fitted_with, str) and not _same_shape(fitted_with, reference_model):
        raise ProfileError(
            f"--reference-model {reference_model!r} but the profile ({params.source}) was "
            f"fitted with reference model {fitted_with!r}: a profile's coefficients describe "
            f"one model's shape; pass --reference-model {fitted_with} or calibrate this model")
    return params


def _check_profile_keys(profile: str) -> None:
    """An unknown key is refused with the closest known one (``memory_efficency`` ->
    ``memory_efficiency``); ``load_profile`` lists them all."""
    path = resolve_profile(profile)
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return  # load_profile says what is wrong with the file
    if not isinstance(raw, dict):
        return
    known = sorted(f.name for f in fields(CostModelParams))
    for key in raw:
        if key.startswith("_") or key == "metadata" or key in known:
            continue
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(known)}"
        raise ProfileError(f"{path}: unknown profile key {key!r}{hint}")


def _same_shape(a: str, b: str) -> bool:
    """Whether two reference models (catalog names or config.json paths) have one shape;
    True when ``a`` (the profile's record) no longer resolves (a moved folder)."""
    if a.lower() == b.lower():
        return True
    try:
        spec_a, spec_b = lookup_model(a), lookup_model(b)
    except UnknownModelError:
        return True
    return replace(spec_a, name="", source="") == replace(spec_b, name="", source="")


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
    gpu: str | None = None,
) -> dict[str, Any]:
    """Replay ``trace`` live against the server ``plan`` describes and simulate it on the
    reference engine (same knobs, ``profile``, the engine's KV cache); write both run folders
    and the comparison (module doc) under ``out_dir``; return the fidelity dict. Raises
    ``ValidationFailed`` (after writing) when the live side measured nothing comparable: the
    engine stopped answering, or it completed none of the requests.

    ``knobs`` are the server's: launched with them, or declared for an attached server (they
    reach the simulation either way). ``model`` is what the engine loaded (its tokenizer folder
    makes prompts of exact length). ``metric_map``: the telemetry names of a generic
    (``openai``) server, as for the session (the live half re-plans the attached target).
    ``log`` gets what the console should say (a speed probe that measured nothing, and why;
    what the simulation assumed). ``gpu``: ``--gpu``, checked against the profile's device
    (``check_profile``, which callers run before the engine starts).
    """
    from harness.calibrate import (
        probe_kv_cache,
        probe_reference,
        probe_server_knobs,
        reference_config,
        speed_probe,
    )
    from harness.sim import run_simulation

    params = check_profile(profile, gpu=gpu, reference_model=reference_model)
    meta = _profile_metadata(profile)
    device = gpu or params.device or DEFAULT_DEVICE
    kv, kv_source = _kv_cache(probe_kv_cache(plan.base_url), meta)
    config = reference_config(reference_model, knobs, device, profile=profile, kv=kv)
    warnings: list[str] = []
    if kv is None:
        warnings.append(assumed_kv_warning(config))
        log(f"warning: {warnings[-1]}")

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
    stopped = None if engine_answers(plan) else (
        f"the engine at {redact_url(plan.base_url)} stopped answering during the live replay "
        f"({plan.health_path} does not answer)")
    speed_after = SpeedProbe(None, stopped) if stopped else probe("after")
    _record_knobs(live_dir, plan, knobs,
                  reported={} if plan.launch else probe_server_knobs(plan.base_url))
    live_timelines = read_timelines(live_dir)
    predicted = run_simulation(as_sent(trace, live_timelines), config, sim_dir, slo=slo,
                               command=command, knobs=jsonable(knobs.as_dict()), overwrite=True)
    fid = fidelity(
        predicted, measured, read_timelines(sim_dir), live_timelines,
        predicted_steps=read_table(sim_dir / STEPS_FILE),
        measured_telemetry=read_table(live_dir / TELEMETRY_FILE), common_requests_only=True,
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
        "kv_cache": {"block_size": config.block_size,
                     "num_blocks": config.resolved_num_gpu_blocks(), "source": kv_source},
        "trace": {"source": trace.source, "digest": trace.digest,
                  "num_requests": len(trace.requests)},
        "arrivals": "simulated requests arrive when the live client sent them, so the "
                    "client's own lateness is not counted as a prediction error",
        "not_simulated": sorted(refused_live(live_timelines)),
        "live_dir": LIVE_DIR,
        "simulated_dir": SIMULATED_DIR,
    }
    failed = _live_failure(stopped, measured, len(trace.requests))
    if failed:
        fid["live_failed"] = failed
        # the live run folder says so too, as a replay's does (report, compare, summarize)
        record_failed(live_dir, measured, failed)
    fid["warnings"] = warnings
    fid = redact_tree(fid)  # as a manifest: the URL's credentials, extra_args' secret values
    write_json_atomic(fid, out_dir / FIDELITY_FILE)
    write_parquet_atomic(per_request_errors(read_timelines(sim_dir), live_timelines),
                         out_dir / PER_REQUEST_FILE)
    (out_dir / FIDELITY_MARKDOWN_FILE).write_text(render_fidelity_markdown(
        fid, live_engine=read_manifest(live_dir).get("engine")))
    if failed:
        raise ValidationFailed(f"{failed}; results in {out_dir}", fid)
    return fid


def engine_answers(plan: LaunchPlan, timeout_s: float = 5.0) -> bool:
    """Whether the engine still answers its health check (it may have died mid-replay)."""
    try:
        response = httpx.get(plan.base_url + plan.health_path, timeout=timeout_s,
                             trust_env=False)
    except httpx.HTTPError:
        return False
    return response.status_code < 500


def _live_failure(stopped: str | None, measured: Mapping[str, Any],
                  num_requests: int) -> str | None:
    """Why the live half failed (validate then exits 1, as replay does when its engine exits
    or serves nothing), or None. Requests that failed on an engine still up are the engine's
    answers: compared on what both sides completed, and the command succeeds, unless none
    completed: then nothing was compared."""
    completed = int(measured.get("num_completed") or 0)
    if num_requests and not completed and stopped is None:
        failures = ", ".join(f"{k} {v}" for k, v in (measured.get("failures") or {}).items())
        return (f"none of the {num_requests} requests completed live "
                f"({failures or 'no failure recorded'}): nothing was compared")
    if stopped is None or completed == num_requests:
        return None  # (an engine gone after the last request still measured all of them)
    return (f"{stopped}: {completed} of {num_requests} requests completed live; the "
            "comparison covers only requests completed on both sides")


def _kv_cache(probed: KvCacheInfo | None, meta: Mapping[str, Any]
              ) -> tuple[KvCacheInfo | None, str]:
    """The engine's KV cache (its metrics, else what calibration recorded) and where it came
    from: ``engine``, ``profile`` or ``assumed`` (None: the reference sizes its own)."""
    if probed is not None:
        return probed, "engine"
    engine_meta = meta.get("engine")  # calibrate's record; a shipped profile names its engine
    if not isinstance(engine_meta, Mapping):
        return None, "assumed"
    if engine_meta.get("num_kv_blocks") and engine_meta.get("block_size"):
        return KvCacheInfo(int(engine_meta["block_size"]),
                           int(engine_meta["num_kv_blocks"])), "profile"
    return None, "assumed"


def assumed_kv_warning(config: ReferenceConfig) -> str:
    """What the simulation assumed when neither the engine nor the profile gave the KV size."""
    blocks = config.resolved_num_gpu_blocks()
    return (f"the engine does not report its KV cache size (vLLM's vllm:cache_config_info "
            "metric) and the profile records none: the simulation assumes "
            f"{blocks:,} blocks of {config.block_size} tokens ({blocks * config.block_size:,} "
            "tokens, from the profile's memory and the knobs); if the engine holds another "
            "number, queueing and preemption predictions are off")


def as_sent(trace: Trace, live: Sequence[RequestTimeline]) -> Trace:
    """The trace with each request arriving when the live client actually sent it.

    Latencies of a live run are measured from the send (``RequestTimeline.start_s``); a
    client that fell behind the trace's schedule changed the load the engine saw. Simulating
    the sends instead of the schedule compares the engines on the same load. Requests the
    client never sent keep their trace arrival. Same source and digest: the same trace.
    """
    sent = {tl.request_id: tl.sent_s for tl in live if tl.sent_s is not None}
    refused = refused_live(live)
    requests = sorted((replace(r, arrival_s=max(0.0, sent.get(r.request_id, r.arrival_s)))
                       for r in trace.requests if r.request_id not in refused),
                      key=lambda r: r.arrival_s)
    return replace(trace, requests=tuple(requests))


# a live engine's answers that refuse a request outright: it never ran there
_REFUSALS = ("http_error", "overloaded", "rejected")


def refused_live(live: Sequence[RequestTimeline]) -> set[str]:
    """The requests the live engine refused before producing anything (an HTTP error such as a
    prompt over its max_model_len, overloaded): they put no load on it, so the simulation
    leaves them out too; simulated, they would load the requests compared beside them."""
    return {tl.request_id for tl in live
            if tl.error_kind in _REFUSALS and not tl.chunk_times_s}


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

