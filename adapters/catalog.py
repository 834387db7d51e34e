"""The served engines by name, and their mapping tables rendered for people.

``batchlab engines`` prints ``mapping_text()``; ``docs/engines.md`` is ``mapping_markdown()``
(regenerate with ``batchlab engines --markdown > docs/engines.md``; a test keeps it current).
Every line is computed from the adapters' own tables, by running each rule on each value.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from adapters import llamacpp, openai, reference_served, tgi, trtllm, vllm
from adapters.base import (
    ATTACHED,
    CANONICAL_SIGNALS,
    UNKNOWN,
    Engine,
    KnobRule,
    Knobs,
    PriorityWire,
    Setting,
    TelemetrySpec,
    Unsupported,
)
from adapters.knobs import DTYPES, POLICIES, PREEMPTIONS, SPECS, ReferenceKnobs
from adapters.reference.cost_model import profile_scheduler_defaults, shipped_profiles

ENGINES = ("vllm", "tgi", "trtllm", "llamacpp", "openai", "reference")


@dataclass(frozen=True, slots=True)
class EngineInfo:
    name: str
    title: str
    rules: tuple[KnobRule, ...]
    fixed: tuple[str, ...]
    telemetry: TelemetrySpec
    launchable: bool
    priority: PriorityWire  # what its server makes of a request's priority


# The served reference speaks vLLM's wire (adapters.reference_served launches with vllm.WIRE),
# request priority included: harness/serve/openai.py answers 400 to a priority other than 0
# unless the server runs --policy priority, and adapters/reference/request.py orders the
# waiting queue by (priority, arrival).
REFERENCE_PRIORITY = replace(
    reference_served.WIRE.priority,
    source="harness/serve/openai.py (400 unless --policy priority), adapters/reference/request.py "
           "(ordered by priority, then arrival)")

INFO: dict[str, EngineInfo] = {
    "vllm": EngineInfo("vllm", "vLLM (V1 engine)", vllm.RULES, vllm.FIXED, vllm.TELEMETRY, True,
                       vllm.WIRE.priority),
    "tgi": EngineInfo("tgi", "Hugging Face TGI 3.x", tgi.RULES, tgi.FIXED, tgi.TELEMETRY, True,
                      tgi.WIRE.priority),
    "trtllm": EngineInfo(
        "trtllm", "TensorRT-LLM (trtllm-serve, PyTorch backend)", trtllm.RULES, trtllm.FIXED,
        trtllm.TELEMETRY, True, trtllm.WIRE.priority,
    ),
    "llamacpp": EngineInfo(
        "llamacpp", "llama.cpp llama-server", llamacpp.RULES, llamacpp.FIXED, llamacpp.TELEMETRY,
        True, llamacpp.WIRE.priority,
    ),
    "openai": EngineInfo(
        "openai", "any OpenAI-compatible server (attach only)", openai.RULES, openai.FIXED,
        openai.NO_METRICS, False, openai.PRIORITY,
    ),
    "reference": EngineInfo(
        "reference", "the reference engine served on the wall clock (batchlab serve reference)",
        reference_served.RULES, reference_served.FIXED, reference_served.TELEMETRY, True,
        REFERENCE_PRIORITY,
    ),
}


def make_adapter(
    name: str,
    *,
    model: str,
    served_model_name: str | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
    env: Mapping[str, str] | None = None,
    executable: str | None = None,
    runtime: str | None = None,
    metric_map: str | Mapping[str, str] | None = None,
    gpu: str | None = None,
    profile: str | None = None,
    reference: ReferenceKnobs | None = None,
) -> Engine:
    """An adapter by engine name. ``executable``: vLLM's or the reference's python, the
    trtllm-serve command or the llama-server binary; ``gpu``, ``profile`` (an engine profile
    to predict with) and ``reference`` (admission, KV blocks): the served reference's."""
    env = dict(env or {})
    if name != "reference" and (profile is not None
                                or (reference is not None and reference != ReferenceKnobs())):
        raise ValueError(f"{name}: an engine profile and the reference settings (admission, "
                         "KV blocks) apply to the reference engine only")
    if name == "vllm":
        return vllm.VllmAdapter(
            model=model, served_model_name=served_model_name, host=host, port=port,
            python=executable, env=env,
        )
    if name == "tgi":
        return tgi.TgiAdapter(
            model=model, served_model_name=served_model_name, host=host, port=port,
            runtime=runtime, env=env,
        )
    if name == "trtllm":
        return trtllm.TrtllmAdapter(
            model=model, served_model_name=served_model_name, host=host, port=port,
            command=executable or trtllm.COMMAND, env=env,
        )
    if name == "llamacpp":
        return llamacpp.LlamaCppAdapter(
            model=model, served_model_name=served_model_name, host=host, port=port,
            executable=executable, env=env,
        )
    if name == "openai":
        return openai.OpenAIAdapter(model=served_model_name or model, metric_map=metric_map)
    if name == "reference":
        return reference_served.ReferenceServedAdapter(
            model=model, served_model_name=served_model_name, host=host, port=port, gpu=gpu,
            python=executable, env=env, profile=profile, reference=reference or ReferenceKnobs(),
        )
    raise ValueError(f"unknown engine {name!r}; engines: {', '.join(ENGINES)}")


