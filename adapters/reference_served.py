"""The reference engine served over HTTP (``batchlab serve reference``), launched like any engine.

It runs the reference scheduler and cost model on the wall clock and speaks vLLM's OpenAI
dialect with vLLM's metric names, so the whole live path (launch, replay, telemetry, teardown)
runs without a GPU. Its flags are the uniform knobs almost one to one; the knob mapping is the
same as the simulated reference's (``ReferenceConfig.from_knobs``): preemption "none" is
admission "reserve".
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from adapters.base import (
    KnobRule,
    Knobs,
    LaunchPlan,
    Setting,
    Unsupported,
    map_knobs,
    with_engine_defaults,
)
from adapters.knobs import ReferenceKnobs
from adapters.process import free_port
from adapters.vllm import WIRE

NAME = "reference"
TELEMETRY = WIRE.telemetry  # the served reference exposes vLLM's metric names


def _flag(name: str, attr: str) -> KnobRule:
    return KnobRule(attr, name, lambda k: Setting((name, str(getattr(k, attr)))))


def _toggle(name: str, attr: str) -> KnobRule:
    return KnobRule(attr, f"--[no-]{name[2:]}",
                    lambda k: Setting((name if getattr(k, attr) else f"--no-{name[2:]}",)))


def _preemption(k: Knobs) -> Setting | Unsupported:
    if k.policy == "static":
        if k.preemption == "none":
            return Setting(("--admission", "reserve"),
                           note="the static policy always reserves at admission")
        # as TensorRT-LLM's STATIC_BATCH: a batch holds its reservation until it ends
        return Unsupported(f"the static policy reserves at admission and never preempts, so "
                           f"preemption={k.preemption} cannot apply")
    if k.preemption == "none":
        return Setting(("--admission", "reserve"), note="reserve prompt + max output")
    return Setting(("--preemption", k.preemption))


def _max_model_len(k: Knobs) -> Setting:
    if k.max_model_len is None:
        return Setting(note="unset: the model's max_position_embeddings")
    return Setting(("--max-model-len", str(k.max_model_len)))


RULES: tuple[KnobRule, ...] = (
    _flag("--max-num-seqs", "max_num_seqs"),
    _flag("--max-num-batched-tokens", "max_num_batched_tokens"),
    _flag("--policy", "policy"),
    KnobRule("preemption", "--admission, --preemption", _preemption, ("policy",)),
    _toggle("--chunked-prefill", "chunked_prefill"),
    _flag("--weights-dtype", "weights_dtype"),
    _flag("--kv-cache-dtype", "kv_cache_dtype"),
    _flag("--gpu-memory-utilization", "gpu_memory_utilization"),
    _toggle("--prefix-caching", "prefix_caching"),
    _flag("--tp", "tensor_parallel_size"),
    KnobRule("max_model_len", "--max-model-len", _max_model_len),
    KnobRule("extra_args", "appended to argv as given (e.g. --profile P.json)",
             lambda k: Setting(k.extra_args)),
)

# The served reference's own defaults are ReferenceConfig's, which are Knobs' fallbacks.
RULES = with_engine_defaults(RULES, Knobs().as_dict())

FIXED = (
    "PYTHON -m harness.cli serve reference --model MODEL [--gpu GPU] --host 127.0.0.1 "
    "--port PORT --served-model-name NAME",
    "telemetry: vLLM's metric names",
)


@dataclass(frozen=True, slots=True)
class ReferenceServedAdapter:
    model: str  # catalog model name or a local config.json path
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int | None = None
    gpu: str | None = None  # catalog GPU; None: the reference's default
    python: str | None = None  # default: the running interpreter
    env: dict[str, str] = field(default_factory=dict)
    profile: str | None = None  # an engine profile (name or file) its cost model predicts with
    reference: ReferenceKnobs = field(default_factory=ReferenceKnobs)  # admission, KV blocks
    name: str = NAME
    rules: tuple[KnobRule, ...] = RULES

    def plan(self, knobs: Knobs, *, allow_approximate: bool = False) -> LaunchPlan:
        knobs.validate()
        mapping, setting = map_knobs(NAME, self.rules, knobs, allow_approximate=allow_approximate)
        port = self.port or free_port(self.host)
        served = self.served_model_name or self.model
        argv = (
            self.python or sys.executable, "-m", "harness.cli", "serve", "reference",
            "--model", self.model, *(("--gpu", self.gpu) if self.gpu else ()),
            "--host", self.host, "--port", str(port), "--served-model-name", served,
            *self._reference_argv(), *setting.argv,
        )
        return WIRE.launched(NAME, argv=argv, env={**dict(setting.env), **self.env},
                             mapping=mapping, host=self.host, port=port, model=served)

    def attach(self, base_url: str, knobs: Knobs) -> LaunchPlan:
        return WIRE.attached(NAME, base_url, knobs, model=self.served_model_name or self.model)

    def _reference_argv(self) -> tuple[str, ...]:
        """The profile and the reference's own settings, as ``serve reference`` flags."""
        self.reference.validate()
        argv: list[str] = ["--profile", self.profile] if self.profile else []
        for name in ReferenceKnobs.names():
            value = getattr(self.reference, name)
            if value is not None:
                argv += [f"--{name.replace('_', '-')}", str(value)]
        return tuple(argv)
