"""TensorRT-LLM (PyTorch backend, ``trtllm-serve``): mapping table, generated YAML, metrics.

``trtllm-serve`` hard-codes ``GUARANTEED_NO_EVICT`` on its command line, and the precedence of
CLI over YAML changed between versions, so every knob goes to one place: the generated YAML
given with ``--extra_llm_api_options`` (fields of ``tensorrt_llm/llmapi/llm_args.py``). The YAML
always turns on ``enable_iter_perf_stats`` and ``return_perf_metrics`` so that telemetry exists;
it is then read from the Prometheus endpoint ``/prometheus/metrics`` (with both flags set the
background collector drains the JSON ``/metrics`` queue).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import yaml

from adapters.base import (
    CONFIG_DIR,
    Derived,
    FlagNames,
    Follows,
    KnobError,
    KnobRule,
    Knobs,
    LaunchPlan,
    MappedKnob,
    MetricSource,
    PriorityWire,
    ServerWire,
    Setting,
    TelemetrySpec,
    Unsupported,
    config_tree,
    map_knobs,
    with_engine_defaults,
)
from adapters.process import free_port

NAME = "trtllm"
COMMAND = "trtllm-serve"
CONFIG_FILE = "trtllm-serve.yaml"
_POLICY_KEY = "scheduler_config.capacity_scheduler_policy"
# BaseLlmArgs.max_num_tokens (engines.md 2.1 "Token budget per iteration", 2.4:
# tensorrt_llm/llmapi/llm_args.py, tensorrt_llm/builder.py BuildConfig)
DEFAULT_MAX_NUM_TOKENS = 8192

# Always in the YAML: without them there is no telemetry to read.
FIXED_CONFIG: tuple[tuple[str, object], ...] = (
    ("enable_iter_perf_stats", True),
    ("return_perf_metrics", True),
    ("perf_metrics_max_requests", 1000),
)


def _policy(k: Knobs) -> Setting:
    if k.policy == "static":
        return Setting(config=((_POLICY_KEY, "STATIC_BATCH"),),
                       note="no new context requests while any generation is in flight")
    if k.policy == "priority":
        return Setting(config=(("scheduler_config.waiting_queue_policy", "priority"),),
                       note="recent TensorRT-LLM only; orders the waiting queue, never preempts")
    return Setting(note="the waiting queue is FCFS by default")


def _preemption(k: Knobs) -> Setting | Unsupported:
    if k.policy == "static":
        if k.preemption == "none":
            return Setting(note="STATIC_BATCH reserves at admission (set by policy)")
        return Unsupported(
            f"STATIC_BATCH (policy=static) never evicts, so preemption={k.preemption} cannot "
            "apply"
        )
    if k.preemption == "none":
        return Setting(config=((_POLICY_KEY, "GUARANTEED_NO_EVICT"),),
                       note="reserves KV for prompt + max_tokens at admission")
    if k.preemption == "recompute":
        return Setting(config=((_POLICY_KEY, "MAX_UTILIZATION"),),
                       note="admits greedily and pauses requests (recomputed) when KV runs out")
    return Unsupported(
        "the PyTorch backend has no swap preemption (paused requests are recomputed)",
        instead=Setting(config=((_POLICY_KEY, "MAX_UTILIZATION"),)),
        approximated_as="recompute (MAX_UTILIZATION)",
    )


def _weights(k: Knobs) -> Setting | Unsupported:
    if k.weights_dtype == "fp8":
        return Unsupported(
            "the PyTorch backend has no online FP8 weight quantization; serve an FP8 "
            "(ModelOpt) checkpoint, whose own quantization config is then used"
        )
    return Setting(config=(("dtype", "bfloat16"),))


def _kv_dtype(k: Knobs) -> Setting | Unsupported:
    if k.kv_cache_dtype == "fp8":
        return Setting(config=(("kv_cache_config.dtype", "fp8"),))
    # kv_cache_config.dtype is auto or fp8 (engines.md 2.1 "FP8 KV cache", 2.4:
    # tensorrt_llm/llmapi/llm_args.py KvCacheConfig): auto follows the checkpoint.
    return Unsupported(
        "kv_cache_config.dtype has no bf16 value: auto takes the checkpoint's KV quantization, "
        "otherwise the model dtype, so an FP8 (ModelOpt) checkpoint runs FP8 KV whatever is "
        "asked",
        instead=Setting(config=(("kv_cache_config.dtype", "auto"),)),
        approximated_as="auto (the checkpoint's KV quantization, else the model dtype)",
    )


def _memory(k: Knobs) -> Unsupported:
    # engines.md 2.1 "Memory fraction for KV" and vLLM quirk 3 (tensorrt_llm/llmapi/llm_args.py
    # KvCacheConfig.free_gpu_memory_fraction): a fraction of the memory free after weights.
    u = k.gpu_memory_utilization
    return Unsupported(
        "kv_cache_config.free_gpu_memory_fraction is a fraction of the memory free after the "
        "weights and buffers are loaded, not of the total (vLLM's gpu_memory_utilization), so "
        "the same number gives a larger KV budget, by an amount that depends on the model",
        instead=Setting(config=(("kv_cache_config.free_gpu_memory_fraction", u),)),
        approximated_as=f"kv_cache_config.free_gpu_memory_fraction {u} (of free memory)",
    )


def _token_budget_without_chunking(k: Knobs) -> Derived | None:
    """An unset max_num_tokens with chunked prefill off (TensorRT-LLM's default) and a context
    longer than its default 8192: prompts longer than max_num_tokens would be rejected
    (engines.md TRT-LLM quirk 3: #9277, #6539, #4947), so batchlab passes max_model_len."""
    length = k.max_model_len
    if k.chunked_prefill or length is None:
        return None
    if isinstance(length, int) and length <= DEFAULT_MAX_NUM_TOKENS:
        return None
    return Derived(
        length,
        "with chunked prefill off TensorRT-LLM rejects prompts longer than max_num_tokens: "
        f"when max_model_len is above its default {DEFAULT_MAX_NUM_TOKENS}, batchlab passes "
        "max_model_len",
        Setting(config=(("max_num_tokens", length),)),
    )


def _max_model_len(k: Knobs) -> Setting:
    if k.max_model_len is None:
        return Setting(note="unset: the model's context length")
    return Setting(config=(("max_seq_len", k.max_model_len),))


RULES: tuple[KnobRule, ...] = (
    KnobRule("max_num_seqs", "max_batch_size",
             lambda k: Setting(config=(("max_batch_size", k.max_num_seqs),))),
    KnobRule("max_num_batched_tokens", "max_num_tokens",
             lambda k: Setting(config=(("max_num_tokens", k.max_num_batched_tokens),),
                               note="context plus generation tokens per iteration"),
             follows=Follows(("chunked_prefill", "max_model_len"),
                             _token_budget_without_chunking)),
    KnobRule("policy", "scheduler_config.waiting_queue_policy / capacity_scheduler_policy",
             _policy),
    KnobRule("preemption", "scheduler_config.capacity_scheduler_policy", _preemption,
             ("policy",)),
    KnobRule("chunked_prefill", "enable_chunked_prefill",
             lambda k: Setting(config=(("enable_chunked_prefill", k.chunked_prefill),),
                               note="" if k.chunked_prefill else
                               "a prompt longer than max_num_tokens is rejected")),
    KnobRule("weights_dtype", "dtype (FP8 needs an FP8 checkpoint)", _weights),
    KnobRule("kv_cache_dtype", "kv_cache_config.dtype", _kv_dtype),
    KnobRule("gpu_memory_utilization", "kv_cache_config.free_gpu_memory_fraction", _memory),
    KnobRule("prefix_caching", "kv_cache_config.enable_block_reuse",
             lambda k: Setting(config=(("kv_cache_config.enable_block_reuse",
                                        k.prefix_caching),))),
    KnobRule("tensor_parallel_size", "tensor_parallel_size",
             lambda k: Setting(config=(("tensor_parallel_size", k.tensor_parallel_size),))),
    KnobRule("max_model_len", "max_seq_len", _max_model_len),
    KnobRule("extra_args", "appended to argv as given", lambda k: Setting(k.extra_args)),
)

# TensorRT-LLM's own defaults (engines.md 2.1 and 2.4), each with where it was read:
# NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py @0004396720054fd8e205cbf616f21f0b57c6b412
# (BaseLlmArgs, SchedulerConfig, KvCacheConfig), read 2026-11-30.
DEFAULTS: dict[str, object] = {
    "max_num_seqs": 2048, "max_num_batched_tokens": DEFAULT_MAX_NUM_TOKENS, "policy": "fcfs",
    "preemption": "none", "chunked_prefill": False, "kv_cache_dtype": "auto",
    "prefix_caching": True, "tensor_parallel_size": 1, "max_model_len": None, "extra_args": (),
}


def _llm_args(field_name: str) -> str:
    return (f"NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py {field_name} @00043967, "
            "read 2026-11-30")


DEFAULT_SOURCES: dict[str, str] = {
    "max_num_seqs": _llm_args("BaseLlmArgs.max_batch_size"),
    "max_num_batched_tokens": _llm_args("BaseLlmArgs.max_num_tokens"),
    "policy": _llm_args("SchedulerConfig.waiting_queue_policy"),
    "preemption": _llm_args("SchedulerConfig.capacity_scheduler_policy GUARANTEED_NO_EVICT"),
    "chunked_prefill": _llm_args("BaseLlmArgs.enable_chunked_prefill"),
    "kv_cache_dtype": _llm_args("KvCacheConfig.dtype"),
    "prefix_caching": _llm_args("KvCacheConfig.enable_block_reuse"),
    "tensor_parallel_size": _llm_args("BaseLlmArgs.tensor_parallel_size"),
}
RULES = with_engine_defaults(RULES, DEFAULTS, sources=DEFAULT_SOURCES)

# trtllm-serve's flags for the fields the YAML sets (engines.md 2.4:
# tensorrt_llm/commands/serve.py), so that extra_args setting one replace the YAML key.
NAMES = FlagNames(
    # one click option with two names (tensorrt_llm/commands/serve.py @00209af1, read
    # 2026-11-30): the memory fraction, the tensor-parallel size and the YAML file (CONFIG_OPTION)
    aliases={"free-gpu-memory-fraction": "kv-cache-free-gpu-memory-fraction",
             "tensor-parallel-size": "tp-size",
             "config": "extra-llm-api-options"},
    config_keys={
        "max_batch_size": "--max_batch_size",
        "max_num_tokens": "--max_num_tokens",
        "max_seq_len": "--max_seq_len",
        "tensor_parallel_size": "--tp_size",
        "enable_chunked_prefill": "--enable_chunked_prefill",
        "kv_cache_config.free_gpu_memory_fraction": "--kv_cache_free_gpu_memory_fraction",
    },
)


# trtllm-serve reads --config and --extra_llm_api_options as one click option, and the last one
# given wins (NVIDIA/TensorRT-LLM tensorrt_llm/commands/serve.py @00209af1, read 2026-11-30):
# one in extra_args would replace the generated YAML, and every knob mapped into it.
CONFIG_OPTION = "extra-llm-api-options"


def check_config_not_replaced(knobs: Knobs, mapping: tuple[MappedKnob, ...]) -> None:
    """Refuse extra_args that name another YAML file: the generated one would not be read."""
    written = NAMES.written(knobs.extra_args)
    if CONFIG_OPTION not in written:
        return
    in_yaml = [m.knob for m in mapping if m.knob != "extra_args" and m.flags]
    lost = (f"knob{'s' if len(in_yaml) > 1 else ''} {', '.join(in_yaml)} would not apply, "
            "nor " if in_yaml else "no knob is mapped into it now, but ")
    raise KnobError(
        f"trtllm: extra_args {written[CONFIG_OPTION]} replaces the YAML batchlab generates "
        "(trtllm-serve takes --config and --extra_llm_api_options as one option, and the last "
        f"one given wins), so {lost}the telemetry settings it carries "
        f"({', '.join(k for k, _ in FIXED_CONFIG)}). Put the settings in knobs instead; "
        "extra_args may carry other trtllm-serve flags"
    )


def check(knobs: Knobs) -> None:
    """A cross-knob rule TensorRT-LLM enforces per request, raised at plan time instead."""
    k = knobs.with_defaults(DEFAULTS)
    if (k.is_given("max_num_batched_tokens") and not k.chunked_prefill
            and k.max_model_len is not None and k.max_num_batched_tokens < k.max_model_len):
        off = "off" if k.is_given("chunked_prefill") else "off (TensorRT-LLM's default)"
        raise KnobError(
            f"trtllm: with chunked_prefill {off}, max_num_batched_tokens "
            f"({k.max_num_batched_tokens}: max_num_tokens) must be >= max_model_len "
            f"({k.max_model_len}: max_seq_len): TensorRT-LLM rejects every prompt longer than "
            "max_num_tokens (#9277, #6539). Raise max_num_batched_tokens, leave it unset, or "
            "turn chunked_prefill on"
        )

FIXED = (
    "--host 127.0.0.1 --port PORT --backend pytorch",
    f"--extra_llm_api_options {CONFIG_DIR}/{CONFIG_FILE} (the generated YAML)",
    "YAML: enable_iter_perf_stats: true, return_perf_metrics: true, "
    "perf_metrics_max_requests: 1000 (telemetry)",
)

# Recent main prefixes trtllm_; older 1.x builds exported only a few unprefixed names.
# trtllm_num_paused_requests and trtllm_total_context_tokens exist, but as gauges the collector
# sets from each iteration's inflightBatchingStats (numPausedRequests, numCtxTokens), so a
# scrape sees the last iteration only (NVIDIA/TensorRT-LLM tensorrt_llm/metrics/collector.py
# MetricsCollector.log_iteration_stats @050f80de, read 2026-11-30). The JSON /metrics path sums
# those fields over every iteration since the previous poll (harness.live.telemetry
# trtllm_iterations_reading): a count of pauses, and context plus decode tokens per step. A
# last-iteration gauge means neither, so neither is read as num_preemptions or batch_tokens.
TELEMETRY = TelemetrySpec(
    path="/prometheus/metrics",
    signals=(
        ("num_running", MetricSource(("trtllm_num_requests_running",))),
        ("num_waiting", MetricSource(("trtllm_num_requests_waiting",))),
        ("kv_usage", MetricSource(
            ("trtllm_kv_cache_utilization", "kv_cache_utilization"), reduce="mean")),
    ),
    notes=(
        ("num_preemptions", "trtllm_num_paused_requests is a gauge of the requests paused in "
                            "the last iteration, not a count of pauses; the JSON /metrics sums "
                            "numPausedRequests over every iteration"),
        ("batch_tokens", "trtllm_total_context_tokens is a gauge of the last iteration's "
                         "context tokens, without decode tokens; the JSON /metrics sums "
                         "numCtxTokens + numGenRequests over every iteration"),
        ("prefix_cache_queries", "trtllm_kv_cache_hit_rate is a ratio of blocks, not a count "
                                 "of prompt tokens looked up"),
        ("prefix_cache_hits", "trtllm_kv_cache_hit_rate is a ratio of blocks, not a count of "
                              "prompt tokens found"),
    ),
)
JSON_TELEMETRY = TelemetrySpec(path="/metrics", format="trtllm_json")

# A request's priority: a float in [0, 1], HIGHER first, default 0.5, sent converted from the
# trace's (adapters.base.unit_float_priority). It only orders the waiting queue, and is ignored
# (with a warning per request) unless scheduler_config.waiting_queue_policy is priority; the
# field is then not sent, as servers from before it existed reject unknown fields.
PRIORITY = PriorityWire(
    scale="unit-float-higher-first", off_policy="ignored", server="TensorRT-LLM",
    source="engines.md §2.1 \"Per-request priority\", §5 TRT-LLM quirks 6 and 9, §6 "
           "\"request.priority\": NVIDIA/TensorRT-LLM tensorrt_llm/serve/openai_protocol.py, "
           "tensorrt_llm/_torch/pyexecutor/scheduler/waiting_queue.py (recent main only; "
           "engines.md names no commit)")
WIRE = ServerWire(telemetry=TELEMETRY, priority=PRIORITY)


def render_config(config: tuple[tuple[str, object], ...], *, json_telemetry: bool = False
                  ) -> str:
    """The YAML for ``--extra_llm_api_options``: mapped keys first, then the fixed ones. Read
    from the JSON ``/metrics``, ``return_perf_metrics`` stays off: with it on, recent servers'
    Prometheus collector drains the same stats queue and the JSON endpoint stays ``[]``
    (engines.md, TRT-LLM quirk 1: vllm-project/aibrix#2004)."""
    fixed = tuple((k, False if json_telemetry and k == "return_perf_metrics" else v)
                  for k, v in FIXED_CONFIG)
    return yaml.safe_dump(config_tree((*config, *fixed)), sort_keys=False)


@dataclass(frozen=True, slots=True)
class TrtllmAdapter:
    model: str  # HF folder or hub id (an FP8 ModelOpt checkpoint for FP8 weights)
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int | None = None
    command: str = COMMAND
    env: dict[str, str] = field(default_factory=dict)
    json_telemetry: bool = False  # read the draining JSON /metrics instead of Prometheus
    name: str = NAME
    rules: tuple[KnobRule, ...] = RULES

    def plan(self, knobs: Knobs, *, allow_approximate: bool = False) -> LaunchPlan:
        knobs.validate()
        check(knobs)
        mapping, setting = map_knobs(NAME, self.rules, knobs, allow_approximate=allow_approximate,
                                     names=NAMES, env=self.env)
        check_config_not_replaced(knobs, mapping)
        port = self.port or free_port(self.host)
        argv = (
            self.command, self.model,
            "--host", self.host, "--port", str(port), "--backend", "pytorch",
            "--extra_llm_api_options", f"{CONFIG_DIR}/{CONFIG_FILE}",
            *setting.argv,
        )
        return self._wire().launched(
            NAME, argv=argv, env={**dict(setting.env), **self.env},
            config_files={CONFIG_FILE: render_config(setting.config,
                                                     json_telemetry=self.json_telemetry)},
            mapping=mapping,
            host=self.host, port=port, model=self.served_model_name or self.model)

    def attach(self, base_url: str, knobs: Knobs) -> LaunchPlan:
        return self._wire().attached(NAME, base_url, knobs,
                                     model=self.served_model_name or self.model)

    def _wire(self) -> ServerWire:
        return replace(WIRE, telemetry=JSON_TELEMETRY) if self.json_telemetry else WIRE
