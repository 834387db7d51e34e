"""The one Engine interface, and the uniform knobs every engine is described by.

An adapter maps ``Knobs`` to its engine's own flags through one table in code
(``KnobMapping``); a knob it cannot honour fails at plan time unless approximation is allowed,
and is then recorded, never silently dropped.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from adapters.knobs import SPECS, KnobError, Knobs

# The knob vocabulary lives in adapters.knobs; these names are re-exported for the adapters.
__all__ = ["KnobError", "Knobs"]

UNKNOWN: Any = object()  # an engine default batchlab does not know (it may depend on the GPU)

# A URL's userinfo, as harness.redact masks it (adapters import no harness): after "scheme://",
# up to the last "@" of the authority.
_URL_USERINFO = re.compile(r"(?<=://)[^/?#\s\"<>\\`]*@")


def shown_url(text: str) -> str:
    """``text`` with the user and password of every URL in it masked, for a message or the
    dry run: ``http://bob:pw@host:8000`` -> ``http://***@host:8000``."""
    return _URL_USERINFO.sub("***@", text) if "@" in text else text

# applied: as asked; approximated: something close, said how; not_applied: the engine does
# not get it; default: unset by the user, the engine's own value applies
KnobStatus = Literal["applied", "approximated", "not_applied", "default"]


@dataclass(frozen=True, slots=True)
class MappedKnob:
    """How one uniform knob became engine flags: applied, approximated or not applied."""

    knob: str
    value: Any
    flags: tuple[str, ...] = ()  # argv fragment, config key, or env assignment
    # default: unset by the user, so the engine's own default applies (``value`` when known)
    status: KnobStatus = "applied"
    note: str = ""
    # what set the knob's engine setting instead of batchlab, in that order: "extra_args" (a
    # flag they also set), "--engine-env" (a variable given there); empty: nothing did
    overridden_by: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class LogCheck:
    """A knob value some builds of an engine ignore, and the line their server log then shows.

    Checked once a launched server is ready (``harness.live.session``): a match in its stdout
    or stderr means the engine runs with ``runs_with`` instead, and the run records the knob as
    not applied, with ``note`` (why, and the source that shows it)."""

    knob: str
    pattern: str  # a regular expression, searched line by line
    runs_with: Any
    note: str
    # knobs left unset whose value the plan derived from ``knob`` as asked (vLLM's token
    # budget without chunking): the engine runs with the value the plan passed
    derived: tuple[str, ...] = ()

    def found_in(self, log_text: str) -> bool:
        return re.search(self.pattern, log_text, re.MULTILINE) is not None


# ---------------------------------------------------------------- telemetry description
#
# Adapters describe where each canonical signal lives in their engine's /metrics; the scraper
# (harness/telemetry.py) reads them. A signal an engine does not export is left out, and is then
# reported as missing (None), never as zero.

CANONICAL_SIGNALS = ("num_running", "num_waiting", "kv_usage", "num_preemptions", "batch_tokens",
                     "prefix_cache_queries", "prefix_cache_hits")


@dataclass(frozen=True, slots=True)
class MetricSource:
    """Where one canonical signal comes from in a Prometheus exposition.

    ``names`` are sample names, newest first: the first one present in a scrape wins, which is
    how names renamed between engine versions are resolved (aliases).
    """

    names: tuple[str, ...]
    # gauge: the value; counter: the increase since the previous scrape; ratio: names/denominator;
    # histogram: ``<name>_sum`` and ``<name>_count`` increases (tokens and engine steps).
    kind: Literal["gauge", "counter", "ratio", "histogram"] = "gauge"
    denominator: tuple[str, ...] = ()  # ratio only, aliases as for names
    reduce: Literal["sum", "mean"] = "sum"  # across label sets (several engines or models)
    # False: read when a server exports it, but the build batchlab documents does not (an old
    # name kept for older builds): `batchlab engines` lists the signal as missing
    expected: bool = True