# ---------------------------------------------------------------- rendering

_DOMAINS: dict[str, tuple[Any, ...]] = {
    "policy": POLICIES,
    "preemption": PREEMPTIONS,
    "weights_dtype": DTYPES,
    "kv_cache_dtype": DTYPES,
    "chunked_prefill": (True, False),
    "prefix_caching": (True, False),
    "max_model_len": (None, "L"),
    "extra_args": (("ARGS...",),),
}
_SYMBOLS = {  # numeric knobs are shown with a symbol instead of a value
    "max_num_seqs": "N",
    "max_num_batched_tokens": "T",
    "gpu_memory_utilization": "F",
    "tensor_parallel_size": "TP",
}


@dataclass(frozen=True, slots=True)
class Row:
    knob: str
    when: str  # "policy=static", "policy=static, with preemption=none", ...
    target: str
    outcome: str  # "applied", "refused"
    settings: str
    note: str


# A knob a rule reads whose being unset matters on its own (the engine's default is none of
# its values): the docs show that case too. max_model_len has ``None`` among its values.
_UNSET: Any = object()
_UNSET_MATTERS = frozenset({"weights_dtype"})


def _show(value: Any) -> str:
    if value is _UNSET:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "unset"
    if isinstance(value, tuple):
        return " ".join(value)
    return str(value)


def _domain(name: str, *, unset: bool) -> tuple[Any, ...]:
    values = _DOMAINS.get(name, (_SYMBOLS.get(name, "V"),))
    return (*values, _UNSET) if unset and None not in values else values


def _knobs(values: dict[str, Any], defaults: Mapping[str, Any]) -> Knobs:
    """Knobs with ``values``, where ``_UNSET`` ones are not given (the engine's defaults)."""
    unset = {name for name, value in values.items() if value is _UNSET}
    knobs = replace(Knobs(), **{n: v for n, v in values.items() if v is not _UNSET})
    if not unset:
        return knobs
    return replace(knobs, given=frozenset(Knobs.names()) - unset).with_defaults(defaults)


def _when(head: str, names: tuple[str, ...], combo: tuple[Any, ...]) -> str:
    if not combo:
        return head
    return head + " (" + ", ".join(
        f"{d}={_show(v)}" for d, v in zip(names, combo, strict=True)) + ")"


def _cases(rule: KnobRule, defaults: Mapping[str, Any]
           ) -> Iterator[tuple[str, list[tuple[str, Knobs]]]]:
    """Each value of the knob, with its cases: one per value of the knobs it depends on."""
    own = _DOMAINS.get(rule.knob, (_SYMBOLS.get(rule.knob, "V"),))
    others = [_domain(d, unset=d in _UNSET_MATTERS) for d in rule.depends_on]
    for value in own:
        head = f"{rule.knob}={_show(value)}"
        cases = []
        for combo in itertools.product(*others):
            knobs = _knobs({rule.knob: value, **dict(zip(rule.depends_on, combo, strict=True))},
                           defaults)
            cases.append((_when(head, rule.depends_on, combo), knobs))
        yield head, cases


def _derived_rows(rule: KnobRule, defaults: Mapping[str, Any]) -> Iterator[Row]:
    """The unset cases where the knob follows others instead of its default or pin."""
    if rule.follows is None:
        return
    reads = rule.follows.reads
    for combo in itertools.product(*(_domain(d, unset=True) for d in reads)):
        knobs = _knobs({rule.knob: _UNSET, **dict(zip(reads, combo, strict=True))}, defaults)
        derived = rule.follows.derive(knobs)
        if derived is None:
            continue
        flags = derived.setting.fragments()
        yield Row(rule.knob, _when(f"{rule.knob} unset", reads, combo), rule.target,
                  "pinned" if flags else "engine default", _settings(derived.setting),
                  derived.why)


