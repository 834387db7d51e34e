"""Live commands: ``replay`` (against a URL, or an engine batchlab launches or attaches to),
``summarize`` and ``engines``."""

from __future__ import annotations

import argparse
import functools
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adapters.catalog import ENGINES
from adapters.knobs import KnobError
from harness.cli.common import (
    EXIT_FAILURE,
    GPU_HELP,
    MAX_FAILED_HELP,
    OVERWRITE_HELP,
    PROMPT_SALT_HELP,
    RawDescriptionFormatter,
    UserError,
    add_gpu_option,
    add_knob_flags,
    add_subparser,
    add_trace_options,
    command_line,
    fraction,
    holding_folder,
    knobs_from_args,
    load_trace,
    parse_slo,
    print_live_headline,
    progress_bar,
    refuse_cell,
    too_many_failed,
)
from harness.redact import redact_url
from harness.results import nothing_served
from harness.target import RunOptions, TargetSpec, unused_option
from harness.targets import LiveTarget

if TYPE_CHECKING:
    from harness.traces import Trace

MAX_CELLS_SHOWN = 4  # cell folders a refusal to summarize a scenario's folder names


def add_replay(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_subparser(
        sub, "replay",
        help="replay a trace against a running server and measure every streamed chunk",
        description="Send each trace request to a server at its arrival time (open loop) or "
        "from N users (closed loop), streaming, and record when every chunk arrived. Writes "
        "records.jsonl as requests finish, then requests.parquet, chunks.parquet, summary.json "
        "and manifest.json. Ctrl-C keeps what was measured; `batchlab summarize DIR` rebuilds "
        "the summary from records.jsonl. How timings are taken: docs/metrics.md (Live runs).",
        epilog="examples:\n"
        "  batchlab replay --target http://127.0.0.1:8000 --protocol openai --model m \\\n"
        "      --trace harness/data/azure_conv_excerpt.csv --time-scale 0.5 --out reports/live\n"
        "  batchlab replay --target http://127.0.0.1:8080 --protocol tgi --trace synthetic \\\n"
        "      --num-requests 200 --prompt-tokens 512 --output-tokens 128 \\\n"
        "      --mode closed --concurrency 16 --slo ttft_s=0.5,tpot_s=0.05",
        formatter_class=RawDescriptionFormatter,
    )
    add_trace_options(p)
    g = p.add_argument_group("replay")
    g.add_argument("--target", metavar="URL",
                   help="base URL of the server, e.g. http://127.0.0.1:8000")
    g.add_argument("--protocol", choices=("openai", "openai-chat", "tgi"), default="openai",
                   help="openai: /v1/completions (token-id prompts without --tokenizer); "
                   "openai-chat: /v1/chat/completions; tgi: /generate_stream (default openai)")
    g.add_argument("--model", metavar="NAME", help="model name sent in each request (with "
                   "--engine E --url URL: the one the server lists at /v1/models or /info when "
                   "not given)")
    g.add_argument("--mode", choices=("open", "closed"), default="open",
                   help="open: send at trace arrival times (default); closed: --concurrency "
                   "users, each sending its next request when the last one ends")
    g.add_argument("--concurrency", type=int, metavar="N", help="closed loop: number of users")
    g.add_argument("--max-concurrency", type=int, metavar="N",
                   help="open loop: at most N requests in flight; held requests go out in "
                   "arrival order, never faster than the trace's mean rate")
    g.add_argument("--timeout-s", type=float, default=600.0, metavar="S",
                   help="per-request limit from send to end of stream (600)")
    g.add_argument("--tokenizer", metavar="PATH",
                   help="local tokenizer folder (or tokenizer.json) of the served model: "
                   "prompts of exact token length; no hub access")
    g.add_argument("--slo", help="SLOs for goodput, e.g. ttft_s=0.5,tpot_s=0.05,e2e_s=20")
    g.add_argument("--client-lag-threshold-s", type=float, default=0.010, metavar="S",
                   help="flag the run client-limited when send-lag p99 exceeds S (0.010)")
    g.add_argument("--api-key-env", metavar="VAR",
                   help="environment variable holding a bearer API key (the key is never "
                   "printed or stored)")
    g.add_argument("--length-control", choices=("vllm", "transformers", "max_tokens"),
                   default="vllm",
                   help="how an OpenAI server is asked for exactly the trace's output length: "
                        "vllm = max_tokens+min_tokens+ignore_eos (vLLM, TRT-LLM, llama.cpp); "
                        "transformers = generation_config min/max_new_tokens (transformers "
                        "serve); max_tokens = upper bound only (default vllm)")
    g.add_argument("--http-client", choices=("lean", "httpx"), default="lean",
                   help="lean: batchlab's streaming HTTP/1.1 client, parsing in the socket "
                   "callback (default; several times the capacity); httpx: the httpx library")
    g.add_argument("--prompt-salt", default="none", metavar="auto|TEXT|none",
                   help=PROMPT_SALT_HELP)
    g.add_argument("--max-failed", type=fraction, default=None, metavar="F",
                   help=MAX_FAILED_HELP)
    g.add_argument("--out", default="reports/replay", help="run folder (reports/replay)")
    g.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    g.add_argument("--workers", type=int, default=1, metavar="N",
                   help="send from N processes, each with its own event loop (the trace split "
                   "round-robin, one shared clock, one merged run folder; send lag checked per "
                   "worker): for load one client core cannot send. With --target only (1)")
    add_engine_options(p)


def replay_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``ReplayConfig`` fields from the command line, all but the target URL."""
    from harness.live.prompts import resolve_prompt_salt

    return {
        "protocol": args.protocol,
        "model": args.model,
        "mode": args.mode,
        "concurrency": args.concurrency,
        "max_concurrency": args.max_concurrency,
        "timeout_s": args.timeout_s,
        "tokenizer_path": args.tokenizer,
        "slo": parse_slo(args.slo),
        "client_lag_threshold_s": args.client_lag_threshold_s,
        "api_key_env": args.api_key_env,
        "seed": args.seed,
        "http_client": args.http_client,
        "length_control": args.length_control,
        "prompt_salt": resolve_prompt_salt(args.prompt_salt),
    }


def cmd_replay(args: argparse.Namespace) -> int:
    from harness.live.replay import ReplayConfig, replay_sync
    from harness.live.workers import WorkerError, replay_workers

    refuse_cell(Path(args.out))
    refuse_bad_url("--target", args.target)
    refuse_bad_url("--url", args.url)
    if args.engine:
        if args.workers != 1:
            raise UserError("--workers: only for a replay against --target (not with --engine)")
        return cmd_replay_engine(args)
    _refuse_engine_options_without_engine(args)
    if not args.target:
        raise UserError("--target URL is required (the server to replay against)")
    check_workers(args.workers)
    trace = load_trace(args)
    num_workers = workers_for(args.workers, len(trace.requests))
    try:
        config = ReplayConfig(target_url=args.target, **replay_kwargs(args))
        config.validate()
    except ValueError as exc:
        raise UserError(str(exc)) from None
    out = Path(args.out)
    warn_prompt_cache(config.target_url, config.prompt_salt)
    server = _who_answers(config.target_url)
    earlier = _run_id_in(out)  # another run's folder, refused below, is not this one's
    bar = progress_bar(len(trace.requests), "replay")
    failed: WorkerError | None = None
    ended = False  # the replay returned: no error or interrupt is on its way out
    recorded: list[bool] = []

    def record() -> None:  # before the first request: a run killed outright keeps it too
        if server is not None:
            _record_server(out, server, quiet=False)
            recorded.append(True)

    try:
        if args.workers != 1:
            summary = replay_workers(trace, config, out, num_workers=num_workers,
                                     progress=bar.update_to, command=command_line(),
                                     overwrite=args.overwrite, on_start=record)
        else:
            summary = replay_sync(trace, config, out, progress=bar.update_to,
                                  command=command_line(), overwrite=args.overwrite,
                                  on_start=record)
        ended = True
    except ValueError as exc:  # a tokenizer that cannot be loaded, ...
        raise UserError(str(exc)) from None
    except WorkerError as exc:  # a worker failed or died: a failed run, what it measured kept
        failed = exc
    finally:
        bar.close()
        if server is not None and not recorded and _run_id_in(out) not in (None, earlier):
            _record_server(out, server, quiet=not ended)  # claimed here, stopped before it
    if failed is not None:
        if failed.summary:
            print_live_headline(failed.summary, str(out))
        print(f"error: {failed}", file=sys.stderr)
        return EXIT_FAILURE
    print_live_headline(summary, str(out))
    print(f"results: {out}/")
    gone = server_gone(out, summary, config.target_url)
    if gone:
        print(f"error: {gone}", file=sys.stderr)
        return EXIT_FAILURE
    return no_request_served(summary, config.target_url, out, args.max_failed)


def check_workers(num_workers: int) -> None:
    """``--workers`` below 1 or above the machine's bound, refused before the trace is read."""
    from harness.live.workers import check_num_workers

    try:
        check_num_workers(num_workers, "--workers")
    except ValueError as exc:
        raise UserError(str(exc)) from None


def workers_for(num_workers: int, num_requests: int) -> int:
    """The workers a ``--workers`` replay of ``num_requests`` starts: at most one per request,
    said on stderr when that is fewer than asked."""
    from harness.live.workers import num_workers_to_start

    started = num_workers_to_start(num_workers, num_requests, "--workers")
    if started < num_workers:
        print(f"note: --workers {num_workers}: the trace has {num_requests} requests, so "
              f"{started} workers start (one more would have nothing to send)", file=sys.stderr)
    return started


def server_gone(out: Path, summary: dict[str, Any], url: str) -> str | None:
    """Why an attached server failed the run, said in its summary and manifest: it stopped
    answering, or it was restarted under the run with another configuration (``harness.
    scenario.attached.fail_if_gone``, ``fail_if_restarted``), with where the results are;
    None when it did not."""
    from harness.scenario.attached import fail_if_gone, fail_if_restarted

    why = fail_if_gone(out, summary, url) or fail_if_restarted(out, summary, url)
    return None if why is None else f"{redact_url(why)} (the results are in {out})"


def _run_id_in(out: Path) -> str | None:
    """The run id of the manifest in ``out``; None without a readable one. Every run that
    claims a folder writes a new one there first (``harness.runfolder.claim_run_dir``)."""
    from harness.manifest import read_manifest

    run_id = read_manifest(out).get("run_id")
    return str(run_id) if run_id else None


def _record_server(out: Path, server: dict[str, Any], *, quiet: bool) -> None:
    """Add what the server said of itself to the run's manifest. ``quiet``: the run is ending
    on an error (a full disk, a dead worker) or an interrupt of its own, which a failure to
    write the manifest here must not replace: that failure is then only said on stderr."""
    from harness.manifest import update_manifest

    try:
        update_manifest(out, {"engine": server, **_served_reference_fields(server, out)})
    except OSError as exc:
        if not quiet:
            raise
        reason = exc.strerror or str(exc)
        print(f"warning: {out / 'manifest.json'} could not be updated either ({reason}): it "
              "lacks the server's record; how the run ended follows", file=sys.stderr)


def _served_reference_fields(server: dict[str, Any], out: Path) -> dict[str, Any]:
    """What a ``batchlab serve reference`` says of itself (``/version``: its configuration),
    as manifest fields: the knobs it ran with, its GPU and model. {} for any other server,
    whose knobs a plain replay does not record."""
    from adapters.catalog import attached_manifest, served_reference_config
    from adapters.knobs import Knobs
    from harness.manifest import read_manifest

    body = (server.get("version_probe") or {}).get("body")
    if served_reference_config(body) is None:
        return {}
    return attached_manifest(Knobs(given=frozenset()), body, known=read_manifest(out))


def _who_answers(url: str) -> dict[str, Any] | None:
    """The engine record of a server replayed with ``--target`` (started outside batchlab):
    what its ``/version`` or ``/info`` says, as ``replay --engine --url`` records it. A
    ``batchlab serve reference`` answers with its prediction record, so the report labels its
    figures predicted. None when neither answers (recorded as unknown, never guessed)."""
    import asyncio

    from adapters.process import probe_version

    probe = asyncio.run(probe_version(url, ("/version", "/info")))
    if probe.get("body") is None:
        return None
    body = probe["body"]
    name = body.get("engine") if isinstance(body, dict) else None
    if name == "batchlab-reference":  # the served reference: named as --engine reference names it
        name = "reference"
    return {"name": name if isinstance(name, str) else None, "mode": "attach",
            "base_url": url, "version": probe.get("version"), "version_probe": probe}


def no_request_served(summary: dict[str, Any], url: str | None, out: Path,
                      max_failed: float | None = None) -> int:
    """EXIT_FAILURE, said on stderr, when the run sent requests and none succeeded (nothing
    listening, a wrong URL or model name), or more than ``max_failed`` of them failed
    (``--max-failed``): its files are kept, but a script or CI job must not take it for a
    measurement. One that served nothing says so in its summary and manifest too (status
    ``failed``, with the reason): a job that reads only the summary sees it."""
    served_none = nothing_served(summary, out)  # as simulate, scenario cells and probes say it
    if served_none is not None:
        from harness.manifest import record_failed

        if set(summary.get("failures") or {}) == {"connect_error"}:
            served_none += f"; is the server at {redact_url(str(url))} up?"
        print(f"error: {served_none}", file=sys.stderr)
        record_failed(out, summary, served_none)
        return EXIT_FAILURE
    too_many = too_many_failed(summary, max_failed)
    if too_many:
        print(f"error: {too_many}", file=sys.stderr)
        return EXIT_FAILURE
    return 0


def warn_prompt_cache(url: str, salt: str) -> None:
    """Say so when an attached server may answer batchlab's repeated prompts from its cache."""
    from harness.live.prompts import prompt_cache_warning

    warning = prompt_cache_warning(url, salt)
    if warning:
        print(warning, file=sys.stderr)


def refuse_bad_url(flag: str, url: str | None) -> None:
    """A server URL that no client could send to, refused as bad input naming ``flag``,
    before a trace is loaded, a server probed or a run folder claimed."""
    from harness.live.config import target_url_problem

    why = None if url is None else target_url_problem(url, flag)
    if why:
        raise UserError(why)


def _refuse_engine_options_without_engine(args: argparse.Namespace) -> None:
    """Engine options mean nothing without ``--engine``: refuse them rather than drop them
    (``--dry-run`` would otherwise send real traffic, ``--engine-env`` or a knob would be
    recorded as given and change nothing). Every option of the engine and uniform-knob groups
    counts (``_engine_only_options``); an option is given when its value is not its default."""
    given = [_flag_given(flags, getattr(args, dest, default))
             for flags, dest, default in _engine_only_options()
             if getattr(args, dest, default) != default]
    if given:
        raise UserError(f"{', '.join(given)}: only with --engine NAME (the engine to plan, "
                        "launch or attach to); a plain --target replay only sends the trace's "
                        "requests, so it would ignore them")


@functools.cache
def _engine_only_options() -> tuple[tuple[tuple[str, ...], str, Any], ...]:
    """``(flags, dest, default)`` of every option of ``replay``'s engine and uniform-knob
    groups but ``--engine`` itself, read from the parser ``add_replay`` builds: an option added
    there later is refused without ``--engine`` too. (``--max-model-len`` is a trace option:
    it clips the trace, with or without an engine.)"""
    sub = argparse.ArgumentParser().add_subparsers()
    add_replay(sub)
    parser = sub.choices["replay"]
    return tuple((tuple(action.option_strings), action.dest, action.default)
                 for group in parser._action_groups if group.title in ENGINE_GROUPS
                 for action in group._group_actions if action.dest != "engine")


def _flag_given(flags: Sequence[str], value: object) -> str:
    """The flag that set ``value``: ``--no-X`` for a False of ``--X/--no-X``, else the first."""
    negative = [f for f in flags if f.startswith("--no-")]
    return negative[0] if value is False and negative else flags[0]


def add_summarize(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_subparser(
        sub, "summarize",
        help="rebuild a run folder's summary (after a crash or with other SLOs)",
        description="Rebuild requests.parquet, chunks.parquet and summary.json of a live run "
        "folder from its records.jsonl (what survives a crash or Ctrl-C), or re-summarise any "
        "run folder's requests.parquet, e.g. under different SLOs. A report.md in the folder "
        "is drawn again from the new summary; until then it says it is out of date.",
        epilog="example: batchlab summarize reports/live --slo ttft_s=0.5,tpot_s=0.05",
    )
    p.add_argument("run_dir", metavar="DIR", help="run folder")
    p.add_argument("--slo", help="SLOs for goodput (default: the run's own, from manifest.json)")


def cmd_summarize(args: argparse.Namespace) -> int:
    from harness.live.rundir import rebuild_summary
    from harness.results import CHUNKS_FILE, REPORT_FILE, REQUESTS_FILE, SUMMARY_FILE
    from harness.scenario.schema import SCENARIO_FILE
    from harness.scenario.status import record_rewritten

    run_dir = Path(args.run_dir)
    slo = parse_slo(args.slo)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such folder")
    _refuse_scenario_folder(run_dir)
    # a run, sweep or report writing the folder now: refused; held while it is rewritten
    with holding_folder(run_dir, "a summary"):
        # the report quotes the summary about to be rewritten, and is drawn again from the new
        # one below: marked out of date first, so that a summarize stopped in between (Ctrl-C,
        # a closed pipe) leaves a report saying so, never one that disagrees with summary.json
        drawn_before = (run_dir / REPORT_FILE).exists()
        try:
            if drawn_before:
                from harness.report import mark_run_report_stale

                mark_run_report_stale(run_dir, "`batchlab summarize` was rewriting the "
                                      f"{SUMMARY_FILE} and tables it was drawn from")
            summary = rebuild_summary(run_dir, slo=slo)
            # a scenario cell: what was rewritten here is the cell's result, not damage to it
            record_rewritten(run_dir, (SUMMARY_FILE, REQUESTS_FILE, CHUNKS_FILE))
        except (ValueError, OSError) as exc:
            raise UserError(str(exc)) from None
        print_live_headline(summary, args.run_dir)
        _say_if_unfinished(run_dir, summary)
        print(f"summary: {run_dir / SUMMARY_FILE}")
        if drawn_before:
            from harness.report import render_run_report

            print(f"report: {render_run_report(run_dir)}")
    scenario_dir = run_dir.parent
    if (scenario_dir / SCENARIO_FILE).is_file():  # its report quotes every cell's summary
        print(f"the scenario's report ({scenario_dir / 'report.md'}) was not updated: "
              f"`batchlab report {shlex.quote(str(scenario_dir))}` renders it again from its "
              "cells' summaries")
    return 0


def _refuse_scenario_folder(folder: Path) -> None:
    """A scenario sweep's or capacity search's folder holds its cells' runs, not one of its
    own: UserError naming what it is, with a few of its cell folders to summarize instead."""
    from harness.runfolder import results_folder

    found = results_folder(folder)
    if found is None or found.kind not in ("scenario", "capacity", "search"):
        return
    cells = sorted(p.name for p in folder.iterdir() if _run_or_cell(p))
    said = f"{folder}: {found.describe()}, not a run folder: summarize one of its cells"
    if cells:
        shown = ", ".join(shlex.quote(str(folder / name)) for name in cells[:MAX_CELLS_SHOWN])
        more = (f" (and {len(cells) - MAX_CELLS_SHOWN} more)"
                if len(cells) > MAX_CELLS_SHOWN else "")
        said += f" instead, e.g. {shown}{more}"
    raise UserError(said)


def _run_or_cell(folder: Path) -> bool:
    from harness.runfolder import results_folder

    found = results_folder(folder)
    return found is not None and found.kind in ("run", "cell")


def _say_if_unfinished(run_dir: Path, summary: dict[str, Any]) -> None:
    """A run whose manifest never said how it ended (killed outright, or still running) is
    summarized from what it recorded: say so, and how much of its trace that is."""
    from harness.manifest import read_manifest

    manifest = read_manifest(run_dir)
    if manifest.get("status") not in ("running", "starting"):
        return
    trace = manifest.get("trace") or {}
    total = trace.get("num_requests") if isinstance(trace, dict) else None
    of = f" of the trace's {total}" if isinstance(total, int) else ""
    said = (f"warning: {run_dir}'s manifest still says {manifest['status']!r}, and no "
            "batchlab process is writing it: the run was killed outright (SIGKILL, a power "
            f"cut). These figures cover the {summary.get('num_requests', 0)} requests{of} ")
    if "num_sent_unrecorded" in summary:  # every send was recorded as it went out
        in_flight = int((summary.get("failures") or {}).get("not_finished") or 0)
        not_sent = summary.get("num_not_sent")
        said += (f"it sent; the {in_flight} in flight when it stopped are rows as "
                 "not_finished" + (f", and {not_sent} were never sent"
                                   if isinstance(not_sent, int) else ""))
    else:  # a folder of an older batchlab: sends were not recorded
        said += "it recorded; requests in flight when it stopped are lost"
    print(said, file=sys.stderr)
    engine = manifest.get("engine") or {}
    if isinstance(engine, dict) and engine.get("mode") == "launch":
        # batchlab stores no secret value, so nothing can scrub these logs after the fact
        print(f"warning: {run_dir}'s server logs (*.log) were never scrubbed: they may hold "
              "what the server printed (its argv, its environment). They are readable by "
              "their owner only; delete them or mask them before sharing the folder",
              file=sys.stderr)


# ---------------------------------------------------------------- engines


ENGINE_GROUPS = ("engine", "uniform knobs")  # add_engine_options's groups, by title


def add_engine_options(p: argparse.ArgumentParser, *, gpu_help: str | None = None) -> None:
    """Engine and uniform-knob options of a live replay (``--engine``); see docs/engines.md."""
    g = p.add_argument_group(
        ENGINE_GROUPS[0],
        "launch an engine with mapped knobs (--launch) or attach to one (--url); "
        "`batchlab engines` shows each engine's mapping",
    )
    g.add_argument("--engine", choices=ENGINES,
                   help="engine to drive; with it the run folder gets manifest.json (argv, "
                   "knob mapping, engine version) and telemetry.parquet")
    how = g.add_mutually_exclusive_group()
    how.add_argument("--launch", action="store_true",
                     help="start the engine (bound to 127.0.0.1, a free port) and stop it after")
    how.add_argument("--url", metavar="URL", help="attach to an engine already running at URL")
    g.add_argument("--model-path", metavar="PATH",
                   help="what the launched engine loads (local folder or hub id); default: "
                   "--model. Requests carry --model (default: this path)")
    g.add_argument("--allow-approximate", action="store_true",
                   help="record knobs the engine cannot honour as approximated or not applied "
                   "instead of failing")
    g.add_argument("--dry-run", action="store_true",
                   help="print the launch argv, generated config file and knob mapping; start "
                   "nothing")
    g.add_argument("--engine-env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for the launched server (repeatable), e.g. "
                   "VLLM_CPU_KVCACHE_SPACE=1")
    g.add_argument("--engine-executable", metavar="PATH",
                   help="vllm: the python that has vLLM (default $BATCHLAB_VLLM_PYTHON, a "
                   "`vllm` command, or .venvs/vllm/bin/python); trtllm: the trtllm-serve command")
    g.add_argument("--container-runtime", choices=("native", "docker", "podman"),
                   help="tgi: run text-generation-launcher natively or in the official image "
                   "(default: native if installed, else docker/podman)")
    g.add_argument("--metric-map", metavar="MAP",
                   help="openai: telemetry names, a preset (llamacpp, vllm, transformers, none) "
                   "or canonical=metric pairs, e.g. num_running=foo_running,num_waiting=foo_q")
    g.add_argument("--port", type=int, help="port of the launched server (default: a free one)")
    g.add_argument("--ready-timeout-s", type=float, default=900.0, metavar="S",
                   help="how long to wait for the server's /health: a launched one (900), "
                   "one at --url (at most 30)")
    g.add_argument("--telemetry-interval-s", type=float, default=0.25, metavar="S",
                   help="seconds between /metrics scrapes (0.25)")
    add_gpu_option(g, gpu_help or GPU_HELP + "; the served reference simulates it, other "
                   "engines record it")
    add_knob_flags(p)


def engine_env(items: Sequence[str]) -> dict[str, str]:
    """``--engine-env KEY=VALUE`` items as a mapping. One that is not KEY=VALUE is refused
    naming its place, never its text: its value is likely a secret (``HF_TOKENhf_...``)."""
    env: dict[str, str] = {}
    for place, item in enumerate(items, start=1):
        key, sep, value = item.partition("=")
        if not sep or not key:
            what = "no '=' in it" if not sep else "nothing before its '='"
            raise UserError(f"--engine-env (the {_ordinal(place)} one): expected KEY=VALUE, "
                            f"{what} (its text is not repeated: it may hold a secret)")
        env[key] = value
    return env


def _ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 12th, 21st, ..."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def live_target_spec(args: argparse.Namespace, *, url: str | None = None) -> TargetSpec:
    """The live target the engine options describe (``--launch`` or ``--url``)."""
    from adapters.openai import parse_metric_map

    if not args.launch and url is None:
        raise UserError(f"--engine {args.engine}: give --launch to start it or --url URL")
    refuse_bad_url("--url", url)
    for option, flag, value in (("runtime", "--container-runtime", args.container_runtime),
                                ("executable", "--engine-executable", args.engine_executable),
                                ("engine_env", "--engine-env", args.engine_env),
                                ("port", "--port", args.port),
                                ("metric_map", "--metric-map", args.metric_map)):
        why = unused_option(option, args.engine, value, launch=bool(args.launch))
        if why:
            raise UserError(f"{flag} {why}: it would be ignored")
    model_path = args.model_path or getattr(args, "model", None)
    if not model_path and url is not None and not args.launch:
        model_path = served_model(url, args.engine)  # a running server says what it serves
    if not model_path:
        raise UserError(f"--engine {args.engine}: give --model-path (what the engine loads) or "
                        "--model")
    try:
        metric_map = parse_metric_map(args.metric_map) if args.metric_map else None
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if args.port is not None and not 1 <= args.port <= 65535:
        raise UserError(f"--port: expected a port from 1 to 65535, got {args.port}")
    return TargetSpec(
        args.engine, "launch" if args.launch else "attach", knobs=knobs_from_args(args),
        model=model_path, served_model_name=getattr(args, "model", None) or model_path,
        gpu=args.gpu, url=url, allow_approximate=args.allow_approximate,
        engine_env=engine_env(args.engine_env), executable=args.engine_executable,
        runtime=args.container_runtime, metric_map=metric_map, port=args.port,
        ready_timeout_s=args.ready_timeout_s, telemetry_interval_s=args.telemetry_interval_s,
    )


def served_model(url: str, engine: str) -> str:
    """The one model a running server serves, from its ``/v1/models`` (OpenAI servers) or
    ``/info`` (TGI): what ``replay --engine E --url URL`` sends when no --model is given."""
    import asyncio

    from adapters.process import probe_version

    probe = asyncio.run(probe_version(url, ("/v1/models", "/info")))
    body = probe.get("body")
    names: list[str] = []
    if isinstance(body, dict) and isinstance(body.get("data"), list):
        names = [str(m["id"]) for m in body["data"] if isinstance(m, dict) and m.get("id")]
    elif isinstance(body, dict) and isinstance(body.get("model_id"), str):
        names = [body["model_id"]]
    if len(names) == 1:
        return names[0]
    tried = [str(t) for t in probe.get("tried") or []]
    if tried and all("ConnectError" in t or "ConnectTimeout" in t for t in tried):
        # nothing listening: that, not a missing --model, is the problem
        raise UserError(f"--engine {engine} --url {redact_url(url)}: no server answers there "
                        f"({'; '.join(tried)}); is it up?")
    said = (f"it serves {', '.join(names)}: choose one" if names
            else f"it named none at /v1/models or /info ({'; '.join(tried)})"
            if tried else "it named none at /v1/models or /info")
    raise UserError(f"--engine {engine} --url {redact_url(url)}: give --model (the served "
                    f"model name); {said}")


def run_engine(args: argparse.Namespace, trace: Trace, replay: dict[str, Any],
               out_dir: str, *, url: str | None = None,
               progress: Callable[[int, int], None] | None = None,
               command: Sequence[str] | None = None) -> dict[str, Any]:
    """The live run of ``replay --engine``: plan, launch or attach, replay, tear down.

    KnobError and a server that does not start become UserError / a printed failure.
    """
    from adapters.process import EngineStartError

    target = LiveTarget(live_target_spec(args, url=url or args.url))
    options = RunOptions(progress=progress, command=command, replay=replay,
                         overwrite=getattr(args, "overwrite", False))
    try:
        return target.run(trace, Path(out_dir), options, dry_run=args.dry_run)
    except KnobError as exc:
        raise UserError(str(exc)) from None
    except EngineStartError as exc:
        logs = " and the server logs there" if args.launch else ""  # attached: none of ours
        raise UserError(f"{exc}\n(see {out_dir}/manifest.json{logs})") from None


def cmd_replay_engine(args: argparse.Namespace) -> int:
    """``replay --engine``: the replay above, around an engine batchlab plans and launches."""
    from adapters.process import EngineExited

    if args.target and args.launch:
        raise UserError("--target and --launch: give --launch to start the engine, or the URL "
                        "of a running one")
    if args.target and args.url and args.target.rstrip("/") != args.url.rstrip("/"):
        raise UserError("--target and --url name different servers; give one of them")
    trace = load_trace(args)
    command = command_line()
    if args.dry_run:
        run_engine(args, trace, replay_kwargs(args), args.out, url=args.target,
                    command=command)
        return 0
    replay = replay_kwargs(args)
    url = args.target or args.url
    if url is not None and not args.launch:
        warn_prompt_cache(url, replay["prompt_salt"])
    bar = progress_bar(len(trace.requests), f"replay {args.engine}")
    try:
        summary = run_engine(args, trace, replay, args.out, url=args.target,
                              progress=bar.update_to, command=command)
    except ValueError as exc:  # replay options, a tokenizer that cannot be loaded, ...
        raise UserError(str(exc)) from None
    except EngineExited as exc:  # what was measured is on disk: said, then a failure
        bar.close()
        print_live_headline(exc.summary, args.out)
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        bar.close()
    print_live_headline(summary, args.out)
    print(f"results: {args.out}/ (manifest.json: engine version, argv, knob mapping)")
    gone = server_gone(Path(args.out), summary, url) if url and not args.launch else None
    if gone:  # (a launched engine's exit is EngineExited above)
        print(f"error: {gone}", file=sys.stderr)
        return EXIT_FAILURE
    return no_request_served(summary, url or "the launched engine", Path(args.out),
                             args.max_failed)


def add_engines(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_subparser(
        sub, "engines",
        help="show how the uniform knobs map to each engine's flags",
        description="Print every engine adapter's mapping table: which flag, config key or "
        "environment variable each uniform knob becomes, and which values are refused at plan "
        "time (or approximated with --allow-approximate).\n\n"
        "example: batchlab engines\n"
        "         batchlab engines --markdown > docs/engines.md",
        formatter_class=RawDescriptionFormatter,
    )
    p.add_argument("--markdown", action="store_true",
                   help="print docs/engines.md (the same tables as Markdown)")


def cmd_engines(args: argparse.Namespace) -> int:
    from adapters.catalog import mapping_markdown, mapping_text

    sys.stdout.write(mapping_markdown() if args.markdown else mapping_text())
    return 0