@dataclass(frozen=True, slots=True)
class TelemetrySpec:
    """How to read an engine's telemetry: where, in which format, and which names mean what."""

    path: str = "/metrics"
    format: Literal["prometheus", "trtllm_json", "none"] = "prometheus"
    signals: tuple[tuple[str, MetricSource], ...] = ()  # canonical name -> source
    # canonical name -> what the engine exports near it and why it is (not) read as that signal;
    # shown by `batchlab engines`, read by nothing
    notes: tuple[tuple[str, str], ...] = ()

    def source(self, signal: str) -> MetricSource | None:
        for name, src in self.signals:
            if name == signal:
                return src
        return None


# ---------------------------------------------------------------- request priority
#
# A trace's priority is vLLM's: an int, lower is served first, default 0 (harness.traces
# TraceRequest). Adapters say what their engine's server makes of a request's "priority" field;
# the replay reads it to decide whether and in which scale priorities are sent
# (harness.live.protocols.plan_priority), and never names an engine.

# the scale a server reads: vLLM's int (lower first, sent as the trace has it), or a float in
# (0, 1) served higher first (TensorRT-LLM's), sent converted by ``unit_float_priority``
PriorityScale = Literal["vllm-int", "unit-float-higher-first"]
# what a server does with a priority other than 0 when its policy is not priority: refuses the
# request (HTTP 400), accepts and ignores it, has no request priority at all (whatever the
# policy), or nothing batchlab knows beyond the policy
PriorityOffPolicy = Literal["http-400", "ignored", "no-priority", "unstated"]

UNIT_FLOAT_RULE = "0.5 - atan(p)/pi"


def unit_float_priority(priority: int) -> float:
    """A trace priority ``p`` (vLLM's: lower first, default 0) on the unit-float scale
    (TensorRT-LLM's: a float in [0, 1], higher first, default 0.5): ``0.5 - atan(p)/pi``.

    Strictly decreasing, so the order is kept and reversed onto that scale; 0 maps to 0.5, its
    default (a request without a priority and one with 0 are alike, as in vLLM); every int
    stays inside (0, 1) and distinct from its neighbours (-1 -> 0.75, 1 -> 0.25, 5 -> 0.063).
    It keeps only the order, not the gaps: TensorRT-LLM compares priorities, it does not weigh
    them."""
    return 0.5 - math.atan(priority) / math.pi


@dataclass(frozen=True, slots=True)
class PriorityWire:
    """What an engine's server makes of a request's ``priority`` field."""

    scale: PriorityScale = "vllm-int"
    off_policy: PriorityOffPolicy = "unstated"
    # how the manifest's priority note names the server (needed by the unit-float scale,
    # "ignored" and "no-priority"): "TensorRT-LLM"
    server: str = ""
    # where the facts were read (../shared/reference/engines.md sections, engine files); shown
    # by nothing
    source: str = ""

    @property
    def rule(self) -> str:
        """How a trace priority ``p`` is written on the wire."""
        return UNIT_FLOAT_RULE if self.scale == "unit-float-higher-first" else "p"

    def value(self, priority: int) -> int | float:
        """``priority`` (the trace's) as this server reads it."""
        if self.scale == "unit-float-higher-first":
            return unit_float_priority(priority)
        return priority


# ---------------------------------------------------------------- the mapping table
#
# Each adapter has ONE table: a ``KnobRule`` per uniform knob. A rule turns the knobs into a
# ``Setting`` (argv, config-file keys, environment) or says the engine cannot honour the value
# (``Unsupported``), with what approximation, if any, ``--allow-approximate`` uses instead.

CONFIG_DIR = "{config_dir}"  # placeholder in argv for the folder generated config files go to


@dataclass(frozen=True, slots=True)
class Setting:
    """What a knob value becomes on an engine: any mix of argv, config-file keys and env."""

    argv: tuple[str, ...] = ()
    config: tuple[tuple[str, Any], ...] = ()  # dotted key in the generated config file -> value
    env: tuple[tuple[str, str], ...] = ()
    note: str = ""  # a semantic difference worth recording even though the value is applied

    def fragments(self) -> tuple[str, ...]:
        """Human-readable pieces for the manifest: ``--flag v``, ``key: v``, ``ENV=v``."""
        out: list[str] = []
        if self.argv:
            out.append(shlex.join(self.argv))
        out.extend(f"{key}: {_yaml_scalar(value)}" for key, value in self.config)
        out.extend(f"{key}={value}" for key, value in self.env)
        return tuple(out)


