"""Hugging Face TGI 3.x: the mapping table, the launch command and the metric names.

Flags are those of ``launcher/src/main.rs`` (``struct Args``); ``PREFILL_CHUNKING`` and
``PREFIX_CACHING`` are environment-only. TGI schedules first-come-first-served, never
preempts (it reserves KV for ``input + min(max_new_tokens, 1024)`` tokens at admission) and has
no static-batching mode; those knob values fail at plan time.

Launch: ``text-generation-launcher`` when it is on PATH (or given), else the official image
through a container runtime (``docker``/``podman run``), always as an argv list. The container
gets a name so teardown can remove it even if its client is killed. Its environment is passed
by name only (``-e NAME``; the values sit in the client's own environment, never in an argv
that ``ps`` shows), and ``CUDA_VISIBLE_DEVICES`` picks the GPUs it gets (``--gpus``).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from adapters.base import (
    Derived,
    Follows,
    KnobError,
    KnobRule,
    Knobs,
    LaunchPlan,
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

NAME = "tgi"
LAUNCHER = "text-generation-launcher"
IMAGE_ENV = "BATCHLAB_TGI_IMAGE"
DEFAULT_IMAGE = "ghcr.io/huggingface/text-generation-inference:latest"
CONTAINER_PORT = 80  # the image sets ENV PORT=80
# TGI_WIGGLE_ROOM's default: KV gets free - (1 - cuda_memory_fraction * TGI_WIGGLE_ROOM) * total
# (engines.md 2.1 "Memory fraction for KV": server/text_generation_server/utils/import_utils.py,
# models/flash_causal_lm.py).
WIGGLE_ROOM = 0.90
WIGGLE_ROOM_ENV = "TGI_WIGGLE_ROOM"
DEVICES_ENV = "CUDA_VISIBLE_DEVICES"
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


def _kv_dtype(k: Knobs) -> Setting | Unsupported:
    if k.kv_cache_dtype == "fp8":
        return Setting(("--kv-cache-dtype", "fp8_e4m3fn"))
    # --kv-cache-dtype takes fp8_e4m3fn | fp8_e5m2 only (engines.md 2.3: launcher/src/main.rs
    # KVCacheDtype); without it the KV cache is kept in the model dtype (--dtype).
    if k.is_given("weights_dtype") and k.weights_dtype == "bf16":
        return Setting(note="no flag: the KV cache is kept in the model dtype, bfloat16 "
                       "(--dtype bfloat16)")
    model_dtype = ("the checkpoint's (weights_dtype unset)" if not k.is_given("weights_dtype")
                   else "TGI's choice with --quantize fp8 (--dtype cannot be given with it)")
    return Unsupported(
        "TGI's --kv-cache-dtype takes only fp8_e4m3fn or fp8_e5m2: without it the KV cache is "
        f"kept in the model dtype, here {model_dtype}",
        approximated_as="the model dtype (no flag)",
    )


def _memory(k: Knobs) -> Setting | Unsupported:
    """gpu_memory_utilization u means vLLM's: weights + activations + KV within u x total
    (engines.md 2.1 and vLLM quirk 3). TGI gives KV free - (1 - f x W) x total with W =
    TGI_WIGGLE_ROOM; free = total - weights - activations, so f = u / W gives
    KV = u x total - weights - activations, the same budget. f is at most 1: u above W cannot
    be had."""
    u = k.gpu_memory_utilization
    wiggle = ((WIGGLE_ROOM_ENV, str(WIGGLE_ROOM)),)  # stated: the conversion assumes it
    how = (f"--cuda-memory-fraction is gpu_memory_utilization / {WIGGLE_ROOM} (TGI_WIGGLE_ROOM "
           f"{WIGGLE_ROOM}), so KV = gpu_memory_utilization x total - weights - activations, "
           "as on vLLM")
    if not isinstance(u, int | float):  # the docs' symbolic rows
        return Setting(("--cuda-memory-fraction", f"{u}/{WIGGLE_ROOM}"), env=wiggle,
                       note=f"{how}. {u} above {WIGGLE_ROOM} is refused (with "
                       "--allow-approximate: --cuda-memory-fraction 1.0, approximated as "
                       f"{WIGGLE_ROOM})")
    fraction = u / WIGGLE_ROOM
    if fraction <= 1.0:
        return Setting(("--cuda-memory-fraction", str(fraction)), env=wiggle, note=how)
    return Unsupported(
        f"TGI's KV budget is at most {WIGGLE_ROOM} x total memory minus weights and "
        f"activations (--cuda-memory-fraction 1.0 with TGI_WIGGLE_ROOM {WIGGLE_ROOM}), below "
        f"what {u} of total memory gives vLLM",
        instead=Setting(("--cuda-memory-fraction", "1.0"), env=wiggle),
        approximated_as=f"{WIGGLE_ROOM} (--cuda-memory-fraction 1.0)",
    )


def _prefill_budget_without_chunking(k: Knobs) -> Derived | None:
    """An unset prefill budget with chunking off and a context given: TGI's router refuses to
    start unless max_batch_prefill_tokens >= max_input_tokens (engines.md 2.3:
    backends/v3/src/main.rs), so batchlab passes max_input_tokens (max_model_len - 1)."""
    if k.chunked_prefill or k.max_model_len is None:
        return None
    inputs = _minus_one(k.max_model_len)
    return Derived(
        int(inputs) if inputs.isdigit() else inputs,
        "with chunking off TGI's router needs max_batch_prefill_tokens >= max_input_tokens: "
        "batchlab passes max_input_tokens (max_model_len - 1)",
        Setting(("--max-batch-prefill-tokens", inputs)),
    )


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
             ),
             follows=Follows(("chunked_prefill", "max_model_len"),
                             _prefill_budget_without_chunking)),
    KnobRule("policy", "(FIFO only)", _policy),
    KnobRule("preemption", "(never preempts)", _preemption),
    KnobRule("chunked_prefill", "env PREFILL_CHUNKING", _chunked),
    KnobRule("weights_dtype", "--dtype bfloat16 | --quantize fp8", _weights),
    KnobRule("kv_cache_dtype", "--kv-cache-dtype fp8_e4m3fn", _kv_dtype, ("weights_dtype",)),
    KnobRule("gpu_memory_utilization", "--cuda-memory-fraction, env TGI_WIGGLE_ROOM", _memory),
    KnobRule("prefix_caching", "env PREFIX_CACHING",
             lambda k: Setting(env=(("PREFIX_CACHING", "1" if k.prefix_caching else "0"),))),
    KnobRule("tensor_parallel_size", "--num-shard",
             lambda k: Setting(("--num-shard", str(k.tensor_parallel_size)))),
    KnobRule("max_model_len", "--max-total-tokens, --max-input-tokens", _max_model_len),
    KnobRule("extra_args", "appended to argv as given", lambda k: Setting(k.extra_args)),
)

# TGI's own defaults, each with where it was read: the repository snapshot engines.md was
# written from (huggingface/text-generation-inference @db931fcf, 2026-01-08; engines.md 0, 2.1).
# It never preempts: it reserves KV at admission.
_AT = "@db931fcf, read 2026-11-30"
DEFAULT_SOURCES: dict[str, str] = {
    "policy": f"huggingface/text-generation-inference backends/v3/src/queue.rs (a FIFO "
              f"VecDeque) {_AT}",
    "preemption": "huggingface/text-generation-inference backends/v3/src/queue.rs, "
                  f"router/src/infer/mod.rs (KV reserved at admission) {_AT}",
    "chunked_prefill": "huggingface/text-generation-inference "
                       f"server/text_generation_server/models/globals.py PREFILL_CHUNKING {_AT}",
    "prefix_caching": "huggingface/text-generation-inference launcher/src/main.rs "
                      f"resolve_attention, PREFIX_CACHING {_AT}",
}
# --max-concurrent-requests 128 (launcher/src/main.rs struct Args; engines.md 2.1, TGI quirk 4)
DEFAULT_MAX_CONCURRENT_REQUESTS = 128
MAX_CONCURRENT_REQUESTS_SOURCE = (
    f"huggingface/text-generation-inference launcher/src/main.rs --max-concurrent-requests {_AT}")
# The admission cap is no knob: max_num_seqs maps to --max-batch-size, and every launch passes
# --max-concurrent-requests MAX_CONCURRENT_REQUESTS (FIXED), where TGI's profiles record its
# default. docs/engines.md sets the two side by side (adapters.catalog.unset_differences).
ADMISSION_CAP_KNOB = "max_num_seqs (admission cap: --max-concurrent-requests)"
ADMISSION_CAP_LIVE = f"--max-concurrent-requests {MAX_CONCURRENT_REQUESTS}"
ADMISSION_CAP_WHY = "its `max_num_seqs` maps to `--max-batch-size`, not to the admission cap"
RULES = with_engine_defaults(RULES, {
    "policy": "fcfs", "preemption": "none", "chunked_prefill": True, "prefix_caching": True,
    "max_model_len": None, "extra_args": (),
}, sources=DEFAULT_SOURCES)

FIXED = (
    "--hostname 127.0.0.1 --port PORT (natively; in a container: -p 127.0.0.1:PORT:80)",
    "natively: --prometheus-port PORT2, a second free port (TGI's router binds a Prometheus "
    "listener on 9000 unless told otherwise, and does not start when that port is taken; a "
    "container has a network of its own, where 9000 is free)",
    "--usage-stats off (TGI reports usage to Hugging Face by default)",
    f"--max-concurrent-requests {MAX_CONCURRENT_REQUESTS} (the default "
    f"{DEFAULT_MAX_CONCURRENT_REQUESTS} rejects requests beyond it as overloaded instead of "
    "queueing them)",
    "in a container: -e NAME for each environment variable (values in the client's "
    'environment), --gpus "device=IDS" from CUDA_VISIBLE_DEVICES when set (podman: --device '
    "nvidia.com/gpu=ID), else --gpus all",
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
# TGI's queue is FIFO, and its native /generate_stream, which batchlab replays it through, has
# no priority field: nothing more is stated.
PRIORITY = PriorityWire(source=DEFAULT_SOURCES["policy"])
WIRE = ServerWire(protocol="tgi", version_paths=("/info",), telemetry=TELEMETRY,
                  priority=PRIORITY)


def check(knobs: Knobs) -> None:
    """A cross-knob rule TGI enforces at start-up, raised at plan time instead."""
    tokens, length = knobs.max_num_batched_tokens, knobs.max_model_len
    if (knobs.is_given("max_num_batched_tokens") and not knobs.chunked_prefill
            and length is not None and tokens < length - 1):
        raise KnobError(
            f"tgi: with chunked_prefill off, max_num_batched_tokens ({tokens}: "
            f"--max-batch-prefill-tokens) must be >= max_model_len - 1 ({length - 1}: "
            "--max-input-tokens): TGI's router refuses to start otherwise "
            "(backends/v3/src/main.rs). Raise max_num_batched_tokens, leave it unset, or turn "
            "chunked_prefill on"
        )


def gpu_flags(runtime: str, devices: str | None) -> tuple[str, ...]:
    """The container runtime's GPU selection for ``CUDA_VISIBLE_DEVICES`` (None: unset, all).

    Docker parses ``--gpus`` as CSV, so a list is one quoted item: ``--gpus '"device=0,1"'``
    in a shell (docs.docker.com, resource constraints, GPU). Podman turns each GPU into the CDI
    device ``nvidia.com/gpu=ID``, which is stated directly. An empty value gives no GPU."""
    if devices is None:
        return ("--gpus", "all")
    ids = [d.strip() for d in devices.split(",") if d.strip()]
    if not ids:
        return ()
    if Path(runtime).name == "podman":
        return tuple(f for gpu in ids for f in ("--device", f"nvidia.com/gpu={gpu}"))
    return ("--gpus", f'"device={",".join(ids)}"')


def _another_free_port(host: str, taken: int) -> int:
    """A free port other than ``taken`` (the main port, perhaps chosen free a moment ago and
    not yet bound, so the OS may offer it again)."""
    while (port := free_port(host)) == taken:
        pass
    return port


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
        check(knobs)
        # --engine-env wins over the variables knobs map to (PREFILL_CHUNKING, PREFIX_CACHING,
        # TGI_WIGGLE_ROOM): map_knobs refuses a knob given with another value, and records an
        # unset one as overridden.
        mapping, setting = map_knobs(NAME, self.rules, knobs, allow_approximate=allow_approximate,
                                     env=self.env)
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
            # The router binds Prometheus on --hostname:--prometheus-port, 9000 unless given,
            # and panics when it cannot: a second TGI, or anything else on 9000, stops the launch.
            argv = (
                LAUNCHER, "--model-id", self.model,
                "--hostname", self.host, "--port", str(port),
                "--prometheus-port", str(_another_free_port(self.host, port)), *common,
            )
        else:
            # No --prometheus-port: the container has a network of its own, where 9000 is free,
            # and only CONTAINER_PORT is published (-p), so two containers never share it.
            container = f"batchlab-tgi-{port}"
            model_id, mounts = self._container_model()
            devices = self.env.get(DEVICES_ENV, os.environ.get(DEVICES_ENV))
            gpus = gpu_flags(runtime, devices)
            # The container numbers the GPUs it gets from 0: the host's ids would be wrong there.
            env.pop(DEVICES_ENV, None)
            # -e NAME: the runtime client reads the value from its own environment (the plan's),
            # so no secret appears in an argv any local user can read.
            env_flags = [f for key in sorted(env) for f in ("-e", key)]
            argv = (
                runtime, "run", "--rm", "--name", container,
                *gpus, "--shm-size", "1g",
                "-p", f"{self.host}:{port}:{CONTAINER_PORT}",
                *mounts, *env_flags,
                self.image or os.environ.get(IMAGE_ENV, DEFAULT_IMAGE),
                "--model-id", model_id, *common,
            )
            stop_argv = (runtime, "rm", "-f", container)
            notes = (f"container {container} through {runtime}; removed at teardown",)
            if devices is not None:
                notes += (f"GPUs: {DEVICES_ENV}={devices} -> {' '.join(gpus) or 'none'} "
                          "(numbered from 0 inside the container)",)
        return WIRE.launched(NAME, argv=argv, env=env, mapping=mapping, host=self.host,
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
