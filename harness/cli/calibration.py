"""Commands that hold the reference against a live engine: ``calibrate`` and ``validate``."""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from adapters.knobs import KnobError, Knobs
from harness.cli.common import (
    EXIT_FAILURE,
    PROMPT_SALT_HELP,
    RawDescriptionFormatter,
    UserError,
    add_subparser,
    add_trace_options,
    command_line,
    first_error_line,
    knobs_from_args,
    load_trace,
    parse_slo,
    progress_bar,
)
from harness.cli.live import add_engine_options, live_target_spec, warn_prompt_cache
from harness.redact import redact_url, scrub_text, secret_values
from harness.target import TargetSpec

CALIBRATE_GPU_HELP = (
    "the hardware the engine runs on: a catalog GPU (h100-sxm, h100-pcie, h200, a100-80gb) "
    "keeps its datasheet figures and gets fitted efficiencies; any other name (cpu, ...) is "
    "described by fitted effective figures. Default: this machine's GPU (nvidia-smi), else cpu")


def add_calibration_target_options(p: argparse.ArgumentParser) -> None:
    """What calibrate and validate share besides the engine options."""
    g = p.add_argument_group("model and reference")
    g.add_argument("--model", required=True, metavar="PATH_OR_NAME",
                   help="the model the engine serves (a local folder or hub id); requests carry "
                   "it as the model name (the engine loads --model-path when given)")
    g.add_argument("--reference-model", metavar="NAME_OR_PATH",
                   help="the model's shape for the reference cost model: a catalog name "
                   "(`batchlab costmodel --help` lists them) or a local config.json / folder; "
                   "default: --model-path or --model when it is a local folder or a catalog name")
    g.add_argument("--tokenizer", metavar="PATH",
                   help="local tokenizer of the served model, for prompts of exact length "
                   "(default: the model folder's own)")
    g.add_argument("--prompt-salt", default="none", metavar="auto|TEXT|none",
                   help=PROMPT_SALT_HELP)


def resolve_reference_model(args: argparse.Namespace) -> str:
    """The model's shape for the cost model: --reference-model, else the served model when it
    is a local folder, a catalog name, or a hub id the catalog lists (``-Instruct`` variants
    share their base model's shape)."""
    from adapters.reference.models import MODELS

    if args.reference_model:
        return str(args.reference_model)
    for candidate in (args.model_path, args.model):
        if not candidate:
            continue
        if (Path(candidate) / "config.json").is_file() or candidate.lower() in MODELS:
            return str(candidate)
        base = candidate.lower().split("/")[-1].replace("-instruct", "")
        for name, spec in MODELS.items():
            hub_id = spec.source.split()[0].lower()
            if candidate.lower() == hub_id or base == name:
                return name
    raise UserError(f"--reference-model: {args.model!r} is neither a local model folder nor a "
                    "catalog model; give the model's shape with --reference-model NAME or "
                    "--reference-model path/to/config.json")


def engine_url_or_launch(args: argparse.Namespace) -> None:
    """The engine options calibrate and validate share, checked before anything runs."""
    args.engine = args.engine or "vllm"
    if not args.launch and not args.url and not args.dry_run:
        raise UserError("give --launch (start the engine) or --url URL (attach to a running one)")
    if args.url:  # as replay checks it (credentials in the URL are not echoed)
        from harness.cli.live import refuse_bad_url

        refuse_bad_url("--url", args.url)
    interval = args.telemetry_interval_s
    if interval is not None and not (math.isfinite(interval) and interval > 0):
        raise UserError(f"--telemetry-interval-s: must be a number of seconds > 0 (0.25 by "
                        f"default), got {interval:g}")


