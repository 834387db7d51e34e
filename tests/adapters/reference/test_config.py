"""ReferenceConfig: validated once, errors name the field; the mapping from uniform knobs."""

from __future__ import annotations

import pytest

from adapters.knobs import Knobs, ReferenceKnobs
from adapters.reference.config import ConfigError, ReferenceConfig


def test_defaults_resolve() -> None:
    c = ReferenceConfig()
    assert c.gpu_spec.name == "h100-sxm" and c.model_spec.name == "llama-3.1-8b"
    assert c.resolved_admission == "optimistic"
    assert c.resolved_max_model_len == 131072
    s = c.scheduler_config()
    assert (s.policy, s.max_num_seqs, s.max_num_batched_tokens, s.chunked_prefill) == (
        "fcfs", 256, 8192, True)
    assert c.as_dict()["num_gpu_blocks"] == c.resolved_num_gpu_blocks()


def test_too_long_prompt_without_chunked_prefill_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"^max_num_batched_tokens: 2048 must be >= "
                                          r"max_model_len \(4096\).*chunked-prefill"):
        ReferenceConfig(chunked_prefill=False, max_num_batched_tokens=2048, max_model_len=4096)
    # unset max_model_len is the model's 131072: the same rule
    with pytest.raises(ConfigError, match=r"max_model_len \(131072\)"):
        ReferenceConfig(chunked_prefill=False)
    ReferenceConfig(chunked_prefill=False, max_num_batched_tokens=4096, max_model_len=4096)


def test_static_prefills_whole_batches_and_always_reserves() -> None:
    with pytest.raises(ConfigError, match="static policy prefills"):
        ReferenceConfig(policy="static")
    c = ReferenceConfig(policy="static", admission="optimistic", max_model_len=8192)
    assert c.resolved_admission == "reserve"
    assert c.scheduler_config().chunked_prefill is False


@pytest.mark.parametrize(("kw", "field"), [
    ({"policy": "lifo"}, "policy"),
    ({"admission": "greedy"}, "admission"),
    ({"preemption": "kill"}, "preemption"),
    ({"weights_dtype": "int4"}, "weights_dtype"),
    ({"kv_cache_dtype": "fp16"}, "kv_cache_dtype"),
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"max_num_batched_tokens": 1.5}, "max_num_batched_tokens"),
    ({"block_size": -16}, "block_size"),
    ({"num_gpu_blocks": 0}, "num_gpu_blocks"),
    ({"gpu_memory_utilization": 1.2}, "gpu_memory_utilization"),
    ({"max_model_len": 10**7}, "max_model_len"),
    ({"tp": 0}, "tp"),
    ({"chunked_prefill": "yes"}, "chunked_prefill"),
    ({"prefix_caching": "yes"}, "prefix_caching"),
    ({"preemption": "none", "admission": "optimistic"}, "preemption"),
    ({"max_num_seqs": 512, "max_num_batched_tokens": 256}, "max_num_batched_tokens"),
    ({"swap_space_gib": -1}, "swap_space_gib"),
])
def test_errors_name_the_field(kw: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=f"^{field}: "):
        ReferenceConfig(**kw)  # type: ignore[arg-type]


def test_from_knobs_maps_every_knob() -> None:
    knobs = Knobs(max_num_seqs=64, max_num_batched_tokens=4096, policy="priority",
                  preemption="swap", chunked_prefill=True, weights_dtype="fp8",
                  kv_cache_dtype="fp8", gpu_memory_utilization=0.8, tensor_parallel_size=2,
                  max_model_len=8192)
    c = ReferenceConfig.from_knobs(knobs, ReferenceKnobs(block_size=32, num_gpu_blocks=1000),
                                   model="llama-3.1-8b", gpu="h200")
    assert (c.policy, c.preemption, c.resolved_admission) == ("priority", "swap", "optimistic")
    assert (c.max_num_seqs, c.max_num_batched_tokens, c.tp) == (64, 4096, 2)
    assert (c.weights_dtype, c.kv_cache_dtype, c.gpu_memory_utilization) == ("fp8", "fp8", 0.8)
    assert (c.max_model_len, c.block_size, c.num_gpu_blocks, c.gpu) == (8192, 32, 1000, "h200")


def test_from_knobs_preemption_none_means_reserve() -> None:
    c = ReferenceConfig.from_knobs(Knobs(preemption="none"), model="llama-3.1-8b", gpu=None)
    assert c.resolved_admission == "reserve"
    assert c.scheduler_config().admission == "reserve"
    explicit = ReferenceConfig.from_knobs(Knobs(), ReferenceKnobs(admission="reserve"),
                                          model="mistral-7b", gpu="h100-pcie")
    assert explicit.resolved_admission == "reserve"


def test_from_knobs_unset_knobs_keep_the_reference_defaults() -> None:
    given = Knobs.from_mapping({"max_num_seqs": 8, "preemption": "none"})
    c = ReferenceConfig.from_knobs(given, model="llama-3.1-8b", gpu=None)
    default = ReferenceConfig()
    assert (c.max_num_seqs, c.resolved_admission) == (8, "reserve")
    assert c.max_num_batched_tokens == default.max_num_batched_tokens
    assert c.effective_knobs()["max_num_batched_tokens"] == default.max_num_batched_tokens


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_the_static_policy_refuses_a_preemption_it_cannot_apply(preemption: str) -> None:
    """The static policy reserves at admission and never preempts: a preemption asked for
    with it is refused, as the served reference and TensorRT-LLM's STATIC_BATCH refuse it
    (it used to be recorded and silently do nothing). Unset or none is the policy's own."""
    with pytest.raises(ConfigError, match=f"preemption={preemption} cannot apply"):
        ReferenceConfig.from_knobs(Knobs(policy="static", preemption=preemption,
                                         given=frozenset({"policy", "preemption"})),
                                   model="llama-3.1-8b", gpu="h100-sxm")
    for given in (frozenset({"policy"}), frozenset({"policy", "preemption"})):
        config = ReferenceConfig.from_knobs(
            Knobs(policy="static", preemption="none" if "preemption" in given else preemption,
                  given=given), model="llama-3.1-8b", gpu="h100-sxm")
        assert config.resolved_admission == "reserve"
