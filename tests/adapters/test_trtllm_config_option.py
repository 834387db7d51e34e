"""TensorRT-LLM's --config / --extra_llm_api_options in extra_args: trtllm-serve reads them as
one option and the last one given wins (tensorrt_llm/commands/serve.py @00209af1), so one in
extra_args would replace the generated YAML and every knob mapped into it."""

from __future__ import annotations

import pytest

from adapters import trtllm
from adapters.base import KnobError, Knobs


def plan(knobs: dict[str, object]) -> None:
    trtllm.TrtllmAdapter("nvidia/model-FP8", port=8001).plan(Knobs.from_mapping(knobs))


@pytest.mark.parametrize(
    ("extra", "written"),
    [
        (["--config", "/tmp/other.yaml"], "--config"),
        (["--config=/tmp/other.yaml"], "--config"),
        (["--extra_llm_api_options", "/tmp/other.yaml"], "--extra_llm_api_options"),
        (["--extra-llm-api-options=/tmp/other.yaml"], "--extra-llm-api-options"),
    ],
)
def test_another_yaml_in_extra_args_is_refused(extra: list[str], written: str) -> None:
    with pytest.raises(KnobError) as err:
        plan({"max_num_seqs": 64, "chunked_prefill": True, "extra_args": extra})
    assert str(err.value) == (
        f"trtllm: extra_args {written} replaces the YAML batchlab generates (trtllm-serve takes "
        "--config and --extra_llm_api_options as one option, and the last one given wins), so "
        "knobs max_num_seqs, chunked_prefill would not apply, nor the telemetry settings it "
        "carries (enable_iter_perf_stats, return_perf_metrics, perf_metrics_max_requests). Put "
        "the settings in knobs instead; extra_args may carry other trtllm-serve flags")


def test_it_is_refused_even_with_no_knob_in_the_yaml() -> None:
    with pytest.raises(KnobError, match="no knob is mapped into it now, but the telemetry "
                                        "settings it carries"):
        plan({"extra_args": ["--config", "/tmp/other.yaml"]})


def test_one_knob_in_the_yaml_is_named() -> None:
    with pytest.raises(KnobError, match=r", so knob max_model_len would "
                                        r"not apply, nor the telemetry"):
        plan({"max_model_len": 2048, "extra_args": ["--config", "/tmp/other.yaml"]})


def test_other_flags_in_extra_args_still_pass() -> None:
    adapter = trtllm.TrtllmAdapter("m", port=8001)
    p = adapter.plan(Knobs.from_mapping({"extra_args": ["--reasoning_parser", "qwen3"]}))
    assert p.argv[-2:] == ("--reasoning_parser", "qwen3")