def add_calibrate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_subparser(
        sub, "calibrate",
        help="fit the reference cost model to a live engine and write a profile",
        description="Run a short designed workload against a live engine (prefills of growing "
        "length on an idle engine; bursts of 1, 2, 4, ... requests decoding together, with "
        "short and long contexts), measure engine step times from the streamed token "
        "timestamps, fit the cost model's coefficients and write a profile JSON for "
        "`simulate --profile`, `serve reference --profile`, scenarios and `validate`. "
        "Method: docs/cost-model.md (Calibration).",
        epilog="examples:\n"
        "  batchlab calibrate --engine vllm --launch --model models/small-llama \\\n"
        "      --max-num-seqs 16 --max-num-batched-tokens 2048 --max-model-len 1024 \\\n"
        "      --extra-arg=--dtype --extra-arg=float32 --engine-env VLLM_CPU_KVCACHE_SPACE=1 \\\n"
        "      --out profiles/cpu-small-llama.json\n"
        "  batchlab calibrate --engine vllm --url http://127.0.0.1:8000 \\\n"
        "      --model meta-llama/Llama-3.1-8B --reference-model llama-3.1-8b \\\n"
        "      --gpu h100-sxm --out profiles/h100-llama8b.json",
        formatter_class=RawDescriptionFormatter,
    )
    add_engine_options(p, gpu_help=CALIBRATE_GPU_HELP)
    add_calibration_target_options(p)
    g = p.add_argument_group("calibration")
    g.add_argument("--out", required=True, metavar="PROFILE.json", help="the profile to write")
    g.add_argument("--work-dir", metavar="DIR",
                   help="run folders of the workload's phases and samples.parquet (default: "
                   "PROFILE.calibration/ beside the profile)")
    g.add_argument("--overwrite", action="store_true",
                   help="replace an existing profile at --out and the earlier calibration's "
                   "run folders in --work-dir (refused without it)")
    g.add_argument("--output-tokens", type=int, default=48, metavar="N",
                   help="tokens each decode-burst request generates (48)")
    g.add_argument("--max-batch-size", type=int, default=256, metavar="N",
                   help="largest burst (also capped by --max-num-seqs) (256)")
    g.add_argument("--long-prompt-tokens", type=int, default=512, metavar="N",
                   help="context of the long-context bursts (512; capped by --max-model-len)")


def cmd_calibrate(args: argparse.Namespace) -> int:
    from adapters.process import EngineStartError
    from harness.calibrate import (
        CalibrationError,
        WorkloadSpec,
        calibrate,
        design_workload,
        detect_device,
        reference_config,
    )
    from harness.live.prompts import resolve_prompt_salt
    from harness.live.session import engine_session

    engine_url_or_launch(args)
    out = Path(args.out)
    work_dir = Path(args.work_dir) if args.work_dir else out.with_suffix(".calibration")
    check_profile_out(out, work_dir, overwrite=args.overwrite, dry_run=args.dry_run)
    knobs = knobs_from_args(args)
    if args.url and not args.dry_run:  # the workload's bursts fit the server's own slots
        knobs = with_server_knobs(knobs, args.url)
    if not knobs.is_given("prefix_caching"):
        # A designed workload measures compute: a prefix-cache hit would hide a prefill.
        knobs = replace(knobs, prefix_caching=False,
                        given=frozenset(knobs.given_names()) | {"prefix_caching"})
    reference_model = resolve_reference_model(args)
    device = args.gpu or detect_device()
    model_path = args.model_path or args.model
    try:
        config = reference_config(reference_model, knobs, device)
        spec = WorkloadSpec(
            max_num_seqs=knobs.max_num_seqs, max_num_batched_tokens=knobs.max_num_batched_tokens,
            max_model_len=config.resolved_max_model_len, num_output_tokens=args.output_tokens,
            max_batch_size=args.max_batch_size, long_prompt_tokens=args.long_prompt_tokens)
        phases = design_workload(spec)
    except ValueError as exc:
        raise UserError(workload_flags(str(exc))) from None
    if args.dry_run:
        for phase in phases:
            lengths = sorted({r.num_prompt_tokens for r in phase.requests})
            how = (f"{phase.concurrency} user(s)" if phase.concurrency
                   else "one at a time" if phase.spaced_by else "all at once")
            print(f"phase {phase.name}: {len(phase.requests)} requests, prompts {lengths}, "
                  f"{how}: {phase.measures}")
        print(f"device {device}; reference model {reference_model}")
        return 0
    tokenizer = args.tokenizer or (model_path if (Path(model_path) / "tokenizer.json").is_file()
                                   else None)
    salt = resolve_prompt_salt(args.prompt_salt)
    try:
        with engine_session(session_spec(args, knobs), work_dir) as session:
            if not session.plan.launch:
                warn_prompt_cache(session.plan.base_url, salt)
            knobs = session.ran_with(knobs)  # a knob the engine ignored: fitted as it ran
            try:
                result = calibrate(session.plan, knobs, reference_model=reference_model,
                                   device=device, out_path=out, work_dir=work_dir, spec=spec,
                                   tokenizer_path=tokenizer,
                                   telemetry_interval_s=args.telemetry_interval_s,
                                   command=command_line(), replay={"prompt_salt": salt},
                                   log=lambda line: print(redact_url(line)))
            except KnobError:
                raise
            except (CalibrationError, ValueError) as exc:
                # the engine died, requests failed, too little was measured: the run failed,
                # and what it measured stays in the work folder (as replay's exit 1)
                print(f"batchlab calibrate: error: {shown_error(exc)}{_see(work_dir)}",
                      file=sys.stderr)
                return EXIT_FAILURE
    except KnobError as exc:
        raise UserError(shown_error(exc)) from None
    except EngineStartError as exc:  # nothing ran: a server that never answered or started
        raise UserError(f"{shown_error(exc)}{_see(work_dir)}") from None
    fit = result.fit
    c = fit.coefficients
    memory = ("no memory term" if not math.isfinite(fit.memory_bytes_per_s)
              else f"bytes / {fmt_rate(fit.memory_bytes_per_s, 'B/s')}")
    print(f"step = max({memory}, FLOPs / {fmt_rate(fit.compute_flops_per_s, 'FLOP/s')}) + "
          f"{fmt_duration(c['step_overhead_s'])} + {fmt_duration(c['per_seq_overhead_s'])}/seq"
          f" + {fmt_duration(c['per_kv_token_overhead_s'])}/KV token + "
          f"{fmt_duration(c['per_attention_pair_overhead_s'])}/attention pair; front end "
          f"{fmt_duration(c['frontend_latency_s'])}")
    print(f"fit: {fit.num_samples} samples ({fit.num_outliers} outliers), median |error| "
          f"{fit.median_abs_relative_error:.1%}, p90 {fit.p90_abs_relative_error:.1%}")
    for note in result.profile["metadata"]["notes"]:
        print(f"note: {note}")
    print(f"profile: {out}  (workload run folders: {work_dir})")
    return 0


