"""The one knob vocabulary: every knob's name, type, choices, flag and help, defined once.

The command line (``harness.cli``) generates its flags from ``UNIFORM`` and ``REFERENCE``;
scenario files validate against the same records; adapters map ``Knobs`` to engine flags.

A knob that is not given is *unset*: it means "the engine's own default". An unset knob is
never refused, and an adapter records the value that took effect (``MappedKnob`` with status
``default``). ``Knobs(...)`` built directly in code counts every field as given, so code that
constructs knobs states a full configuration; ``Knobs.from_mapping`` (command line, YAML)
records which knobs the user gave.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

Policy = Literal["fcfs", "priority", "static"]
Preemption = Literal["recompute", "swap", "none"]
Dtype = Literal["bf16", "fp8"]
Admission = Literal["optimistic", "reserve"]

POLICIES: tuple[str, ...] = ("fcfs", "priority", "static")
PREEMPTIONS: tuple[str, ...] = ("recompute", "swap", "none")
DTYPES: tuple[str, ...] = ("bf16", "fp8")
ADMISSIONS: tuple[str, ...] = ("optimistic", "reserve")


class KnobError(ValueError):
    """A knob is unknown, out of range, or cannot be honoured by the chosen engine."""


@dataclass(frozen=True, slots=True)
class KnobSpec:
    """One knob as people meet it: its flag, type, choices and help."""

    name: str
    kind: Literal["int", "float", "bool", "choice", "args", "path"]
    help: str
    choices: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()  # further flags for the same knob (``--tp``)
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return "--extra-arg" if self.name == "extra_args" else "--" + self.name.replace("_", "-")


UNIFORM: tuple[KnobSpec, ...] = (
    KnobSpec("max_num_seqs", "int", "max running requests", metavar="N"),
    KnobSpec("max_num_batched_tokens", "int", "token budget of one engine step", metavar="T"),
    KnobSpec("policy", "choice", "scheduling policy", POLICIES),
    KnobSpec("preemption", "choice",
             "what happens when KV runs out: recompute, swap, or none (reserve at admission)",
             PREEMPTIONS),
    KnobSpec("chunked_prefill", "bool", "split long prompts across steps"),
    KnobSpec("weights_dtype", "choice", "weights data type", DTYPES),
    KnobSpec("kv_cache_dtype", "choice", "KV-cache data type", DTYPES),
    KnobSpec("gpu_memory_utilization", "float", "memory fraction for the engine", metavar="F"),
    KnobSpec("prefix_caching", "bool", "reuse the KV of shared prompt prefixes"),
    KnobSpec("tensor_parallel_size", "int", "GPUs per model (tensor parallelism)",
             aliases=("--tp",), metavar="TP"),
    KnobSpec("max_model_len", "int", "context length: longest prompt + output", metavar="N"),
    KnobSpec("extra_args", "args",
             "one argv item appended to a launched engine's command (repeatable; write "
             "--extra-arg=--enforce-eager for flags)", metavar="ARG"),
)

REFERENCE: tuple[KnobSpec, ...] = (
    KnobSpec("admission", "choice",
             "optimistic: allocate KV as tokens grow and preempt when full (vLLM); reserve: "
             "reserve prompt + max output at admission, never preempt (TGI, TensorRT-LLM "
             "GUARANTEED_NO_EVICT). Unset follows --preemption; static always reserves",
             ADMISSIONS),
    KnobSpec("block_size", "int", "tokens per KV block (16)", metavar="N"),
    KnobSpec("num_gpu_blocks", "int", "override the number of KV blocks", metavar="N"),
    KnobSpec("swap_space_gib", "float", "host memory for swapped KV per GPU, GiB (4)",
             metavar="GIB"),
)

SPECS: dict[str, KnobSpec] = {s.name: s for s in (*UNIFORM, *REFERENCE)}


@dataclass(frozen=True, slots=True)
class Knobs:
    """Uniform batching knobs, the same for every engine.

    Field defaults are batchlab's fallbacks, used only where an engine's own default is not
    known; ``given`` says which knobs the user set (None: all of them).
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    policy: Policy = "fcfs"
    preemption: Preemption = "recompute"
    chunked_prefill: bool = True
    weights_dtype: Dtype = "bf16"
    kv_cache_dtype: Dtype = "bf16"
    gpu_memory_utilization: float = 0.9
    prefix_caching: bool = False
    tensor_parallel_size: int = 1
    max_model_len: int | None = None
    extra_args: tuple[str, ...] = ()
    given: frozenset[str] | None = None

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls) if f.name != "given")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, where: str = "knobs") -> Knobs:
        """Build from what the user gave (YAML, CLI), naming the field on any error."""
        known = set(cls.names())
        for key in values:
            if key not in known:
                raise KnobError(
                    f"{where}: unknown knob {key!r}; known knobs: {', '.join(sorted(known))}"
                )
        kw = {k: v for k, v in values.items() if v is not None}
        if "extra_args" in kw:
            if isinstance(kw["extra_args"], str) or not isinstance(kw["extra_args"], list | tuple):
                raise KnobError(f"{where}.extra_args: expected a list of strings")
            for arg in kw["extra_args"]:
                if not isinstance(arg, str | int | float) or isinstance(arg, bool):
                    raise KnobError(
                        f"{where}.extra_args: every item must be a string, got {arg!r}")
            kw["extra_args"] = tuple(str(a) for a in kw["extra_args"])
            if not kw["extra_args"]:
                del kw["extra_args"]
        knobs = cls(**kw, given=frozenset(kw))
        knobs.validate(where=where)
        return knobs

    def is_given(self, name: str) -> bool:
        return self.given is None or name in self.given

    def given_names(self) -> tuple[str, ...]:
        return tuple(n for n in self.names() if self.is_given(n))

    def with_defaults(self, defaults: Mapping[str, Any]) -> Knobs:
        """Unset knobs take ``defaults`` (an engine's own, where known); ``given`` is kept."""
        fill = {n: v for n, v in defaults.items() if not self.is_given(n)}
        return replace(self, **fill) if fill else self

    def validate(self, *, where: str = "knobs") -> None:
        for spec in UNIFORM:
            value = getattr(self, spec.name)
            if spec.kind == "choice" and value not in spec.choices:
                close = difflib.get_close_matches(str(value), list(spec.choices), n=1, cutoff=0.6)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise KnobError(f"{where}.{spec.name}: {value!r} is not one of "
                                f"{', '.join(spec.choices)}{hint}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size"):
            check_positive_int(getattr(self, name), f"{where}.{name}")
        if self.max_model_len is not None:
            check_positive_int(self.max_model_len, f"{where}.max_model_len")
        util = self.gpu_memory_utilization
        if (isinstance(util, bool) or not isinstance(util, int | float)
                or not math.isfinite(util) or not 0 < util <= 1):
            raise KnobError(f"{where}.gpu_memory_utilization: must be in (0, 1], got {util!r}")
        for name in ("chunked_prefill", "prefix_caching"):
            if not isinstance(getattr(self, name), bool):
                raise KnobError(
                    f"{where}.{name}: must be true or false, got {getattr(self, name)!r}")

    def as_dict(self) -> dict[str, Any]:
        """Every knob, batchlab's fallbacks for those not given included."""
        return {name: getattr(self, name) for name in self.names()}

    def asked(self) -> dict[str, Any]:
        """Only the knobs the user gave: what a definition asked for. A knob left unset runs
        at its engine's own default, which batchlab's fallback need not be."""
        return {name: getattr(self, name) for name in self.given_names()}