@dataclass(frozen=True, slots=True)
class Unsupported:
    """The engine cannot honour this value: a plan-time error unless approximation is allowed."""

    reason: str
    instead: Setting = Setting()  # what --allow-approximate does instead (often nothing)
    approximated_as: str = ""  # set: recorded as "approximated as ..."; empty: "not applied"


@dataclass(frozen=True, slots=True)
class Derived:
    """The value an unset knob takes from other knobs, instead of a fixed default."""

    value: Any  # the value in effect; UNKNOWN: the engine derives it and batchlab cannot say
    why: str
    setting: Setting = Setting()  # empty: no flag, the engine derives the value itself


@dataclass(frozen=True, slots=True)
class Follows:
    """How an unset knob follows other knobs (vLLM's token budget with chunked prefill off
    must cover max_model_len, so batchlab's usual fallback would fail at start-up)."""

    reads: tuple[str, ...]  # the knobs ``derive`` reads (the docs show each case)
    derive: Callable[[Knobs], Derived | None]  # None: the usual default or pin applies


@dataclass(frozen=True, slots=True)
class KnobRule:
    """One row of an adapter's mapping table."""

    knob: str
    target: str  # the engine setting(s) this knob drives, as shown in `batchlab engines`
    map: Callable[[Knobs], Setting | Unsupported]
    depends_on: tuple[str, ...] = ()  # other knobs ``map`` reads (the docs show each case)
    default: Any = UNKNOWN  # the engine's own value when the knob is unset
    default_source: str = ""  # where that default was read: repo, path, commit, date read
    pinned: str = ""  # why the adapter passes this knob even when unset (batchlab's fallback)
    follows: Follows | None = None  # unset: where its value follows other knobs


@dataclass(frozen=True, slots=True)
class FlagNames:
    """How an engine spells its flags, so that ``extra_args`` setting a mapped knob are found
    however they are written: ``_`` and ``-`` are the same, ``aliases`` maps other names of a
    flag to one (``q`` -> ``quantization``), and ``config_keys`` names the command-line flag
    that sets the same field as a generated config-file key (TensorRT-LLM's
    ``max_batch_size`` and ``--max_batch_size``)."""

    aliases: Mapping[str, str] = field(default_factory=dict)  # name -> name, without dashes
    config_keys: Mapping[str, str] = field(default_factory=dict)  # dotted key -> flag

    def name(self, token: str) -> str | None:
        """``--max_num_seqs=8`` -> ``max-num-seqs``; ``-q`` -> ``quantization``; else None."""
        read = self._read(token)
        return None if read is None else read[0]

    def _read(self, token: str) -> tuple[str, bool] | None:
        """The flag's one name, and whether the token turns it off (``--no-x``, or an alias
        of ``no-x``: llama.cpp's ``-nocb``)."""
        name = _flag_name(token)
        if name is None:
            return None
        negated = token.lstrip("-").replace("_", "-").startswith("no-")
        name = self.aliases.get(name, name)
        if name.startswith("no-"):
            name, negated = name[3:], not negated
        return name, negated

    def of(self, setting: Setting) -> set[str]:
        """The flags a setting sets, its config-file keys included."""
        names = {self.name(token) for token in setting.argv}
        names |= {self.name(self.config_keys[key]) for key, _ in setting.config
                  if key in self.config_keys}
        return {n for n in names if n}

    def written(self, argv: tuple[str, ...]) -> dict[str, str]:
        """Each flag ``argv`` sets, by its one name, as it was written there."""
        out: dict[str, str] = {}
        for token in argv:
            name = self.name(token)
            if name:
                out.setdefault(name, token.split("=", 1)[0])
        return out

    def values(self, argv: tuple[str, ...]) -> dict[str, Arg]:
        """The value ``argv`` gives each flag, by its one name, as an engine's parser reads
        it: the text after ``=``, else the next item unless that is a flag, else a switch
        (on; off for ``--no-x``). A flag given twice takes its last value, as argparse, click
        and llama.cpp read it."""
        out: dict[str, Arg] = {}
        i = 0
        while i < len(argv):
            token, read = argv[i], self._read(argv[i])
            i += 1
            if read is None:
                continue
            name, negated = read
            if "=" in token:
                flag, text = token.split("=", 1)
                out[name] = Arg(flag, token, text)
            elif i < len(argv) and self._read(argv[i]) is None:
                out[name] = Arg(token, shlex.join((token, argv[i])), argv[i])
                i += 1
            else:
                out[name] = Arg(token, token, not negated)
        return out

    def set_by(self, setting: Setting) -> dict[str, Arg]:
        """The value a setting gives each flag it sets, its config-file keys included (shown
        as the key, ``max_batch_size: 64``)."""
        out = self.values(setting.argv)
        for key, value in setting.config:
            name = self.name(self.config_keys[key]) if key in self.config_keys else None
            if name:
                out[name] = Arg(key, f"{key}: {_yaml_scalar(value)}",
                                value if isinstance(value, bool) else str(value))
        return out