def _settings(setting: Setting) -> str:
    return "; ".join(setting.fragments()) or "(no flag)"


def rows(info: EngineInfo) -> list[Row]:
    """Every rule on every value (and on each value of the knobs it depends on)."""
    if not info.launchable:
        return []  # nothing reaches a server batchlab does not start
    out = []
    defaults = {r.knob: r.default for r in info.rules
                if r.default is not UNKNOWN and not r.pinned}
    for rule in info.rules:
        if rule.knob in ("max_model_len", "extra_args"):
            pass  # unset is one of their own values below
        elif rule.pinned:
            out.append(Row(rule.knob, f"{rule.knob} unset", rule.target, "pinned",
                           _settings(_as_setting(rule.map(Knobs()))),
                           f"batchlab passes its default: {rule.pinned}"))
        else:
            default = ("not known to batchlab" if rule.default is UNKNOWN
                       else _show(rule.default))
            source = f" ({rule.default_source})" if rule.default_source else ""
            out.append(Row(rule.knob, f"{rule.knob} unset", rule.target, "engine default",
                           "(no flag)", f"the engine's own default: {default}{source}"))
        out.extend(_derived_rows(rule, defaults))
        for head, cases in _cases(rule, defaults):
            value_rows = [_row(rule, when, rule.map(knobs)) for when, knobs in cases]
            if len(value_rows) > 1 and len({replace(r, when="") for r in value_rows}) == 1:
                value_rows = [replace(value_rows[0], when=head)]  # the same whatever the others
            out.extend(value_rows)
    return out


def _row(rule: KnobRule, when: str, result: Setting | Unsupported) -> Row:
    if isinstance(result, Unsupported):
        if result.approximated_as:
            instead = f"with --allow-approximate: approximated as {result.approximated_as}"
        else:
            instead = "with --allow-approximate: not applied"
        if result.instead.fragments():
            instead += f" ({_settings(result.instead)})"
        return Row(rule.knob, when, rule.target, "refused", "", f"{result.reason}; {instead}")
    return Row(rule.knob, when, rule.target, "applied", _settings(result), result.note)


def _as_setting(result: Setting | Unsupported) -> Setting:
    return result.instead if isinstance(result, Unsupported) else result


def mapping_text() -> str:
    lines: list[str] = []
    for info in INFO.values():
        lines.append(f"== {info.name}: {info.title}")
        for fixed in info.fixed:
            lines.append(f"   always: {fixed}")
        if not info.launchable:
            lines.append("   knobs: none reach it; each is recorded as not applied")
        for row in rows(info):
            result = "REFUSED at plan time" if row.outcome == "refused" else row.settings
            lines.append(f"   {row.when:<44} -> {result}")
            if row.note:
                lines.append(f"   {'':<44}    ({row.note})")
        lines.append(f"   telemetry: {_telemetry_line(info.telemetry)}")
        lines.append("")
    return "\n".join(lines)


