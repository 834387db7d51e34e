"""The workload run against a live engine: phases replayed, samples and step counts taken."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from adapters.base import LaunchPlan
from adapters.catalog import replay_defaults, server_reported_knobs
from harness.calibrate.fit import StepSample
from harness.calibrate.steps import samples_from_phase
from harness.calibrate.workload import Phase, burst, phase_trace, space_arrivals
from harness.live.replay import ReplayConfig, replay_sync
from harness.live.telemetry import (
    DEFAULT_INTERVAL_S,
    TELEMETRY_FILE,
    TelemetryScraper,
    parse_exposition,
    source_for,
)
from harness.manifest import record_failed
from harness.results import read_timelines
from harness.timeline import RequestTimeline


@dataclass(frozen=True, slots=True)
class KvCacheInfo:
    """The engine's KV cache as it reports it (vLLM: the ``cache_config_info`` metric)."""

    block_size: int
    num_blocks: int


def probe_kv_cache(base_url: str, path: str = "/metrics") -> KvCacheInfo | None:
    """Block size and block count from the engine's metrics; None when it does not say."""
    text = _get_text(base_url.rstrip("/") + path)
    return None if text is None else kv_cache_from_metrics(text)


def kv_cache_from_metrics(text: str) -> KvCacheInfo | None:
    """vLLM's ``vllm:cache_config_info`` gauge carries the cache configuration as labels."""
    # only the gauge's own lines: a malformed line of another family cannot hide it
    wanted = "\n".join(line for line in text.splitlines() if "cache_config_info" in line)
    try:
        families = list(text_string_to_metric_families(wanted + "\n"))
    except ValueError:
        return None
    for family in families:
        if not family.name.endswith("cache_config_info"):
            continue
        for sample in family.samples:
            labels = sample.labels
            blocks = labels.get("num_gpu_blocks") or labels.get("num_blocks") or ""
            size = labels.get("block_size") or ""
            if blocks.isdigit() and size.isdigit() and int(blocks) > 0 and int(size) > 0:
                return KvCacheInfo(block_size=int(size), num_blocks=int(blocks))
    return None


def _get_text(url: str) -> str | None:
    try:
        response = httpx.get(url, timeout=10.0, trust_env=False)
    except httpx.HTTPError:
        return None
    return response.text if response.status_code == 200 else None


def _step_counter(plan: LaunchPlan) -> Callable[[], tuple[float, float] | None]:
    """Reads the engine's (steps, scheduled tokens) totals (vLLM's iteration_tokens_total
    histogram), or None when it has none: a cross-check of the steps found in the stream."""
    source = plan.telemetry.source("batch_tokens")

    def read() -> tuple[float, float] | None:
        if source is None or plan.telemetry.format != "prometheus":
            return None
        text = _get_text(plan.base_url.rstrip("/") + plan.telemetry.path)
        if text is None:
            return None
        samples = parse_exposition(text)
        for name in source.names:
            counts, sums = samples.get(name + "_count"), samples.get(name + "_sum")
            if counts and sums:
                return sum(counts), sum(sums)
        return None

    return read


@dataclass(frozen=True)
class PhaseResult:
    phase: Phase
    samples: list[StepSample]
    summary: dict[str, Any]
    wall_s: float
    num_engine_steps: float | None  # from telemetry, None when the engine does not export it

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.phase.name,
            "measures": self.phase.measures,
            "num_requests": len(self.phase.requests),
            "concurrency": self.phase.concurrency,
            "prompt_tokens": sorted({r.num_prompt_tokens for r in self.phase.requests}),
            "output_tokens": sorted({r.num_output_tokens for r in self.phase.requests}),
            "num_completed": self.summary.get("num_completed"),
            "num_samples": len(self.samples),
            "num_engine_steps": self.num_engine_steps,
            "mean_decode_step_s": self.mean_decode_step_s,
            "wall_s": round(self.wall_s, 3),
        }

    @property
    def mean_decode_step_s(self) -> float | None:
        """Mean duration of the phase's measured decode steps (its speed, for probes)."""
        steps = [s for s in self.samples if not s.includes_frontend]
        total = sum(s.num_steps for s in steps)
        return sum(s.duration_s * s.num_steps for s in steps) / total if total else None