@dataclass(frozen=True, slots=True)
class Arg:
    """A flag's value in an argv, and the items that gave it, as written."""

    flag: str  # ``--max-num-seqs``, ``--max_num_seqs``, ``-nocb``, ``max_batch_size``
    written: str  # ``--max-num-seqs 8``, ``--max_num_seqs=8``, ``-nocb``, ``max_batch_size: 8``
    value: str | bool  # the text of its value; a switch: on (True) or off (False)


def with_engine_defaults(
    rules: tuple[KnobRule, ...],
    defaults: Mapping[str, Any],
    *,
    pinned: Mapping[str, str] | None = None,
    sources: Mapping[str, str] | None = None,
) -> tuple[KnobRule, ...]:
    """A table whose rules know the engine's own defaults, where each was read (``sources``),
    and which knobs are always passed."""
    unknown = (set(defaults) | set(pinned or {}) | set(sources or {})) - {r.knob for r in rules}
    if unknown:
        raise KnobError(f"defaults for knobs the table has no rule for: {sorted(unknown)}")
    return tuple(
        replace(r, default=defaults.get(r.knob, UNKNOWN), pinned=(pinned or {}).get(r.knob, ""),
                default_source=(sources or {}).get(r.knob, ""))
        for r in rules
    )


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _flag_name(token: str) -> str | None:
    """``--no-enable_x=1`` -> ``enable-x``: the flag a token sets, ignoring ``no-``, values and
    the spelling of ``_`` (vLLM and TensorRT-LLM read ``--max_num_seqs`` as ``--max-num-seqs``)."""
    if not token.startswith("-") or token == "-" or token == "--" or _is_number(token):
        return None
    name = token.lstrip("-").split("=", 1)[0].replace("_", "-")
    return name[3:] if name.startswith("no-") else name


def _is_number(token: str) -> bool:
    """``-1`` is a value (llama.cpp's ``-np -1``), not a flag."""
    try:
        float(token)
    except ValueError:
        return False
    return True


def _possible_settings(rule: KnobRule, knobs: Knobs, setting: Setting) -> list[Setting]:
    """``setting`` and what the rule gives on each other value of the knob: everything a knob
    may set, whatever its value (``--quantization`` belongs to weights_dtype=bf16 too, so
    ``-q fp8`` in extra_args overrides it unset, and contradicts it given)."""
    spec = SPECS.get(rule.knob)
    kind = spec.kind if spec is not None else ""
    values: tuple[Any, ...] = (spec.choices if spec is not None and kind == "choice"
                               else (True, False) if kind == "bool"
                               else (1,) if kind == "int" else (0.5,) if kind == "float" else ())
    out = [setting]
    for value in (getattr(knobs, rule.knob), *values):
        result = rule.map(replace(knobs, **{rule.knob: value}))
        out.append(result.instead if isinstance(result, Unsupported) else result)
    return out