def _telemetry_line(spec: TelemetrySpec) -> str:
    if spec.format == "none":
        return "none by default (openai: --metric-map)"
    if not spec.signals:
        return f"{spec.format} at {spec.path}"
    notes = dict(spec.notes)

    def noted(name: str) -> str:
        return f"{name} ({notes[name]})" if name in notes else name

    parts = []
    for name, src in spec.signals:
        if not src.expected:
            continue  # read if present, but not claimed: listed as missing below
        source = " | ".join(src.names)
        if src.kind == "ratio":
            source += " / " + " | ".join(src.denominator)
        elif src.kind != "gauge":
            source += f" ({src.kind})"
        parts.append(f"{noted(name)} <- {source}")
    missing = [name for name in CANONICAL_SIGNALS
               if (read := spec.source(name)) is None or not read.expected]
    if missing:
        parts.append("missing: " + ", ".join(noted(name) for name in missing))
    return f"{spec.path}: " + "; ".join(parts)


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def mapping_markdown() -> str:
    out = [
        "# Engines and knob mapping",
        "",
        "<!-- Generated by `batchlab engines --markdown > docs/engines.md`; do not edit. -->",
        "",
        "batchlab describes every engine with the same uniform knobs (`adapters/knobs.py`, "
        "`Knobs`). Each adapter maps them through one table in code; the tables below are "
        "computed from those tables by running every rule on every value. A value an engine "
        "cannot honour is **refused at plan time**; with `--allow-approximate` it is recorded "
        "in the run's `manifest.json` as *approximated* or *not applied* instead, never "
        "silently dropped.",
        "",
        "A knob you do not give is *unset*: the engine keeps its own default, no flag is "
        "passed, nothing is refused, and the manifest records the default (status `default`) "
        "where batchlab knows it. A few knobs are *pinned*: passed with batchlab's default "
        "even when unset, for the reason given in their row.",
        "",
        "Numeric knobs are shown with symbols: N (`max_num_seqs`), T (`max_num_batched_tokens`), "
        "F (`gpu_memory_utilization`), TP (`tensor_parallel_size`), L (`max_model_len`). "
        "`extra_args` are appended to the engine's argv as given, and a flag of a knob they "
        "also set is found whichever way it is written (`_` or `-`, a short form such as "
        "vLLM's `-q` or llama.cpp's `-c`, or TensorRT-LLM's command-line flag for a key of its "
        "YAML). A knob left unset, or given with the value `extra_args` set "
        "(`--max-num-seqs 64` with `max_num_seqs=64`; numbers and on/off switches compared as "
        "the engine reads them), passes none of its flags and is recorded as overridden by "
        "`extra_args`. A knob given with another value (`--max-num-seqs 128` with "
        "`max_num_seqs=64`), or whose value leaves out a flag `extra_args` set (vLLM's "
        "`-q fp8` with `weights_dtype=bf16`), is refused at plan time, naming both: drop one "
        "of the two. TensorRT-LLM's `--config` "
        "(or `--extra_llm_api_options`) in `extra_args` is refused: it would replace the "
        "generated YAML, and with it every knob mapped there.",
        "",
        "An environment variable given with `--engine-env` (or a scenario's `env:`) that a "
        "knob maps to (TGI's `PREFILL_CHUNKING`, `PREFIX_CACHING`, `TGI_WIGGLE_ROOM`) wins "
        "over the knob the same way: a knob left unset is recorded as overridden by "
        "`--engine-env NAME=V`; a knob given with another value is refused at plan time.",
        "",
        "`gpu_memory_utilization` means what it means for vLLM: the share of the GPU's total "
        "memory for weights, activations and KV cache. TGI's `--cuda-memory-fraction` is "
        "converted to give the same KV budget; TensorRT-LLM's `free_gpu_memory_fraction` is "
        "a share of the memory left after loading and cannot be converted, so it is only "
        "approximated.",
        "",
        "Try a mapping without starting anything: "
        "`batchlab replay --engine vllm --launch --model-path models/tiny-llama "
        "--max-num-seqs 8 --dry-run --trace harness/data/azure_conv_excerpt.csv`.",
        "",
        *_live_and_profile_section(),
    ]
    for info in INFO.values():
        out.append(f"## {info.name}: {info.title}")
        out.append("")
        out.append("Always passed:")
        out.append("")
        out.extend(f"- {_md(fixed)}" for fixed in info.fixed)
        out.append("")
        table = rows(info)
        if table:
            out.append("| knob value | engine setting | outcome | notes |")
            out.append("|---|---|---|---|")
        else:
            out.append("No knob reaches a server batchlab does not start: each is recorded as "
                       "not applied, and asking for a non-default value fails unless "
                       "`--allow-approximate` is given.")
        for row in table:
            settings = f"`{_md(row.settings)}`" if row.settings else ""
            out.append(f"| `{_md(row.when)}` | {settings} | {row.outcome} | {_md(row.note)} |")
        out.append("")
        out.append(f"Telemetry: {_md(_telemetry_line(info.telemetry))}")
        out.append("")
    out.extend([
        "## Telemetry columns",
        "",
        "A live run that knows its engine (`--engine NAME`, launched or with `--url`; every "
        "live scenario cell) writes `telemetry.parquet`, scraped every 0.25 s (a plain "
        "`replay --target URL` scrapes nothing: it does not know which metrics to read): `t_s`, "
        "`num_running`, `num_waiting`, `kv_usage` (0..1), `num_preemptions` (increase since "
        "the previous scrape), `num_steps`, `num_batched_tokens`, `batch_tokens_mean`, "
        "`prefix_cache_queries`, `prefix_cache_hits` (prompt tokens looked up in the prefix "
        "cache and found, increases), `missing` and `scrape_error`. A signal the engine "
        "does not export is null and named in `missing`, never 0. Metric names renamed "
        "between engine versions are read through aliases, newest first (vLLM "
        "`kv_cache_usage_perc`, then `gpu_cache_usage_perc`).",
        "",
        "## Lifecycle",
        "",
        "A launched server runs in its own process group, bound to 127.0.0.1 on a free port, "
        "with stdout and stderr in the run folder (`<engine>-server.stdout.log`, "
        "`.stderr.log`). batchlab polls its health route until it answers (`--ready-timeout-s`, "
        "900 s by default); if the process dies first or time runs out, the error quotes the "
        "log's last lines. Teardown sends SIGTERM to the whole group, then SIGKILL after a "
        "grace period, on success, failure, Ctrl-C, SIGTERM and SIGHUP alike. The engine's "
        "version (`/version`, or `/info` on TGI) is recorded in `manifest.json` with the exact "
        "argv, the server's pid and process group, the generated config file, the knobs and "
        "their mapping, the model, the trace digest, the host and the batchlab version.",
        "",
        "batchlab measures only a server it started: a `--port` something already listens on "
        "is refused before launch; at ready, the listening socket must belong to the launched "
        "process group (Linux `/proc`; skipped for container runtimes, whose proxy holds the "
        "port), and `batchlab serve reference` must echo the launch's nonce "
        "(`BATCHLAB_LAUNCH_NONCE`) in `/version`. No server outlives batchlab, even when "
        "batchlab is killed with SIGKILL: the kernel sends the server SIGTERM when batchlab "
        "dies (`PR_SET_PDEATHSIG`), and a small watchdog process, which notices batchlab's "
        "end when its pipe closes, sends SIGTERM and then SIGKILL to the server's whole "
        "process group. Environment values given with `--engine-env` (or a scenario's `env:`) "
        "are stored and shown (`--dry-run`) as `***` unless the name is on a short allow-list "
        "of known-safe settings (`harness/redact.py`), and so are values after secret-named "
        "flags in `--extra-arg`. TGI in a container gets its environment by name (`-e NAME`, "
        "the value in the container client's environment), so no value shows in `ps`.",
        "",
        "## Real engines on a CPU",
        "",
        "`make engines` (part of `make test`) installs `vllm-cpu` into `.venvs/vllm` and builds "
        "two random-weight Llama models with a locally trained tokenizer (`models/tiny-llama`, "
        "2.2M parameters, and `models/small-llama`, 28M), with no model hub. It keeps what a "
        "stamp file says is current, so a second run takes about a second. The vLLM adapter "
        "finds that venv by itself when neither `--engine-executable`, `$BATCHLAB_VLLM_PYTHON` "
        "nor a `vllm` command on PATH is there, and starts `python -m "
        "vllm.entrypoints.openai.api_server`, because the `vllm` command of `vllm-cpu` is "
        "broken; the `launcher` line of `--dry-run` and of the manifest's `launch` record says "
        "which program was chosen and why. On 2 cores vLLM needs about a minute to start "
        "(`--extra-arg=--enforce-eager` skips a 35 s compile); bound its KV cache with "
        "`--engine-env VLLM_CPU_KVCACHE_SPACE=1` (GiB).",
        "",
        "`make engines` also builds llama.cpp's `llama-server` from the source vendored in the "
        "`llama-cpp-python` sdist (only the server target, Release, CPU only; about 8-11 "
        "minutes on 2 cores when cold, then cached outside the checkout in "
        "`$BATCHLAB_CACHE_DIR/llama.cpp`, default `~/.cache/batchlab`, and linked as "
        "`.build/llama-server`), and converts each model to GGUF beside its folder "
        "(`models/small-llama.gguf`, `scripts/hf_to_gguf.py`). `--engine llamacpp --launch "
        "--model models/small-llama` loads that GGUF and still makes prompts of exact length "
        "with the folder's tokenizer; the server is ready in about a second. Its events are "
        "not tokens (it holds back incomplete UTF-8 and streams special tokens as empty "
        "text), so batchlab asks it for `timings_per_token` and counts its running "
        "`predicted_n`. Attached to a llama-server (`--url`), batchlab records the knobs it "
        "reports (`/props`: slots and context per slot) and warns that it caches prompts "
        "(`--prompt-salt auto` gives each run fresh prompts).",
        "",
    ])
    return "\n".join(out)


