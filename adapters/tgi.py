"""Hugging Face TGI 3.x: the mapping table, the launch command and the metric names.

Flags are those of ``launcher/src/main.rs`` (``struct Args``); ``PREFILL_CHUNKING`` and
``PREFIX_CACHING`` are environment-only. TGI schedules first-come-first-served, never
preempts (it reserves KV for ``input + min(max_new_tokens, 1024)`` tokens at admission) and has
no static-batching mode; those knob values fail at plan time.

Launch: ``text-generation-launcher`` when it is on PATH (or given), else the official image
through a container runtime (``docker``/``podman run``), always as an argv list. The container
gets a name so teardown can remove it even if its client is killed.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from adapters.base import (
    KnobRule,
    Knobs,
    LaunchPlan,
    MetricSource,
    ServerWire,
    Setting,
    TelemetrySpec,
    Unsupported,
    map_knobs,
    with_engine_defaults,
)
from adapters.process import free_port

NAME = "tgi"
LAUNCHER = "text-generation-launcher"
IMAGE_ENV = "BATCHLAB_TGI_IMAGE"
DEFAULT_IMAGE = "ghcr.io/huggingface/text-generation-inference:latest"
CONTAINER_PORT = 80  # the image sets ENV PORT=80
# TGI's default admission cap (128) turns requests beyond it into "overloaded" errors, where
# vLLM and TRT-LLM queue them. A high cap keeps the comparison about scheduling.
MAX_CONCURRENT_REQUESTS = 4096


def _minus_one(value: object) -> str:
    return str(value - 1) if isinstance(value, int) else f"{value}-1"


def _max_num_seqs(k: Knobs) -> Setting | Unsupported:
    flags = ("--max-batch-size", str(k.max_num_seqs))
    if not k.chunked_prefill:
        return Setting(flags)
    return Unsupported(
        "with prefill chunking on, TGI ignores --max-batch-size when requests join a running "
        "batch; the KV budget bounds the batch instead",
        instead=Setting(flags),
        approximated_as=f"--max-batch-size {k.max_num_seqs} (honoured only at batch start)",
    )


def _policy(k: Knobs) -> Setting | Unsupported:
    if k.policy == "fcfs":
        return Setting(note="TGI's queue is first-come-first-served; no flag needed")
    if k.policy == "priority":
        return Unsupported("TGI has no request priorities (its queue is FIFO)")
    return Unsupported(
        "TGI has no static-batching mode (new requests always join the running batch)"
    )


def _preemption(k: Knobs) -> Setting | Unsupported:
    if k.preemption == "none":
        return Setting(note="TGI reserves KV for each request at admission and never preempts")
    return Unsupported(
        f"TGI never preempts ({k.preemption} is impossible): it reserves KV for "
        "input + min(max_new_tokens, 1024) tokens at admission",
        approximated_as="none (reserve at admission)",
    )


def _chunked(k: Knobs) -> Setting:
    return Setting(
        env=(("PREFILL_CHUNKING", "1" if k.chunked_prefill else "0"),),
        note="effective only with flashinfer/flashdecoding attention and no speculation",
    )


def _weights(k: Knobs) -> Setting:
    if k.weights_dtype == "fp8":
        # --dtype cannot be combined with --quantize
        return Setting(("--quantize", "fp8"), note="e4m3 on the fly; H100 or newer")
    return Setting(("--dtype", "bfloat16"))


def _kv_dtype(k: Knobs) -> Setting:
    if k.kv_cache_dtype == "fp8":
        return Setting(("--kv-cache-dtype", "fp8_e4m3fn"))
    return Setting(note="unset: the model's dtype")


def _max_model_len(k: Knobs) -> Setting:
    if k.max_model_len is None:
        return Setting(note="unset: the model's max_position_embeddings")
    return Setting((
        "--max-total-tokens", str(k.max_model_len),
        "--max-input-tokens", _minus_one(k.max_model_len),
    ))


RULES: tuple[KnobRule, ...] = (
    KnobRule("max_num_seqs", "--max-batch-size", _max_num_seqs, ("chunked_prefill",)),
    KnobRule("max_num_batched_tokens", "--max-batch-prefill-tokens",
             lambda k: Setting(
                 ("--max-batch-prefill-tokens", str(k.max_num_batched_tokens)),
                 note="a prefill-token budget: decode tokens are not counted against it",
             )),
    KnobRule("policy", "(FIFO only)", _policy),
    KnobRule("preemption", "(never preempts)", _preemption),
    KnobRule("chunked_prefill", "env PREFILL_CHUNKING", _chunked),
    KnobRule("weights_dtype", "--dtype bfloat16 | --quantize fp8", _weights),
    KnobRule("kv_cache_dtype", "--kv-cache-dtype fp8_e4m3fn", _kv_dtype),
    KnobRule("gpu_memory_utilization", "--cuda-memory-fraction",
             lambda k: Setting(
                 ("--cuda-memory-fraction", str(k.gpu_memory_utilization)),
                 note="KV then gets free - (1 - fraction * TGI_WIGGLE_ROOM) * total",
             )),
    KnobRule("prefix_caching", "env PREFIX_CACHING",
             lambda k: Setting(env=(("PREFIX_CACHING", "1" if k.prefix_caching else "0"),))),
    KnobRule("tensor_parallel_size", "--num-shard",
             lambda k: Setting(("--num-shard", str(k.tensor_parallel_size)))),
    KnobRule("max_model_len", "--max-total-tokens, --max-input-tokens", _max_model_len),
    KnobRule("extra_args", "appended to argv as given", lambda k: Setting(k.extra_args)),
)

# TGI's own defaults (launcher/src/main.rs; backends/v3/src/queue.rs: FIFO only; read 2026-11).
RULES = with_engine_defaults(RULES, {
    "policy": "fcfs", "chunked_prefill": True, "prefix_caching": True, "max_model_len": None,
    "extra_args": (),
})

FIXED = (
    "--hostname 127.0.0.1 --port PORT (natively; in a container: -p 127.0.0.1:PORT:80)",
    "--usage-stats off (TGI reports usage to Hugging Face by default)",
    f"--max-concurrent-requests {MAX_CONCURRENT_REQUESTS} (the default 128 rejects requests "
    "beyond it as overloaded instead of queueing them)",
)

# KV usage has no gauge; the reference's proxy is the current batch's token reservation over
# the batch token budget.
TELEMETRY = TelemetrySpec(
    path="/metrics",
    signals=(
        ("num_running", MetricSource(("tgi_batch_current_size",))),
        ("num_waiting", MetricSource(("tgi_queue_size",))),
        ("kv_usage", MetricSource(
            ("tgi_batch_current_max_tokens",), kind="ratio",
            denominator=("tgi_batch_max_total_tokens",))),
    ),
)
WIRE = ServerWire(protocol="tgi", version_paths=("/info",), telemetry=TELEMETRY)


def _runtime(explicit: str | None) -> str | None:
    """None: the native launcher; else the container runtime to use."""
    if explicit:
        return None if explicit == "native" else explicit
    if shutil.which(LAUNCHER):
        return None
    for runtime in ("docker", "podman"):
        if shutil.which(runtime):
            return runtime
    return None


@dataclass(frozen=True, slots=True)
class TgiAdapter:
    model: str  # local folder or hub id
    served_model_name: str | None = None  # TGI takes "tgi"; recorded for requests
    host: str = "127.0.0.1"
    port: int | None = None
    runtime: str | None = None  # "native", "docker", "podman"; None: native if found
    image: str | None = None  # default $BATCHLAB_TGI_IMAGE or DEFAULT_IMAGE
    env: dict[str, str] = field(default_factory=dict)
    name: str = NAME
    rules: tuple[KnobRule, ...] = RULES

    def plan(self, knobs: Knobs, *, allow_approximate: bool = False) -> LaunchPlan:
        knobs.validate()
        mapping, setting = map_knobs(NAME, self.rules, knobs, allow_approximate=allow_approximate)
        port = self.port or free_port(self.host)
        common = (
            "--usage-stats", "off",
            "--max-concurrent-requests", str(MAX_CONCURRENT_REQUESTS),
            *setting.argv,
        )
        env = {"HF_HUB_OFFLINE": "1", **dict(setting.env), **self.env}
        runtime = _runtime(self.runtime)
        stop_argv: tuple[str, ...] = ()
        notes: tuple[str, ...] = ()
        if runtime is None:
            argv = (
                LAUNCHER, "--model-id", self.model,
                "--hostname", self.host, "--port", str(port), *common,
            )
            launch_env = env
        else:
            container = f"batchlab-tgi-{port}"
            model_id, mounts = self._container_model()
            env_flags = [f for key, value in sorted(env.items()) for f in ("-e", f"{key}={value}")]
            argv = (
                runtime, "run", "--rm", "--name", container,
                "--gpus", "all", "--shm-size", "1g",
                "-p", f"{self.host}:{port}:{CONTAINER_PORT}",
                *mounts, *env_flags,
                self.image or os.environ.get(IMAGE_ENV, DEFAULT_IMAGE),
                "--model-id", model_id, *common,
            )
            launch_env = {}
            stop_argv = (runtime, "rm", "-f", container)
            notes = (f"container {container} through {runtime}; removed at teardown",)
        return WIRE.launched(NAME, argv=argv, env=launch_env, mapping=mapping, host=self.host,
                             port=port, model=self.served_model_name or "tgi",
                             stop_argv=stop_argv, notes=notes)

    def _container_model(self) -> tuple[str, tuple[str, ...]]:
        """A local model folder is mounted read-only; a hub id uses the mounted HF cache."""
        path = Path(self.model)
        if path.exists():
            return "/model", ("-v", f"{path.resolve()}:/model:ro")
        cache = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
        return self.model, ("-v", f"{cache}:/data")

    def attach(self, base_url: str, knobs: Knobs) -> LaunchPlan:
        return WIRE.attached(NAME, base_url, knobs, model=self.served_model_name or "tgi")