def _governed(rule: KnobRule, knobs: Knobs, setting: Setting, names: FlagNames) -> set[str]:
    """Every flag a knob's rule may set, whatever the knob's value."""
    return set().union(*(names.of(s) for s in _possible_settings(rule, knobs, setting)))


def _governed_env(rule: KnobRule, knobs: Knobs, setting: Setting) -> set[str]:
    """Every environment variable a knob's rule may set, whatever the knob's value."""
    return {key for s in _possible_settings(rule, knobs, setting) for key, _ in s.env}


# How an engine reads a boolean variable a knob writes as 1 or 0. Every such variable today is
# TGI's (PREFIX_CACHING, PREFILL_CHUNKING), read in server/text_generation_server/models/
# globals.py as ``os.environ[...].lower() in {"1", "true"}``: "true", "TRUE" and "1" are one
# setting. Any other value reads as false; "0" and "false" are the spellings taken for it.
_ENV_BOOLEANS = {"1": True, "true": True, "0": False, "false": False}


def _same_env_value(a: str, b: str) -> bool:
    """Whether the engine reads ``a`` and ``b`` as the same setting: ``0.9`` and ``0.90`` are
    one number, ``1`` and ``true`` (any case) one boolean, ``0`` and ``false`` the other."""
    if a == b:
        return True
    truth_a, truth_b = _ENV_BOOLEANS.get(a.lower()), _ENV_BOOLEANS.get(b.lower())
    if truth_a is not None and truth_b is not None:
        return truth_a == truth_b
    try:
        return float(a) == float(b)
    except ValueError:
        return False


# How an engine's parser reads a switch given a value, or a valued flag given a boolean word.
_ARG_BOOLEANS = {"1": True, "true": True, "yes": True, "on": True,
                 "0": False, "false": False, "no": False, "off": False}


def _same_arg_value(a: str | bool, b: str | bool) -> bool:
    """Whether an engine reads two values of one flag as the same setting: ``64`` and
    ``64.0`` are one number, a switch given and ``true`` one boolean; other text is compared
    as written (``bfloat16`` is not ``float32``)."""
    if isinstance(a, bool) or isinstance(b, bool):
        truth_a = a if isinstance(a, bool) else _ARG_BOOLEANS.get(a.lower())
        truth_b = b if isinstance(b, bool) else _ARG_BOOLEANS.get(b.lower())
        return truth_a is not None and truth_a == truth_b
    if a == b:
        return True
    try:
        return float(a) == float(b)
    except ValueError:
        return False


def _extra_arg_conflicts(name: str, value: Any, setting: Setting, others: list[Setting],
                         flags: list[str], extra: Mapping[str, Arg], names: FlagNames
                         ) -> list[str]:
    """How ``extra_args`` ask for another setting than a given knob: a flag the knob sets, with
    another value, or one its value leaves out set as another value of the knob would set it
    (``-q fp8`` against weights_dtype=bf16: what weights_dtype=fp8 passes). A flag the knob's
    value leaves out, set to what no value of the knob gives (llama.cpp's ``--cache-ram 8192``
    with prefix caching on), tunes beyond the knob: recorded as an override, not refused.
    ``others``: what the knob's rule gives on its other values (``_possible_settings``)."""
    mine = names.set_by(setting)
    out: list[str] = []
    for flag in flags:
        theirs = extra[flag]
        if flag not in mine:
            given_by_another = [arg for other in others
                                if (arg := names.set_by(other).get(flag)) is not None]
            if any(_same_arg_value(arg.value, theirs.value) for arg in given_by_another):
                out.append(f"{name}={value!r} does not set {theirs.flag}, but extra_args set "
                           f"{theirs.written}, as another {name} would")
        elif not _same_arg_value(mine[flag].value, theirs.value):
            out.append(f"{name}={value!r} sets {mine[flag].written}, but extra_args set "
                       f"{theirs.written}")
    return out