@dataclass(frozen=True, slots=True)
class UnsetDifference:
    """One knob whose value, left unset, differs between a live launch and the profiles."""

    engine: str
    knob: str  # the uniform knob, with the engine setting it concerns
    live: str  # what a live launch passes with the knob unset
    profiles: str  # what the engine's shipped profiles predict with, by profile
    engine_default: str  # the engine's own default, with where it was read


def _by_profile(engine: str, knob: str) -> dict[Any, list[str]]:
    """The value each shipped profile of ``engine`` records for ``knob``, grouped by value."""
    values: dict[Any, list[str]] = {}
    for name in shipped_profiles():
        if name.startswith(f"{engine}-"):
            value = profile_scheduler_defaults(name).get(knob)
            if value is not None:
                values.setdefault(value, []).append(name)
    return values


def _profiles_text(values: Mapping[Any, list[str]]) -> str:
    return "; ".join(f"{value} ({', '.join(names)})" for value, names in values.items())


def unset_differences() -> list[UnsetDifference]:
    """The knobs that, left unset, mean one value in a live launch and another in a shipped
    profile: computed from the adapters' tables and the profiles."""
    out = []
    vllm_rules = {r.knob: r for r in vllm.RULES}
    for knob, own in vllm.GPU_BATCH_DEFAULTS.items():
        live = getattr(Knobs(), knob)  # the pinned value vLLM is launched with
        values = _by_profile("vllm", knob)
        if set(values) - {live}:
            out.append(UnsetDifference(
                "vllm", knob, _settings(_as_setting(vllm_rules[knob].map(Knobs()))) + " (pinned)",
                _profiles_text(values), f"{own} ({vllm.GPU_BATCH_DEFAULTS_SOURCE})"))
    values = _by_profile("tgi", "max_num_seqs")
    if set(values) - {tgi.MAX_CONCURRENT_REQUESTS}:
        out.append(UnsetDifference(
            "tgi", tgi.ADMISSION_CAP_KNOB, f"{tgi.ADMISSION_CAP_LIVE} (always passed)",
            _profiles_text(values),
            f"{tgi.DEFAULT_MAX_CONCURRENT_REQUESTS} ({tgi.MAX_CONCURRENT_REQUESTS_SOURCE})"))
    return out


