"""llama.cpp's ``llama-server``: the mapping table, the launch command and the metric names.

Flags and defaults are those of the llama.cpp tree vendored in the ``llama-cpp-python`` 0.3.36
sdist (llama.cpp commit 0c1e570, 2026-10-01; read 2026-11-30): ``common/arg.cpp`` (the
flags), ``common/common.h`` (``common_params`` defaults), ``tools/server/server.cpp`` (``-np``
auto) and ``tools/server/server-context.cpp`` (slots, batching, the prompt cache).

How llama-server schedules, and why the table reads as it does::

    -np N slots ── one request per slot; a request waits (``requests_deferred``) for a free slot
    -c  C       ── the TOTAL context: with -np N (unified KV off) each slot owns C / N tokens,
                   so max_model_len L becomes -c N*L. The slot's share is reserved up front:
                   nothing is ever preempted, and a prompt longer than C / N is refused
    each step   ── one llama_decode of at most -b tokens: one token of every generating slot,
                   then waiting prompts in slot order, split across steps when they do not fit
    -cb         ── continuous batching (on by default); -nocb prefills a waiting prompt only
                   in a step with no decode tokens: a new batch starts when the running one ends

Launch: ``llama-server -m MODEL.gguf --alias NAME --host 127.0.0.1 --port PORT --metrics``;
the binary is the given executable, ``$BATCHLAB_LLAMA_SERVER``, ``llama-server`` on PATH, or
``.build/llama-server`` (what ``make engines`` builds). The model may be a GGUF file, or a
Hugging Face folder with its GGUF beside it (``models/small-llama`` ->
``models/small-llama.gguf``), so the folder's tokenizer still makes prompts of exact length.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adapters.base import (
    FlagNames,
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

NAME = "llamacpp"
EXECUTABLE_ENV = "BATCHLAB_LLAMA_SERVER"
DEFAULT_BINARY = ".build/llama-server"
SOURCE = ("llama.cpp commit 0c1e570 (2026-10-01), vendored in the llama-cpp-python 0.3.36 sdist; "
          "read 2026-11-30")
AUTO_SLOTS = 4  # -np -1 (auto): 4 slots sharing one unified KV cache (tools/server/server.cpp)
# How the replay client talks to llama-server unless told otherwise: "timings_per_token" makes
# every streamed event carry the server's running token count (timings.predicted_n). Its events
# are not tokens: it holds back incomplete UTF-8 (no event) and streams special tokens as empty
# text, so counting events or text miscounts.
REPLAY_DEFAULTS: dict[str, Any] = {"timings_per_token": True}


def _max_num_seqs(k: Knobs) -> Setting:
    return Setting(("-np", str(k.max_num_seqs)),
                   note="slots; a request beyond them waits for a free one (requests_deferred)")


def _batched_tokens(k: Knobs) -> Setting:
    t = str(k.max_num_batched_tokens)
    return Setting(("-b", t, "-ub", t),
                   note="-b: tokens one llama_decode takes; -ub the same, so a step is one "
                   "forward pass (by default -ub 512 splits a larger step into several)")


def _policy(k: Knobs) -> Setting | Unsupported:
    if k.policy == "fcfs":
        return Setting(("-cb",), note="continuous batching; tasks and free slots are served "
                       "in arrival order")
    if k.policy == "static":
        return Setting(("-nocb",), note="a waiting prompt is prefilled only in a step with no "
                       "decode tokens, so a new batch starts when the running one has finished")
    return Unsupported(
        "llama-server's task queue is first-in first-out; a request carries no priority",
        instead=Setting(("-cb",)), approximated_as="fcfs")


def _preemption(k: Knobs) -> Setting | Unsupported:
    if k.preemption == "none":
        return Setting(note="each slot owns its share of the KV cache (-c / -np) for the "
                       "request's lifetime; nothing is preempted")
    return Unsupported(
        f"llama-server never preempts ({k.preemption} is impossible): a slot keeps its KV "
        "until the request ends, and with a unified KV cache a full cache fails the requests "
        "of the step instead (\"Context size has been exceeded\", server-context.cpp)",
        approximated_as="none (each slot reserves its context)")


def _chunked(k: Knobs) -> Setting | Unsupported:
    if k.chunked_prefill:
        return Setting(note="always: a prompt that does not fit the step's -b budget "
                       "continues in the next steps")
    return Unsupported(
        "llama-server always splits a prompt longer than the step budget (-b) across steps; "
        "set max_num_batched_tokens to at least the longest prompt instead",
        approximated_as="chunked prefill")


def _weights(k: Knobs) -> Unsupported:
    if k.weights_dtype == "bf16":
        return Unsupported(
            "llama-server runs the tensor types stored in the GGUF file (F32, F16, BF16, Q8_0, "
            "...) and has no flag to change them at load: batchlab cannot make the weights "
            "bf16. Serve a BF16 GGUF file (llama.cpp's convert_hf_to_gguf.py --outtype bf16) "
            "and leave weights_dtype unset",
            approximated_as="the GGUF file's own types")
    return Unsupported(
        "llama-server runs the tensor types stored in the GGUF file (F32, F16, BF16, Q8_0, "
        "...) and ggml has no FP8 type; convert or quantize the file instead (llama-quantize)",
        approximated_as="the GGUF file's own types")


def _kv_dtype(k: Knobs) -> Setting | Unsupported:
    if k.kv_cache_dtype == "bf16":
        return Setting(("-ctk", "bf16", "-ctv", "bf16"))
    return Unsupported(
        "ggml has no FP8 KV-cache type (f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, "
        "q5_1: common/arg.cpp kv_cache_types)",
        instead=Setting(("-ctk", "q8_0", "-ctv", "q8_0")),
        approximated_as="q8_0 (8-bit integer blocks)")


def _memory(k: Knobs) -> Unsupported:
    return Unsupported(
        "llama-server sizes its KV cache from the context (-c), not from a memory fraction; "
        "set max_model_len instead")


def _prefix(k: Knobs) -> Setting:
    if k.prefix_caching:
        return Setting(("--cache-prompt",),
                       note="a slot reuses the longest common prefix of its previous prompt, "
                       "and idle slots are kept in a host-memory prompt cache (--cache-ram)")
    return Setting(("--no-cache-prompt", "--cache-ram", "0"),
                   note="no reuse within a slot and no host-memory prompt cache")


def _tensor_parallel(k: Knobs) -> Setting | Unsupported:
    if k.tensor_parallel_size == 1:
        return Setting(note="one device")
    return Unsupported(
        "llama-server splits a model across GPUs by layers (--split-mode layer) or rows "
        "(--split-mode row), not by tensor parallelism, and on a CPU there is one device")


def _context(k: Knobs) -> Setting:
    if k.max_model_len is None:
        return Setting(note="unset: the model's training context (may be reduced to fit "
                       "memory: --fit)")
    total = _times(k.max_num_seqs, k.max_model_len)
    return Setting(("-c", total),
                   note="-c is the total context shared by all slots: each of the N slots "
                   "gets c / N = L tokens (with -np unset, 4 slots share one unified cache "
                   "and any one may use all of it)")


def _times(n: Any, length: Any) -> str:
    if isinstance(n, int) and isinstance(length, int):
        return str(n * length)
    return f"{n}*{length}"  # the docs' symbolic rows


RULES: tuple[KnobRule, ...] = (
    KnobRule("max_num_seqs", "-np (slots)", _max_num_seqs),
    KnobRule("max_num_batched_tokens", "-b, -ub", _batched_tokens),
    KnobRule("policy", "-cb | -nocb", _policy),
    KnobRule("preemption", "(never preempts)", _preemption),
    KnobRule("chunked_prefill", "(always chunks)", _chunked),
    KnobRule("weights_dtype", "(the GGUF file's types)", _weights),
    KnobRule("kv_cache_dtype", "-ctk, -ctv", _kv_dtype),
    KnobRule("gpu_memory_utilization", "(none: KV sized by -c)", _memory),
    KnobRule("prefix_caching", "--[no-]cache-prompt, --cache-ram 0", _prefix),
    KnobRule("tensor_parallel_size", "(one device)", _tensor_parallel),
    KnobRule("max_model_len", "-c (total over slots)", _context, ("max_num_seqs",)),
    KnobRule("extra_args", "appended to argv as given", lambda k: Setting(k.extra_args)),
)

# llama-server's own defaults (common/common.h common_params; tools/server/server.cpp; see
# SOURCE): -np -1 is "auto", 4 slots sharing a unified KV cache; -b 2048, -ub 512;
# cont_batching true; cache_prompt true (and cache_ram_mib 8192); KV cache f16 (not a value
# one can ask for through the knob, which offers bf16 and fp8). The weights are the file's.
RULES = with_engine_defaults(RULES, {
    "max_num_seqs": AUTO_SLOTS, "max_num_batched_tokens": 2048, "policy": "fcfs",
    "preemption": "none", "chunked_prefill": True, "kv_cache_dtype": "f16", "prefix_caching": True,
    "tensor_parallel_size": 1, "max_model_len": None, "extra_args": (),
}, pinned={
    "policy": "continuous batching is stated (-cb), so a build whose default differs still "
              "batches continuously",
})

# The long names of the short flags the table passes (common/arg.cpp, see SOURCE), so that
# extra_args written either way override the mapped knob; -nocb is --no-cont-batching.
NAMES = FlagNames(aliases={
    "c": "ctx-size", "np": "parallel", "b": "batch-size", "ub": "ubatch-size",
    "ctk": "cache-type-k", "ctv": "cache-type-v", "cb": "cont-batching",
    "nocb": "no-cont-batching", "cram": "cache-ram",
})

FIXED = (
    "-m MODEL.gguf (a Hugging Face folder's GGUF beside it: models/x -> models/x.gguf)",
    "--alias NAME --host 127.0.0.1 --port PORT (a free port unless given)",
    "--metrics (the llamacpp:* Prometheus families at /metrics)",
    f"defaults and flags: {SOURCE}",
)

# No KV-usage or preemption gauge and no per-step token histogram in the pinned build
# (tools/server/server-task.cpp to_metrics, see SOURCE; the families it exports are listed in
# shared/reference/cpu-engines.md 3b). llamacpp:kv_cache_usage_ratio is from older builds: it is
# still read when a server exports it, but not claimed (`batchlab engines` lists it missing).
TELEMETRY = TelemetrySpec(
    path="/metrics",
    signals=(
        ("num_running", MetricSource(("llamacpp:requests_processing",))),
        ("num_waiting", MetricSource(("llamacpp:requests_deferred",))),
        ("kv_usage", MetricSource(("llamacpp:kv_cache_usage_ratio",), expected=False)),
    ),
    notes=(("kv_usage", "not exported by the pinned build; llamacpp:kv_cache_usage_ratio is "
                        "read if an older build exports it"),),
)
# No request priority: llama-server's task queue is first-in first-out.
PRIORITY = PriorityWire(off_policy="no-priority", server="llama-server",
                        source=f"tools/server/server-queue.cpp server_queue ({SOURCE})")
WIRE = ServerWire(version_paths=("/props",), telemetry=TELEMETRY, priority=PRIORITY)


def find_executable(explicit: str | None = None) -> str:
    """The llama-server binary (see the module docstring for the order)."""
    if explicit:
        return explicit
    if os.environ.get(EXECUTABLE_ENV):
        return os.environ[EXECUTABLE_ENV]
    on_path = shutil.which("llama-server")
    if on_path:
        return on_path
    return DEFAULT_BINARY  # absent: the launch fails naming it (`make engines` builds it)


def gguf_path(model: str) -> str:
    """The GGUF file llama-server loads for ``model`` (a file, or a folder with one beside it
    or inside it); raises KnobError naming what was looked for."""
    path = Path(model)
    if path.suffix == ".gguf" or not path.is_dir():
        return model
    beside = path.parent / (path.name + ".gguf")
    if beside.is_file():
        return str(beside)
    inside = sorted(path.glob("*.gguf"))
    if len(inside) == 1:
        return str(inside[0])
    raise KnobError(f"llamacpp: {model} is a folder without one GGUF file; llama-server loads "
                    f"GGUF (looked for {beside} and {path}/*.gguf; `make engines` converts the "
                    "local models)")


@dataclass(frozen=True, slots=True)
class LlamaCppAdapter:
    model: str  # a GGUF file, or a folder whose GGUF lies beside it
    served_model_name: str | None = None  # --alias; the name requests carry
    host: str = "127.0.0.1"
    port: int | None = None
    executable: str | None = None  # see find_executable()
    env: dict[str, str] = field(default_factory=dict)
    name: str = NAME
    rules: tuple[KnobRule, ...] = RULES

    def plan(self, knobs: Knobs, *, allow_approximate: bool = False) -> LaunchPlan:
        knobs.validate()
        mapping, setting = map_knobs(NAME, self.rules, knobs, allow_approximate=allow_approximate,
                                     names=NAMES, env=self.env)
        port = self.port or free_port(self.host)
        served = self.served_model_name or self.model
        argv = (
            find_executable(self.executable), "-m", gguf_path(self.model),
            "--alias", served, "--host", self.host, "--port", str(port), "--metrics",
            *setting.argv,
        )
        return WIRE.launched(NAME, argv=argv, env={**dict(setting.env), **self.env},
                             mapping=mapping, host=self.host, port=port, model=served)

    def attach(self, base_url: str, knobs: Knobs) -> LaunchPlan:
        return WIRE.attached(NAME, base_url, knobs, model=self.served_model_name or self.model)


def reported_knobs(props: Mapping[str, Any] | None,
                   slots: Any = None) -> dict[str, Any]:
    """The knobs a running llama-server reports about itself (``/props``, ``/slots``):
    ``max_num_seqs`` (its slots) and ``max_model_len`` (one slot's context). Nothing else it
    reports maps onto a knob; what it does not report stays unknown."""
    out: dict[str, Any] = {}
    if isinstance(props, Mapping):
        total = props.get("total_slots")
        if isinstance(total, int) and total > 0:
            out["max_num_seqs"] = total
        settings = props.get("default_generation_settings")
        n_ctx = settings.get("n_ctx") if isinstance(settings, Mapping) else None
        if isinstance(n_ctx, int) and n_ctx > 0:
            out["max_model_len"] = n_ctx
    if isinstance(slots, list) and slots:
        out.setdefault("max_num_seqs", len(slots))
        first = slots[0]
        if isinstance(first, Mapping) and isinstance(first.get("n_ctx"), int):
            out.setdefault("max_model_len", first["n_ctx"])
    return out
