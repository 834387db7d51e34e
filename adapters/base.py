"""The one Engine interface, and the uniform knobs every engine is described by.

An adapter maps ``Knobs`` to its engine's own flags through one table in code
(``KnobMapping``); a knob it cannot honour fails at plan time unless approximation is allowed,
and is then recorded, never silently dropped.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Protocol

Policy = Literal["fcfs", "priority", "static"]
Preemption = Literal["recompute", "swap", "none"]
Dtype = Literal["bf16", "fp8"]


class KnobError(ValueError):
    """A knob is unknown, out of range, or cannot be honoured by the chosen engine."""


@dataclass(frozen=True, slots=True)
class Knobs:
    """Uniform batching knobs, the same for every engine."""

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

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, where: str = "knobs") -> Knobs:
        """Build from a dict (YAML, CLI), naming the field on any error."""
        known = set(cls.names())
        for key in values:
            if key not in known:
                raise KnobError(f"{where}: unknown knob {key!r}; known knobs: {', '.join(sorted(known))}")
        kw = dict(values)
        if "extra_args" in kw:
            kw["extra_args"] = tuple(str(a) for a in kw["extra_args"])
        knobs = cls(**kw)
        knobs.validate(where=where)
        return knobs

    def validate(self, *, where: str = "knobs") -> None:
        choices: dict[str, tuple[Any, ...]] = {
            "policy": ("fcfs", "priority", "static"),
            "preemption": ("recompute", "swap", "none"),
            "weights_dtype": ("bf16", "fp8"),
            "kv_cache_dtype": ("bf16", "fp8"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise KnobError(
                    f"{where}.{name}: {getattr(self, name)!r} is not one of {', '.join(allowed)}"
                )
        for name in ("max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise KnobError(f"{where}.{name}: must be a positive integer, got {value!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise KnobError(
                f"{where}.gpu_memory_utilization: must be in (0, 1], got {self.gpu_memory_utilization!r}"
            )
        for name in ("chunked_prefill", "prefix_caching"):
            if not isinstance(getattr(self, name), bool):
                raise KnobError(f"{where}.{name}: must be true or false, got {getattr(self, name)!r}")

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, slots=True)
class MappedKnob:
    """How one uniform knob became engine flags: applied, approximated or not applied."""

    knob: str
    value: Any
    flags: tuple[str, ...] = ()  # argv fragment, config key, or env assignment
    status: Literal["applied", "approximated", "not_applied"] = "applied"
    note: str = ""


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """Everything needed to start an engine, decided before anything starts."""

    engine: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    config_files: dict[str, str] = field(default_factory=dict)  # file name -> content
    mapping: tuple[MappedKnob, ...] = ()
    base_url: str = "http://127.0.0.1:8000"
    protocol: str = "openai"


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One streamed delivery from an engine: the tokens it carried and when it arrived."""

    t_ns: int
    num_tokens: int
    text: str = ""
    finish_reason: str | None = None


class Engine(Protocol):
    """The small interface the harness drives. See adapters/<engine>.py for implementations."""

    name: str

    def plan(self, knobs: Knobs, *, allow_approximate: bool = False) -> LaunchPlan: ...

    async def launch(self, plan: LaunchPlan, run_dir: str) -> None: ...

    async def wait_ready(self, timeout_s: float) -> None: ...

    def generate(self, request: Any) -> AsyncIterator[TokenEvent]: ...

    async def telemetry(self) -> dict[str, float | None]: ...

    async def shutdown(self) -> None: ...