# Far above any model's context or any engine's batch: a bound that catches sentinels such as
# uint32 -1 (4294967295) before anything is allocated from them.
MAX_KNOB_INT = 1 << 24


def check_positive_int(value: Any, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_KNOB_INT:
        raise KnobError(f"{where}: must be a positive integer up to {MAX_KNOB_INT}, "
                        f"got {value!r}")


@dataclass(frozen=True, slots=True)
class ReferenceKnobs:
    """What only the reference engine has: admission, KV blocks. None: its own default."""

    admission: Admission | None = None
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    swap_space_gib: float | None = None

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, where: str = "reference") -> ReferenceKnobs:
        known = set(cls.names())
        for key in values:
            if key not in known:
                raise KnobError(f"{where}: unknown reference setting {key!r}; known: "
                                f"{', '.join(sorted(known))}")
        out = cls(**{k: v for k, v in values.items() if v is not None})
        out.validate(where=where)
        return out

    def validate(self, *, where: str = "reference") -> None:
        if self.admission is not None and self.admission not in ADMISSIONS:
            raise KnobError(f"{where}.admission: {self.admission!r} is not one of "
                            f"{', '.join(ADMISSIONS)}")
        for name in ("block_size", "num_gpu_blocks"):
            if getattr(self, name) is not None:
                check_positive_int(getattr(self, name), f"{where}.{name}")
        swap = self.swap_space_gib
        if swap is not None and (isinstance(swap, bool) or not isinstance(swap, int | float)
                                 or not math.isfinite(swap) or not 0 <= swap <= 1 << 20):
            raise KnobError(f"{where}.swap_space_gib: must be a finite number >= 0, "
                            f"got {swap!r}")

    def given(self) -> dict[str, Any]:
        return {n: getattr(self, n) for n in self.names() if getattr(self, n) is not None}