def map_knobs(
    engine: str, rules: tuple[KnobRule, ...], knobs: Knobs, *, allow_approximate: bool,
    names: FlagNames = FlagNames(), env: Mapping[str, str] | None = None,
) -> tuple[tuple[MappedKnob, ...], Setting]:
    """Apply a mapping table to knobs: every knob recorded, every refusal raised at once.

    ``extra_args`` win over mapped flags: a knob whose flags ``extra_args`` also set (in any
    spelling ``names`` knows) passes none of them and is recorded as not applied, so the
    engine never sees the same flag twice and the record never claims a value it did not get.
    A knob the user gave is refused when ``extra_args`` set one of its flags to another value
    (``64`` and ``64.0`` are one value, ``--no-x`` is x off), or set a flag its value leaves
    out as another value of the knob would: the two ask for different things and only one can
    reach the engine (``_extra_arg_conflicts``).

    ``env`` (the engine environment the user gave, ``--engine-env``) wins over mapped
    environment variables the same way: a knob left unset whose variable it sets is recorded
    as overridden; a knob given with another value than the variable's is refused, since the
    two ask for different things and only one can reach the engine.
    """
    by_knob = {rule.knob: rule for rule in rules}
    missing = [name for name in Knobs.names() if name not in by_knob]
    if missing:  # a programming error in an adapter, caught by the table tests
        raise KnobError(f"{engine}: mapping table has no rule for {', '.join(missing)}")
    extra_flags = names.written(knobs.extra_args)
    extra_values = names.values(knobs.extra_args)
    arg_conflicts: list[str] = []
    user_env = {str(k): str(v) for k, v in (env or {}).items()}
    env_conflicts: list[str] = []
    mapped: list[MappedKnob] = []
    refusals: list[str] = []
    argv: list[str] = []
    config: list[tuple[str, Any]] = []
    env_out: list[tuple[str, str]] = []
    # Unset knobs read as the engine's own defaults where known (rules read other knobs).
    knobs = knobs.with_defaults(
        {r.knob: r.default for r in rules if r.default is not UNKNOWN and not r.pinned})
    for name in Knobs.names():
        value = getattr(knobs, name)
        rule = by_knob[name]
        given = knobs.is_given(name)
        derived = None if given or rule.follows is None else rule.follows.derive(knobs)
        status: KnobStatus
        if derived is not None:
            setting = derived.setting
            value = None if derived.value is UNKNOWN else derived.value
            status = "applied" if setting.fragments() else "default"
            note = f"unset: {derived.why}"
        elif not given and not rule.pinned:
            known = rule.default is not UNKNOWN
            setting, status = Setting(), "default"
            value = value if known else None
            note = "unset: the engine's own default" + ("" if known else " (not known to batchlab)")
        else:
            result = rule.map(knobs)
            if isinstance(result, Unsupported):
                if not allow_approximate:
                    refusals.append(f"{name}={value!r}: {result.reason}")
                    continue
                setting = result.instead
                status = "approximated" if result.approximated_as else "not_applied"
                note = (
                    f"approximated as {result.approximated_as}: {result.reason}"
                    if result.approximated_as
                    else f"not applied: {result.reason}"
                )
            else:
                setting, status, note = result, "applied", result.note
                if not given:
                    note = f"unset: batchlab passes its default ({rule.pinned})"
        overridden_by: tuple[str, ...] = ()
        if name != "extra_args":
            overridden = sorted(_governed(rule, knobs, setting, names) & extra_flags.keys())
            if overridden and given and value is not None:  # None asks for nothing
                arg_conflicts.extend(_extra_arg_conflicts(
                    name, value, setting, _possible_settings(rule, knobs, setting)[1:],
                    overridden, extra_values, names))
            if overridden:
                flags = ", ".join(extra_flags[f] for f in overridden)
                setting = replace(setting, argv=(), config=())
                status, note = "not_applied", f"overridden by extra_args ({flags})"
                overridden_by = ("extra_args",)
                value = value if given else None  # unset: extra_args decide, as written
            variables = sorted(_governed_env(rule, knobs, setting) & user_env.keys())
            if variables and given:
                mine = dict(setting.env)
                env_conflicts.extend(
                    f"{name}={value!r} sets {var}={mine[var]}, but --engine-env sets "
                    f"{var}={user_env[var]}"
                    for var in variables
                    if var in mine and not _same_env_value(mine[var], user_env[var]))
            elif variables:  # unset: the user's variable decides, as given
                by_env = ", ".join(f"{var}={user_env[var]}" for var in variables)
                setting, status, value = Setting(), "not_applied", None
                note = (f"{note}; " if overridden_by else "") + (
                    f"overridden by --engine-env {by_env}")
                overridden_by = (*overridden_by, "--engine-env")
        argv.extend(setting.argv)
        config.extend(setting.config)
        env_out.extend(setting.env)
        mapped.append(MappedKnob(name, value, setting.fragments(), status, note, overridden_by))
    if refusals:
        raise KnobError(
            f"{engine} cannot honour: " + "; ".join(refusals)
            + ". Change the knob, or pass --allow-approximate to record it as approximated "
            "or not applied instead."
        )
    conflicts = [
        f"{engine}: a knob and {source} ask for different settings: " + "; ".join(found)
        + f". Drop one of them (a knob left unset lets {source} decide, and is recorded as "
        "overridden)."
        for source, found in (("--engine-env", env_conflicts), ("extra_args", arg_conflicts))
        if found
    ]
    if conflicts:
        raise KnobError(" ".join(conflicts))
    return tuple(mapped), Setting(tuple(argv), tuple(config), tuple(env_out))