def _live_and_profile_section() -> list[str]:
    out = [
        "## Unset knobs: a live launch and a profile differ",
        "",
        "An unset knob does not mean the same in a live launch and in a prediction. A live "
        "launch passes batchlab's own values for a few knobs (pinned, or always passed); a "
        "prediction with an engine profile uses the value the profile records, which is the "
        "engine's own default on the profile's GPU. A live cell and a predicted cell with "
        "these knobs unset therefore run different configurations:",
        "",
        "| engine | knob | live launch, knob unset | profiles, knob unset | engine's own "
        "default |",
        "|---|---|---|---|---|",
    ]
    out.extend(f"| {d.engine} | `{_md(d.knob)}` | `{_md(d.live)}` | {_md(d.profiles)} | "
               f"{_md(d.engine_default)} |" for d in unset_differences())
    vllm_flags = " and ".join(f"`{SPECS[knob].flag}`" for knob in vllm.GPU_BATCH_DEFAULTS)
    out.extend([
        "",
        f"To compare a live cell with a predicted one, set these knobs on both: vLLM {vllm_flags}; "
        "for TGI, whose live launch always admits up to "
        f"{tgi.MAX_CONCURRENT_REQUESTS} requests ({tgi.ADMISSION_CAP_WHY}), give the predicted "
        f"cell `{SPECS['max_num_seqs'].flag} {tgi.MAX_CONCURRENT_REQUESTS}`.",
        "",
    ])
    return out


def replay_defaults(engine: str) -> dict[str, Any]:
    """Replay-client settings (``ReplayConfig`` fields) an engine is best measured with, which
    the caller's own settings override (llama.cpp: its exact running token count)."""
    return dict(llamacpp.REPLAY_DEFAULTS) if engine == llamacpp.NAME else {}