def shown_error(exc: BaseException) -> str:
    """An error's message as it may be printed: a server that did not start is quoted with its
    argv and log tail, so the secrets of the command line (``--engine-env`` values, secret
    ``--extra-arg`` values, URL credentials) are scrubbed from it (``harness.redact``), as
    ``replay --engine`` does (``harness.live.run``)."""
    return scrub_text(str(exc), secret_values(argv=command_line()))


def _see(work_dir: Path) -> str:
    """Where the run folders and server logs are, when there are any."""
    return f"\n(run folders and server logs: {work_dir})" if work_dir.is_dir() else ""


def check_profile_out(out: Path, work_dir: Path, *, overwrite: bool = False,
                      dry_run: bool = False) -> None:
    """``--out`` is a file batchlab can write and ``--work-dir`` a folder it can make, checked
    before the engine starts (an unusable path found after the workload loses the fit). An
    existing profile, or run folders of an earlier calibration in ``work_dir``, are refused
    unless ``overwrite``; with it, those run folders are removed now, so that none of them is
    left beside the new ones as if measured with them. A ``dry_run`` measures nothing: neither
    refused nor removed."""
    from harness.runfolder import (
        RunDirError,
        ensure_creatable_dir,
        remove_run_dir,
        results_folder,
    )

    if out.is_dir():
        raise UserError(f"--out {out}: is a folder; give the profile's file path "
                        f"(e.g. {out / 'profile.json'})")
    if out.resolve() == work_dir.resolve():
        raise UserError(f"--out {out}: is the work folder the measurements go to (--work-dir, "
                        "by default the profile's path with .calibration): give the profile "
                        "another name, or --work-dir another folder")
    try:
        ensure_creatable_dir(out.parent, "--out")
        ensure_creatable_dir(work_dir, "--work-dir")
        earlier = sorted(p for p in work_dir.iterdir() if results_folder(p) is not None) \
            if work_dir.is_dir() and not dry_run else []
        if dry_run:
            return
        if not overwrite and (out.exists() or earlier):
            what = ([f"a profile at {out}"] if out.exists() else []) + (
                [f"an earlier calibration's run folders in {work_dir}"] if earlier else [])
            raise UserError(f"--out {out}: there is {' and '.join(what)}; pass --overwrite to "
                            "replace them, or choose another --out")
        for folder in earlier if overwrite else []:
            remove_run_dir(folder, "--work-dir")
    except RunDirError as exc:
        raise UserError(str(exc)) from None


