"""Any OpenAI-compatible server given by URL, with an optional metric-name map.

batchlab does not start these servers, so no knob reaches them: every knob is recorded as not
applied (asking for a non-default knob fails unless approximation is allowed, see
``harness.live``). Telemetry comes from the server's ``/metrics`` through a name map: one of
the presets below, or ``canonical=metric_name`` pairs given by the user. A server without
``/metrics`` (``transformers serve``) has all signals reported missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from adapters.base import (
    CANONICAL_SIGNALS,
    KnobError,
    KnobRule,
    Knobs,
    LaunchPlan,
    MetricSource,
    PriorityWire,
    ServerWire,
    TelemetrySpec,
    Unsupported,
)
from adapters.llamacpp import TELEMETRY as LLAMACPP_TELEMETRY
from adapters.vllm import TELEMETRY as VLLM_TELEMETRY

NAME = "openai"

LLAMACPP = LLAMACPP_TELEMETRY  # llama.cpp's llama-server (``--metrics``)
NO_METRICS = TelemetrySpec(format="none")

METRIC_PRESETS: dict[str, TelemetrySpec] = {
    "llamacpp": LLAMACPP,
    "vllm": VLLM_TELEMETRY,
    "transformers": NO_METRICS,  # `transformers serve` has no /metrics (404)
    "none": NO_METRICS,
}

_KINDS = {"num_preemptions": "counter", "batch_tokens": "histogram",
          "prefix_cache_queries": "counter", "prefix_cache_hits": "counter"}

# Any server: priorities go in vLLM's convention, as the trace has them; what it does with them
# under a policy other than priority is not known.
PRIORITY = PriorityWire(source="not known: the server is named by URL only")


def _not_launched(k: Knobs) -> Unsupported:
    return Unsupported("batchlab does not launch generic OpenAI servers")


RULES: tuple[KnobRule, ...] = tuple(
    KnobRule(name, "(none: the server is started outside batchlab)", _not_launched)
    for name in Knobs.names()
)

FIXED = (
    "attach only: --url URL of a running OpenAI-compatible server",
    "--metric-map llamacpp|vllm|transformers|none, or canonical=metric_name pairs",
)


def metric_spec(metric_map: str | Mapping[str, str] | None) -> TelemetrySpec:
    """A preset name, or ``{canonical: metric name}``; None: no telemetry."""
    if metric_map is None:
        return NO_METRICS
    if isinstance(metric_map, str):
        if metric_map not in METRIC_PRESETS:
            raise KnobError(
                f"metric map {metric_map!r} is not a preset ({', '.join(METRIC_PRESETS)}); "
                "give canonical=metric_name pairs instead"
            )
        return METRIC_PRESETS[metric_map]
    signals = []
    for canonical, metric in metric_map.items():
        if canonical not in CANONICAL_SIGNALS:
            raise KnobError(
                f"metric map: {canonical!r} is not a canonical signal "
                f"({', '.join(CANONICAL_SIGNALS)})"
            )
        kind = _KINDS.get(canonical, "gauge")
        signals.append((canonical, MetricSource((metric,), kind=kind)))  # type: ignore[arg-type]
    return TelemetrySpec(path="/metrics", signals=tuple(signals))


def parse_metric_map(text: str) -> str | dict[str, str]:
    """CLI form: a preset name, or ``num_running=foo,num_waiting=bar``."""
    if "=" not in text:
        return text.strip()
    pairs: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise KnobError(f"metric map: {item!r} is not canonical=metric_name")
        pairs[key.strip()] = value.strip()
    return pairs


@dataclass(frozen=True, slots=True)
class OpenAIAdapter:
    model: str  # the model name requests carry
    metric_map: str | Mapping[str, str] | None = None
    protocol: str = "openai"
    name: str = NAME
    rules: tuple[KnobRule, ...] = RULES
    telemetry: TelemetrySpec | None = None  # overrides metric_map (the served reference engine)

    def plan(self, knobs: Knobs, *, allow_approximate: bool = False) -> LaunchPlan:
        raise KnobError(
            f"{self.name}: batchlab does not launch this engine; start it yourself and give "
            "--url URL"
        )

    def attach(self, base_url: str, knobs: Knobs) -> LaunchPlan:
        wire = ServerWire(
            protocol=self.protocol,  # /health: vLLM, llama-server, transformers serve, TGI, TRT-LLM
            # vLLM and TRT-LLM answer /version, TGI /info, llama.cpp /props; /v1/models at least
            # names what is served
            version_paths=("/version", "/info", "/props", "/v1/models"),
            telemetry=self.telemetry or metric_spec(self.metric_map),
            priority=PRIORITY,
        )
        return wire.attached(self.name, base_url, knobs, model=self.model)