ATTACHED = "attached to a running server: its own configuration applies"


def not_launched_mapping(knobs: Knobs, why: str) -> tuple[MappedKnob, ...]:
    """The mapping of a server batchlab did not start: no knob reaches it."""
    return tuple(
        MappedKnob(name, getattr(knobs, name), (), "not_applied", why) for name in Knobs.names()
    )


def config_tree(items: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    """Dotted keys -> nested dict (``kv_cache_config.dtype`` -> ``{kv_cache_config: {dtype}}``)."""
    tree: dict[str, Any] = {}
    for key, value in items:
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


# ---------------------------------------------------------------- the launch plan


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """Everything needed to start an engine, decided before anything starts.

    ``argv`` may contain ``{config_dir}``; ``resolved_argv`` substitutes the run folder the
    generated ``config_files`` are written to. A plan with ``launch=False`` describes a server
    batchlab attaches to and does not own (``argv`` is then empty).
    """

    engine: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    config_files: dict[str, str] = field(default_factory=dict)  # file name -> content
    mapping: tuple[MappedKnob, ...] = ()
    base_url: str = "http://127.0.0.1:8000"
    protocol: str = "openai"
    model: str = ""  # the model name requests carry
    launch: bool = True
    health_path: str = "/health"
    version_paths: tuple[str, ...] = ("/version",)  # probed in order; the first JSON answer wins
    telemetry: TelemetrySpec = TelemetrySpec()
    stop_argv: tuple[str, ...] = ()  # run after the group is signalled (container cleanup)
    notes: tuple[str, ...] = ()
    launcher: str = ""  # which program starts the engine, and why that one (when it is chosen)
    log_checks: tuple[LogCheck, ...] = ()  # knobs the server's log may show it ignored

    def resolved_argv(self, config_dir: str) -> tuple[str, ...]:
        return tuple(a.replace(CONFIG_DIR, config_dir) for a in self.argv)

    def describe(self, config_dir: str | None = None) -> str:
        """The dry-run text: argv, environment, generated files and the knob mapping.

        argv is a JSON list, one item a line, so that every item and its quoting are
        unambiguous; ``config_dir`` (the folder the generated files will be written to, when
        known) replaces ``{config_dir}`` in it and in the files' names.

        Values are shown as they are, but for the URL's credentials (``shown_url``): whoever
        prints it redacts secrets first (``harness.live`` prints a plan whose argv and
        environment went through ``harness.redact``)."""
        lines = [f"engine: {self.engine}",
                 f"url: {shown_url(self.base_url)}  (protocol {self.protocol})"]
        argv = self.argv if config_dir is None else self.resolved_argv(config_dir)
        if self.launch:
            if self.launcher:
                lines.append(f"launcher: {self.launcher}")
            lines.append("argv (JSON, one item a line):")
            lines.extend("  " + line for line in
                         json.dumps(list(argv), ensure_ascii=False, indent=2).splitlines())
        else:
            lines.append("argv: none (attaching to a running server)")
        if self.env:
            lines.append("environment:")
            lines.extend(f"  {k}={v}" for k, v in sorted(self.env.items()))
        folder = CONFIG_DIR if config_dir is None else config_dir
        for name, content in self.config_files.items():
            lines.append(f"config file {folder}/{name}:")
            lines.extend("  " + line for line in content.rstrip("\n").splitlines())
        lines.append("knob mapping:")
        width = max((len(m.knob) for m in self.mapping), default=0)
        for m in self.mapping:
            flags = "; ".join(m.flags) if m.flags else "(no flag)"
            note = f"  [{m.note}]" if m.note else ""
            lines.append(f"  {m.knob:<{width}} = {m.value!r:<10} {m.status:<12} {flags}{note}")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class ServerWire:
    """How batchlab talks to one engine's server: what its launched and attached plans share."""

    protocol: str = "openai"
    health_path: str = "/health"
    version_paths: tuple[str, ...] = ("/version",)  # probed in order; the first JSON answer wins
    telemetry: TelemetrySpec = TelemetrySpec()
    # what the server makes of a request's priority (the replay reads it by engine name:
    # adapters.catalog.priority_wire)
    priority: PriorityWire = PriorityWire()

    def launched(self, engine: str, *, argv: tuple[str, ...], env: dict[str, str],
                 mapping: tuple[MappedKnob, ...], host: str, port: int, model: str,
                 config_files: dict[str, str] | None = None, stop_argv: tuple[str, ...] = (),
                 notes: tuple[str, ...] = (), launcher: str = "",
                 log_checks: tuple[LogCheck, ...] = ()) -> LaunchPlan:
        """The plan of a server batchlab starts at ``host:port``."""
        return LaunchPlan(
            engine=engine, argv=argv, env=env, config_files=config_files or {},
            mapping=mapping, base_url=f"http://{host}:{port}", protocol=self.protocol,
            model=model, health_path=self.health_path, version_paths=self.version_paths,
            telemetry=self.telemetry, stop_argv=stop_argv, notes=notes, launcher=launcher,
            log_checks=log_checks,
        )

    def attached(self, engine: str, base_url: str, knobs: Knobs, *, model: str) -> LaunchPlan:
        """The plan of a server at ``base_url`` that batchlab attaches to and does not own."""
        return LaunchPlan(
            engine=engine, argv=(), launch=False, mapping=not_launched_mapping(knobs, ATTACHED),
            base_url=base_url.rstrip("/"), protocol=self.protocol, model=model,
            health_path=self.health_path, version_paths=self.version_paths,
            telemetry=self.telemetry,
        )


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One streamed delivery from an engine: the tokens it carried and when it arrived."""

    t_ns: int
    num_tokens: int
    text: str = ""
    finish_reason: str | None = None




class Engine(Protocol):
    """An engine adapter: one mapping table, and knobs in, a ``LaunchPlan`` out.

    Everything after planning is the same for every served engine and lives elsewhere: the
    process lifecycle in ``adapters.process`` (launch, readiness, teardown), generation in the
    harness replay client (HTTP), telemetry in ``harness.live.telemetry`` (driven by
    ``LaunchPlan.telemetry``), orchestration in ``harness.live``.
    """

    @property
    def name(self) -> str: ...

    @property
    def rules(self) -> tuple[KnobRule, ...]: ...

    def plan(self, knobs: Knobs, *, allow_approximate: bool = False) -> LaunchPlan: ...

    def attach(self, base_url: str, knobs: Knobs) -> LaunchPlan: ...