def priority_wire(engine: str | None) -> PriorityWire:
    """What ``engine``'s server makes of a request's priority (its adapter's ``ServerWire``).
    None, a plain ``--target`` replay that names no engine, or a name batchlab does not know:
    vLLM's convention, as the trace has it, and nothing known beyond the policy."""
    info = INFO.get(engine) if engine is not None else None
    return info.priority if info is not None else PriorityWire()


# ---------------------------------------------------------------- servers batchlab did not start

UNKNOWN_KNOB = "unknown"


def server_reported_knobs(props: Any, slots: Any = None) -> dict[str, Any]:
    """The knobs a running server reports about itself, from what its self-description
    endpoints answered; empty when it reports none. llama.cpp's ``/props`` (and ``/slots``):
    its slots and one slot's context. Servers that describe no knob (vLLM, TGI, ...) give {}."""
    if isinstance(props, Mapping) and ("total_slots" in props
                                       or "default_generation_settings" in props):
        return llamacpp.reported_knobs(props, slots)
    config = served_reference_config(props)
    if config is not None:
        return _served_reference_knobs(config)
    if props is None and isinstance(slots, list):
        return llamacpp.reported_knobs(None, slots)
    return {}


def served_reference_config(probe_body: Any) -> Mapping[str, Any] | None:
    """The configuration a ``batchlab serve reference`` publishes in its ``/version`` and
    ``/info`` answers (``reference``); None for any other server."""
    config = probe_body.get("reference") if isinstance(probe_body, Mapping) else None
    return config if isinstance(config, Mapping) else None


def _served_reference_knobs(config: Mapping[str, Any]) -> dict[str, Any]:
    """The uniform knobs of a ``batchlab serve reference``, from the configuration its
    ``/version`` and ``/info`` publish (``ReferenceConfig.as_dict``)."""
    renamed = {"tp": "tensor_parallel_size"}
    out: dict[str, Any] = {"extra_args": []}  # it takes none
    for key, value in config.items():
        name = renamed.get(key, key)
        if name in Knobs.names() and name != "extra_args":
            out[name] = value
    return out

def attached_knobs(knobs: Knobs, reported: Mapping[str, Any]) -> tuple[dict[str, Any],
                                                                        dict[str, str]]:
    """The knobs of a server batchlab attached to, as far as anyone knows them.

    No knob reaches such a server, so batchlab's own defaults say nothing about it: each knob
    is what the user stated (given), else what the server reports, else ``"unknown"``.
    Returns ``(values, sources)`` with sources ``stated``, ``reported`` or ``unknown``.
    """
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name in Knobs.names():
        if knobs.is_given(name):
            value: Any = getattr(knobs, name)
            values[name] = list(value) if isinstance(value, tuple) else value
            sources[name] = "stated"
        elif name in reported:
            values[name], sources[name] = reported[name], "reported"
        else:
            values[name], sources[name] = UNKNOWN_KNOB, "unknown"
    return values, sources


def attached_mapping(values: Mapping[str, Any], sources: Mapping[str, str]
                     ) -> list[dict[str, Any]]:
    """The manifest's mapping of an attached server: nothing applied, each knob as known."""
    notes = {"stated": "as stated on the command line; ", "reported": "as the server reports; ",
             "unknown": ""}
    return [{"knob": name, "value": values[name], "flags": [], "status": "not_applied",
             "note": notes.get(sources.get(name, "unknown"), "") + ATTACHED}
            for name in Knobs.names()]


def attached_manifest(knobs: Knobs, probe_body: Any = None,
                      known: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``manifest.json`` fields of a server batchlab attached to: ``knobs`` (stated, reported
    or ``"unknown"``), ``knob_sources`` and a ``mapping`` that applies nothing.
    ``probe_body``: what the server's version probe answered (llama.cpp: ``/props``). A served
    reference also says which GPU and model it models: ``gpu`` and ``model`` where ``known``
    (the manifest so far) has none."""
    values, sources = attached_knobs(knobs, server_reported_knobs(probe_body))
    fields: dict[str, Any] = {"knobs": values, "knob_sources": sources,
                              "mapping": attached_mapping(values, sources)}
    config = served_reference_config(probe_body)
    for key in ("gpu", "model"):
        if config is not None and config.get(key) and not (known or {}).get(key):
            fields[key] = config[key]
    return fields
