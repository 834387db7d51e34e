"""Model catalog: the architecture figures the cost model needs, and where they came from.

A model is a decoder-only transformer with grouped-query attention and a gated (SwiGLU) MLP,
which covers Llama, Mistral and Qwen2. Any local Hugging Face ``config.json`` (or a folder
holding one) works too; only the shape fields below are read, never weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer's shape. Parameter counts are derived, never typed in."""

    name: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    qkv_bias: bool = False
    gated_mlp: bool = True  # SwiGLU: gate, up and down projections
    source: str = ""

    # ---- parameter counts (weights of one replica, before tensor parallelism)

    @property
    def num_attention_params_per_layer(self) -> int:
        q_out = self.num_attention_heads * self.head_dim
        kv_out = 2 * self.num_kv_heads * self.head_dim
        bias = (q_out + kv_out) if self.qkv_bias else 0
        return self.hidden_size * (q_out + kv_out) + q_out * self.hidden_size + bias

    @property
    def num_mlp_params_per_layer(self) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden_size * self.intermediate_size

    @property
    def num_linear_params(self) -> int:
        """Attention and MLP projections of all layers: the weights FP8 quantizes."""
        return self.num_layers * (
            self.num_attention_params_per_layer + self.num_mlp_params_per_layer
        )

    @property
    def num_embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_lm_head_params(self) -> int:
        """The output projection; with tied embeddings it is the embedding matrix itself."""
        return self.vocab_size * self.hidden_size

    @property
    def num_norm_params(self) -> int:
        return (2 * self.num_layers + 1) * self.hidden_size

    @property
    def num_params(self) -> int:
        untied_head = 0 if self.tie_word_embeddings else self.num_lm_head_params
        return (self.num_embedding_params + untied_head + self.num_linear_params
                + self.num_norm_params)

    def kv_bytes_per_token(self, kv_bytes_per_element: float, tp: int = 1) -> float:
        """K and V of every layer for one token, on one GPU of a tensor-parallel group.

        KV heads are split over the GPUs; with more GPUs than KV heads each GPU keeps one
        (replicated), as vLLM does.
        """
        kv_heads_per_gpu = max(1, self.num_kv_heads // tp)
        return 2 * self.num_layers * kv_heads_per_gpu * self.head_dim * kv_bytes_per_element


def _llama(name: str, source: str, **kw: Any) -> ModelSpec:
    base: dict[str, Any] = dict(tie_word_embeddings=False, qkv_bias=False, gated_mlp=True)
    base.update(kw)
    return ModelSpec(name=name, source=source, **base)


MODELS: dict[str, ModelSpec] = {
    "llama-3.1-8b": _llama(
        "llama-3.1-8b", "meta-llama/Llama-3.1-8B config.json",
        hidden_size=4096, num_layers=32, num_attention_heads=32, num_kv_heads=8, head_dim=128,
        intermediate_size=14336, vocab_size=128256, max_position_embeddings=131072,
    ),
    "llama-3.1-70b": _llama(
        "llama-3.1-70b", "meta-llama/Llama-3.1-70B config.json",
        hidden_size=8192, num_layers=80, num_attention_heads=64, num_kv_heads=8, head_dim=128,
        intermediate_size=28672, vocab_size=128256, max_position_embeddings=131072,
    ),
    "mistral-7b": _llama(
        "mistral-7b", "mistralai/Mistral-7B-Instruct-v0.3 config.json",
        hidden_size=4096, num_layers=32, num_attention_heads=32, num_kv_heads=8, head_dim=128,
        intermediate_size=14336, vocab_size=32768, max_position_embeddings=32768,
    ),
    "qwen2.5-7b": _llama(
        "qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct config.json",
        hidden_size=3584, num_layers=28, num_attention_heads=28, num_kv_heads=4, head_dim=128,
        intermediate_size=18944, vocab_size=152064, max_position_embeddings=32768,
        qkv_bias=True,
    ),
    "llama-3.2-1b": _llama(
        "llama-3.2-1b", "meta-llama/Llama-3.2-1B config.json",
        hidden_size=2048, num_layers=16, num_attention_heads=32, num_kv_heads=8, head_dim=64,
        intermediate_size=8192, vocab_size=128256, max_position_embeddings=131072,
        tie_word_embeddings=True,
    ),
    "qwen2.5-0.5b": _llama(
        "qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B-Instruct config.json",
        hidden_size=896, num_layers=24, num_attention_heads=14, num_kv_heads=2, head_dim=64,
        intermediate_size=4864, vocab_size=151936, max_position_embeddings=32768,
        tie_word_embeddings=True, qkv_bias=True,
    ),
}

# model_type values whose HF config class defaults tie_word_embeddings to False
_UNTIED_BY_DEFAULT = {"llama", "mistral", "mixtral", "qwen2", "qwen3"}
_UNGATED_ACTIVATIONS = {"gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "gelu_fast"}


class UnknownModelError(ValueError):
    """The name is not in the catalog and is not a readable HF config.json."""


def known_models() -> tuple[str, ...]:
    return tuple(sorted(MODELS))


def lookup_model(name_or_path: str) -> ModelSpec:
    """A catalog name, or a path to a HF ``config.json`` (or the folder holding one)."""
    spec = MODELS.get(name_or_path.lower())
    if spec is not None:
        return spec
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return model_from_hf_config(path)
    raise UnknownModelError(
        f"unknown model {name_or_path!r}; known models: {', '.join(known_models())}, "
        "or a path to a Hugging Face config.json (or its folder)"
    )


def model_from_hf_config(path: Path) -> ModelSpec:
    """Read a model's shape from a Hugging Face ``config.json``; errors name the file and key."""
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UnknownModelError(f"{path}: not a readable JSON config: {exc}") from None
    if not isinstance(cfg, dict):
        raise UnknownModelError(f"{path}: expected a JSON object")
    cfg = cfg.get("text_config", cfg) if "hidden_size" not in cfg else cfg

    def get_int(*keys: str, default: int | None = None) -> int:
        for key in keys:
            if cfg.get(key) is not None:  # transformers writes null for a key left unset
                value = cfg[key]
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise UnknownModelError(
                        f"{path}: {key} must be a positive integer, got {value!r}")
                return value
        if default is None:
            raise UnknownModelError(f"{path}: missing {keys[0]}")
        return default

    hidden = get_int("hidden_size", "n_embd", "d_model")
    heads = get_int("num_attention_heads", "n_head")
    kv_heads = get_int("num_key_value_heads", default=heads)
    if heads % kv_heads:  # each KV head serves a whole group of query heads
        raise UnknownModelError(f"{path}: num_attention_heads ({heads}) must be a multiple of "
                                f"num_key_value_heads ({kv_heads})")
    model_type = str(cfg.get("model_type", ""))
    tie = cfg.get("tie_word_embeddings", model_type not in _UNTIED_BY_DEFAULT)
    return ModelSpec(
        name=str(path),
        hidden_size=hidden,
        num_layers=get_int("num_hidden_layers", "n_layer"),
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=get_int("head_dim", default=hidden // heads),
        intermediate_size=get_int("intermediate_size", "n_inner", default=4 * hidden),
        vocab_size=get_int("vocab_size"),
        tie_word_embeddings=bool(tie),
        max_position_embeddings=get_int("max_position_embeddings", "n_positions", default=2048),
        qkv_bias=bool(cfg.get("attention_bias", model_type.startswith("qwen2"))),
        # GPT-2-style configs name it activation_function
        gated_mlp=str(cfg.get("hidden_act") or cfg.get("activation_function") or "silu")
        not in _UNGATED_ACTIVATIONS,
        source=str(path),
    )
