"""Engine profiles: an engine's scheduling defaults plus the cost-model coefficients fitted for it.

A profile is the cost model's JSON (``adapters.reference.cost_model.load_profile``: the
``CostModelParams`` fields at the top level) with a ``metadata`` object that the cost model
ignores and this package reads::

    {
      "source": "...", "device": "h100-sxm", "memory_efficiency": 0.83, ...,
      "metadata": {
        "engine": "vllm", "gpu": "h100-sxm",
        "scheduler": {"max_num_seqs": 1024, ..., "sources": {"max_num_seqs": "..."}},
        "fit": {"train_row_ids": [...], "held_out_row_ids": [...], "coefficients": [...], ...}
      }
    }

Shipped profiles live in ``adapters/reference/profiles/<engine>-<gpu>.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from adapters.reference.cost_model import (
    PROFILES_DIR,
    CostModelParams,
    load_profile,
    profile_digest,
    resolve_profile,
    shipped_profiles,
)

# Scheduler settings a profile (and a row's engine_settings) may give, with their types.
SCHEDULER_KEYS: dict[str, type] = {
    "max_num_seqs": int,
    "max_num_batched_tokens": int,
    "chunked_prefill": bool,
    "prefix_caching": bool,  # the engine's default; the reference does not simulate it
    "admission": str,
    "preemption": str,
    "policy": str,
    "gpu_memory_utilization": float,
    "block_size": int,
    "max_model_len": int,
    "oversized_prompts": str,  # with chunked prefill off: refuse the setup, or reject requests
    "reserve_last_token": bool,  # reserve admission holds prompt + max output (TensorRT-LLM)
}
# CostModelParams fields a row's engine_settings may override (the published run's setup).
COST_OVERRIDE_KEYS = ("frontend_latency_s",)


@dataclass(frozen=True)
class EngineProfile:
    """One engine on one GPU: scheduling defaults, coefficients, and how they were fitted."""

    name: str  # <engine>-<gpu>
    engine: str
    gpu: str
    params: CostModelParams
    scheduler: dict[str, Any]
    path: Path | None = None
    fit: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    def with_params(self, params: CostModelParams) -> EngineProfile:
        return EngineProfile(self.name, self.engine, self.gpu, params, self.scheduler,
                             self.path, self.fit, self.raw)


def read_profile(name_or_path: str | Path) -> EngineProfile:
    """A shipped profile by name (``vllm-h100-sxm``) or any profile file by path."""
    path = resolve_profile(name_or_path)
    params = load_profile(path)
    raw = json.loads(path.read_text())
    meta = raw.get("metadata") or {}
    scheduler = {k: v for k, v in (meta.get("scheduler") or {}).items() if k in SCHEDULER_KEYS}
    name = path.stem
    # a shipped profile names its engine; one written by `batchlab calibrate` records the
    # engine it measured (an object: name, version, URL, ...)
    recorded = meta.get("engine")
    if isinstance(recorded, dict):
        recorded = recorded.get("name")
    engine = str(recorded or name.split("-", 1)[0])
    gpu = str(meta.get("gpu") or params.device or "h100-sxm")
    return EngineProfile(name=name, engine=engine, gpu=gpu, params=params,
                         scheduler=scheduler, path=path, fit=dict(meta.get("fit") or {}), raw=raw)


def all_profiles() -> list[EngineProfile]:
    return [read_profile(name) for name in shipped_profiles()]


def parse_setting(key: str, text: str) -> Any:
    """A value from a row's ``engine_settings`` converted to the setting's type."""
    if key in COST_OVERRIDE_KEYS:
        return float(text)
    kind = SCHEDULER_KEYS.get(key)
    if kind is None:
        known = ", ".join([*SCHEDULER_KEYS, *COST_OVERRIDE_KEYS])
        raise ValueError(f"unknown engine setting {key!r}; known: {known}")
    if kind is bool:
        if text not in ("true", "false"):
            raise ValueError(f"engine setting {key} must be true or false, got {text!r}")
        return text == "true"
    return kind(text)


def params_dict(params: CostModelParams) -> dict[str, Any]:
    """The non-default coefficient fields of ``params`` (what a profile file lists)."""
    defaults = CostModelParams()
    return {f.name: getattr(params, f.name) for f in fields(params)
            if getattr(params, f.name) != getattr(defaults, f.name) and f.name != "source"}


def write_profile(profile: EngineProfile, *, directory: Path = PROFILES_DIR) -> Path:
    """Write ``profile`` as ``<directory>/<name>.json``, keeping its metadata's other keys."""
    meta = dict(profile.raw.get("metadata") or {})
    meta.update({"engine": profile.engine, "gpu": profile.gpu, "fit": profile.fit})
    meta.setdefault("scheduler", profile.scheduler)
    body: dict[str, Any] = {"source": profile.params.source}
    body.update(params_dict(profile.params))
    body["metadata"] = meta
    if isinstance(profile.fit, dict) and profile.fit.get("held_out") is not None:
        # what the accuracy was measured with: a file edited since quotes none
        meta["fit"] = {**profile.fit, "measured_digest": profile_digest(body)}
    path = directory / f"{profile.name}.json"
    path.write_text(json.dumps(body, indent=2) + "\n")
    return path