def run_phases(
    plan: LaunchPlan,
    phases: Sequence[Phase],
    out_dir: Path,
    *,
    tokenizer_path: str | None,
    telemetry_interval_s: float | None = DEFAULT_INTERVAL_S,
    log: Callable[[str], None] = print,
    replay: Mapping[str, Any] | None = None,
) -> list[PhaseResult]:
    """Replay each phase against the server, one after another; a folder per phase.

    ``replay``: further ``ReplayConfig`` fields (a prompt salt, ...), over the engine's own
    replay defaults (``adapters.catalog.replay_defaults``).

    The engine's metrics are scraped during each phase as a live run scrapes them (every
    ``telemetry_interval_s``; None: not at all): on a CPU, rendering vLLM's /metrics takes
    ~0.1 s of the server's time and slows its steps by several percent at 4 Hz, and the
    profile must describe the engine as ``validate`` and ``replay --engine`` will measure it.
    """
    counter = _step_counter(plan)
    results: list[PhaseResult] = []
    timed: dict[str, list[RequestTimeline]] = {}
    for phase in phases:
        if phase.spaced_by is not None:
            phase = space_arrivals(phase, timed.get(phase.spaced_by, []))
        fields: dict[str, Any] = {**replay_defaults(plan.engine), **(replay or {})}
        fields.update(  # the phase decides these, whatever the caller's replay settings say
            target_url=plan.base_url, protocol=plan.protocol, model=plan.model,
            tokenizer_path=tokenizer_path, mode="closed" if phase.concurrency else "open",
            concurrency=phase.concurrency, max_concurrency=None)
        config = ReplayConfig(**fields)
        before = counter()
        start = time.perf_counter()
        scraper = None if telemetry_interval_s is None else TelemetryScraper(
            source_for(plan.telemetry, plan.base_url), out_dir / phase.name / TELEMETRY_FILE,
            interval_s=telemetry_interval_s)
        summary = replay_sync(phase_trace(phase), config, out_dir / phase.name,
                              telemetry=scraper, overwrite=True)  # the phase's own folder
        wall = time.perf_counter() - start
        after = counter()
        steps = after[0] - before[0] if before is not None and after is not None else None
        failed = summary.get("num_failed") or 0
        timelines = read_timelines(out_dir / phase.name)
        if failed:
            why = (f"calibration phase {phase.name}: {failed} of {len(phase.requests)} requests "
                   f"failed ({summary.get('failures')}); first error: "
                   f"{first_failure(timelines)}")
            # the phase's folder says so, as a failed replay's does: not a finished run
            record_failed(out_dir / phase.name, summary, why)
            raise CalibrationError(f"{why}; see {out_dir / phase.name}")
        timed[phase.name] = timelines
        samples = samples_from_phase(phase, timelines)
        results.append(PhaseResult(phase, samples, summary, wall, steps))
        log(f"  {phase.name:<18} {len(phase.requests):>3} requests  {wall:6.1f} s  "
            f"{len(samples):>3} samples")
    return results


@dataclass(frozen=True, slots=True)
class SpeedProbe:
    """A calibration burst run again: how much slower (+) the engine is than when calibrated,
    or why that could not be measured."""

    drift: float | None
    reason: str | None = None  # set exactly when drift is None