def prepare_validation_out(out: Path, *, overwrite: bool) -> None:
    """``validate --out``: a folder of its own. A run's or sweep's folder is refused (its files
    would sit beside the validation's); an earlier validation is refused without
    ``--overwrite``, and with it its comparison and simulated run are removed before the
    engine is used, so that a validation stopped part way leaves no earlier result beside its
    new live run."""
    from harness.runfolder import RunDirError, refuse_results_folder, remove_run_dir
    from harness.validate import (
        FIDELITY_FILE,
        FIDELITY_MARKDOWN_FILE,
        LIVE_DIR,
        PER_REQUEST_FILE,
        SIMULATED_DIR,
    )

    try:
        refuse_results_folder(out, instead="validate writes live/, simulated/ and "
                              "fidelity.json in a folder of its own: choose another --out")
        earlier = [name for name in (FIDELITY_FILE, LIVE_DIR, SIMULATED_DIR)
                   if (out / name).exists()]
        if earlier and not overwrite:
            raise UserError(f"--out {out}: holds an earlier validation ({', '.join(earlier)}); "
                            "pass --overwrite to replace it, or choose another --out")
        if earlier:
            remove_run_dir(out / SIMULATED_DIR, "--out")
            for name in (FIDELITY_FILE, FIDELITY_MARKDOWN_FILE, PER_REQUEST_FILE):
                (out / name).unlink(missing_ok=True)
    except RunDirError as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(f"--out {out}: cannot replace the earlier validation: {exc}") from None


_WORKLOAD_FLAGS = {
    "num_output_tokens": "--output-tokens", "max_batch_size": "--max-batch-size",
    "long_prompt_tokens": "--long-prompt-tokens", "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens", "max_model_len": "--max-model-len",
}


def workload_flags(message: str) -> str:
    """A workload error in the command line's words: ``num_output_tokens`` ->
    ``--output-tokens``."""
    return re.sub(r"\b(" + "|".join(_WORKLOAD_FLAGS) + r")\b",
                  lambda m: _WORKLOAD_FLAGS[m.group(1)], message)


def fmt_duration(value_s: float) -> str:
    """Seconds in the unit that shows them: ``6.41 ms``, ``11.7 µs``, ``2.95 ns``, ``0 s``."""
    if value_s == 0 or not math.isfinite(value_s):
        return f"{value_s:g} s"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if abs(value_s) >= scale:
            return f"{value_s / scale:.3g} {unit}"
    return f"{value_s / 1e-9:.3g} ns"


def fmt_rate(value: float, unit: str) -> str:
    if not math.isfinite(value):
        return "inf"
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M")):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def add_validate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_subparser(
        sub, "validate",
        help="replay a trace live and on the calibrated reference; report prediction errors",
        description="Replay a held-out trace against a live engine and simulate it on the "
        "reference engine with the same knobs and a calibration profile; print predicted vs "
        "measured TTFT, TPOT and E2E (p50, p90, p99), throughput, running batch size and "
        "per-request errors. With --out DIR: DIR/fidelity.json, DIR/fidelity.md, "
        "DIR/per_request_errors.parquet and the run folders DIR/live and DIR/simulated "
        "(`batchlab report DIR/live DIR/simulated` compares them).",
        epilog="example:\n"
        "  batchlab validate --profile profiles/cpu-small-llama.json --engine vllm \\\n"
        "      --url http://127.0.0.1:8000 --model models/small-llama --max-num-seqs 16 \\\n"
        "      --max-num-batched-tokens 2048 --extra-arg=--dtype --extra-arg=float32 \\\n"
        "      --trace harness/data/azure_conv_excerpt.csv --limit 40 --max-model-len 1024 \\\n"
        "      --on-too-long clip --rate 2 --out reports/validate",
        formatter_class=RawDescriptionFormatter,
    )
    add_trace_options(p)
    add_engine_options(p)
    add_calibration_target_options(p)
    g = p.add_argument_group("validation")
    g.add_argument("--profile", required=True, metavar="PROFILE.json",
                   help="the calibration profile (from batchlab calibrate)")
    g.add_argument("--slo", help="SLOs for goodput, e.g. ttft_s=0.5,tpot_s=0.05")
    g.add_argument("--out", default="reports/validate", metavar="DIR",
                   help="where fidelity.json and the two run folders go (reports/validate)")
    g.add_argument("--overwrite", action="store_true",
                   help="replace an earlier validation in --out (refused without it)")