def speed_probe(plan: LaunchPlan, reference: Mapping[str, Any], out_dir: Path, *,
                tokenizer_path: str | None,
                telemetry_interval_s: float | None = DEFAULT_INTERVAL_S,
                replay: Mapping[str, Any] | None = None) -> SpeedProbe:
    """How much slower (+) or faster (-) the engine runs now than when it was calibrated.

    ``reference`` is a decode phase of the profile's workload (``metadata.workload``); the
    same burst runs again and its mean decode step is compared with the one measured then.
    A machine whose speed drifts (neighbours on a shared host) shows here, apart from any
    error of the model. Never raises for what the probe found: a drift of None comes with
    the reason (the profile has no figure, the probe's requests failed, or its streams gave
    no usable token timestamps).
    """
    then = reference.get("mean_decode_step_s")
    prompts, outputs = reference.get("prompt_tokens") or [], reference.get("output_tokens") or []
    n = reference.get("num_requests")
    name = reference.get("name", "?")
    if not then or len(prompts) != 1 or len(outputs) != 1 or not isinstance(n, int):
        return SpeedProbe(None, f"the profile's burst {name} has no mean decode step to compare "
                          "with (calibrated without usable decode samples)")
    phase = Phase("probe", burst("probe", n, int(prompts[0]), int(outputs[0])),
                  "the engine's speed, now")
    try:
        (result,) = run_phases(plan, [phase], out_dir, tokenizer_path=tokenizer_path,
                               telemetry_interval_s=telemetry_interval_s, log=lambda _: None,
                               replay=replay)
    except CalibrationError as exc:
        return SpeedProbe(None, f"the probe's requests failed: {exc}")
    now = result.mean_decode_step_s
    if now is None:
        return SpeedProbe(None, _no_steps_reason(out_dir / phase.name))
    return SpeedProbe(now / float(then) - 1.0)


def _no_steps_reason(run_dir: Path) -> str:
    """Why a burst's streams gave no decode step: say what the streams carried."""
    timelines = read_timelines(run_dir)
    num_chunks = sum(len(tl.chunk_times_s) for tl in timelines)
    counted = sum(tl.num_output_tokens or 0 for tl in timelines)
    sources = sorted({tl.token_count_source for tl in timelines if tl.token_count_source})
    if num_chunks <= len(timelines):
        return (f"the probe's {len(timelines)} streams gave {num_chunks} token-carrying events "
                f"for {counted} tokens the server counted (count from {', '.join(sources)}): "
                "its events carry no text for the tokens (llama.cpp streams special tokens and "
                "held-back UTF-8 as empty text; ask for timings_per_token), so no step can be "
                f"timed; see {run_dir}")
    return (f"the probe's {len(timelines)} streams gave {num_chunks} token events for {counted} "
            "tokens, but no span of steps in which every request advanced alike (events that "
            f"carry several tokens, or requests that did not decode together); see {run_dir}")


def first_failure(timelines: Sequence[RequestTimeline]) -> str | None:
    """The earliest failed request, with the server's own message (not just a counter)."""
    failed = [tl for tl in timelines if not tl.ok]
    if not failed:
        return None
    tl = min(failed, key=lambda t: t.sent_s if t.sent_s is not None else t.arrival_s)
    message = " ".join((tl.error_message or "").split())[:300]
    return f"request {tl.request_id}: {tl.error_kind or 'not_finished'}" + (
        f": {message}" if message else "")


def probe_server_knobs(base_url: str) -> dict[str, Any]:
    """The knobs a running server reports about itself (llama.cpp's ``/props`` and ``/slots``);
    empty when it reports none."""
    root = base_url.rstrip("/")
    answers: list[Any] = []
    for path in ("/props", "/slots"):
        text = _get_text(root + path)
        try:
            answers.append(json.loads(text) if text else None)
        except ValueError:
            answers.append(None)
    return server_reported_knobs(*answers)


def probe_reference(workload: Sequence[Mapping[str, Any]], max_num_seqs: int
                    ) -> Mapping[str, Any] | None:
    """The calibration phase a speed probe repeats: the short-context burst of 4 (or fewer)."""
    bursts = [w for w in workload if str(w.get("name", "")).startswith("decode-c")
              and isinstance(w.get("num_requests"), int) and w["num_requests"] <= max_num_seqs]
    if not bursts:
        return None
    return min(bursts, key=lambda w: abs(int(w["num_requests"]) - 4))


class CalibrationError(RuntimeError):
    """The workload could not be measured (requests failed, nothing usable came back)."""