def cmd_validate(args: argparse.Namespace) -> int:
    from adapters.process import EngineStartError
    from harness.live.prompts import resolve_prompt_salt
    from harness.live.session import engine_session
    from harness.report.fidelity import render_fidelity_markdown
    from harness.validate import ValidationFailed, check_profile, run_validation

    engine_url_or_launch(args)
    knobs = knobs_from_args(args)
    reference_model = resolve_reference_model(args)
    try:  # before anything runs: a profile that cannot predict this engine is bad input
        check_profile(args.profile, gpu=args.gpu, reference_model=reference_model)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    trace = load_trace(args)
    if args.dry_run:
        print(f"would replay {len(trace.requests)} requests of {trace.source} and simulate "
              f"them with {args.profile} (reference model {reference_model})")
        return 0
    model_path = args.model_path or args.model
    out = Path(args.out)
    prepare_validation_out(out, overwrite=args.overwrite)
    replay_kwargs: dict[str, Any] = {"seed": args.seed,
                                     "prompt_salt": resolve_prompt_salt(args.prompt_salt)}
    if args.tokenizer:
        replay_kwargs["tokenizer_path"] = args.tokenizer
    spec = session_spec(args, knobs)
    bar = progress_bar(len(trace.requests), "validate")
    try:
        with engine_session(spec, out / "server") as session:
            if not session.plan.launch:
                warn_prompt_cache(session.plan.base_url, replay_kwargs["prompt_salt"])
                knobs = with_server_knobs(knobs, session.plan.base_url)
            knobs = session.ran_with(knobs)  # simulated as the engine ran
            fid = run_validation(session.plan, knobs, trace, profile=args.profile,
                                 reference_model=reference_model, out_dir=out, model=model_path,
                                 replay_kwargs=replay_kwargs, slo=parse_slo(args.slo),
                                 command=command_line(), progress=bar.update_to,
                                 telemetry_interval_s=args.telemetry_interval_s,
                                 metric_map=spec.metric_map, gpu=args.gpu,
                                 log=lambda line: print(redact_url(line), file=sys.stderr))
    except (KnobError, EngineStartError, ValueError) as exc:
        raise UserError(shown_error(exc)) from None
    except ValidationFailed as exc:  # everything is on disk; the comparison says what it covers
        bar.close()
        print(render_fidelity_markdown(exc.fidelity, title="Prediction fidelity", intro=False,
                                       live_engine=_live_engine(out)), end="")
        first = first_error_line(str(out / "live"))
        if first:
            print(f"Live requests failed; first error: {first}\n")
        print(f"batchlab validate: error: {shown_error(exc)}", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        bar.close()
    print(render_fidelity_markdown(fid, title="Prediction fidelity", intro=False,
                                   live_engine=_live_engine(out)), end="")
    speed = fid.get("engine_speed_vs_calibration") or {}
    if speed.get("before") is not None and speed.get("after") is not None:
        print(f"Engine speed since calibration (burst {speed['burst']} again): "
              f"{speed['before']:+.1%} before the replay, {speed['after']:+.1%} after "
              "(+: slower; a drifting machine, not the model).\n")
    else:
        reason = speed.get("before_reason") or speed.get("after_reason")
        print(f"Engine speed since calibration: not measured ({redact_url(str(reason))}).\n")
    first = first_error_line(str(out / "live"))
    if first:
        print(f"Live requests failed; first error: {first}\n")
    in_flight = fid.get("in_flight_requests")
    if in_flight:
        print(f"Requests in flight (send to finish, both sides from their timelines), mean: "
              f"predicted {in_flight['mean']['predicted']:.2f}, measured "
              f"{in_flight['mean']['measured']:.2f}.\n")
    print(f"results: {out}/fidelity.json  (compare: batchlab report {out}/live "
          f"{out}/simulated)")
    return 0


def _live_engine(out: Path) -> Any:
    """The live run's manifest ``engine`` record: a served reference engine's says its
    figures are predictions too (``render_fidelity_markdown``)."""
    from harness.manifest import read_manifest
    from harness.validate import LIVE_DIR

    return read_manifest(out / LIVE_DIR).get("engine")


def with_server_knobs(knobs: Knobs, base_url: str) -> Knobs:
    """Knobs the user left unset, taken from what an attached server reports about itself
    (llama.cpp: its slots and context), so the simulation runs the server's configuration
    rather than batchlab's defaults."""
    from harness.calibrate import probe_server_knobs

    reported = probe_server_knobs(base_url)
    unset = {k: v for k, v in reported.items() if not knobs.is_given(k)}
    if unset:
        print("server reports " + ", ".join(f"{k}={v}" for k, v in unset.items())
              + " (used where no knob was given)", file=sys.stderr)
    return knobs.with_defaults(unset)


def session_spec(args: argparse.Namespace, knobs: Knobs) -> TargetSpec:
    """The engine that calibrate and validate hold for several replays. Knobs given for an
    attached server describe it (they reach the reference), so they are not refused."""
    spec = live_target_spec(args, url=args.url)
    return replace(spec, knobs=knobs,
                   allow_approximate=args.allow_approximate or args.url is not None)
