"""The adapters' mapping tables: every knob, refusals at plan time, approximations recorded."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from adapters import catalog, openai, tgi, trtllm, vllm
from adapters.base import (
    CONFIG_DIR,
    KnobError,
    Knobs,
    LaunchPlan,
    MappedKnob,
    config_tree,
    map_knobs,
)
from adapters.knobs import ReferenceKnobs

REPO = Path(__file__).resolve().parents[2]


def by_knob(plan: LaunchPlan) -> dict[str, MappedKnob]:
    return {m.knob: m for m in plan.mapping}


def flag_value(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def vllm_plan(knobs: Knobs, **kw: object) -> LaunchPlan:
    adapter = vllm.VllmAdapter("models/tiny-llama", "tiny", port=18000, python="/venv/python")
    return adapter.plan(knobs, **kw)  # type: ignore[arg-type]


# ---------------------------------------------------------------- every table


@pytest.mark.parametrize("info", list(catalog.INFO.values()), ids=lambda i: i.name)
def test_every_knob_has_exactly_one_rule(info: catalog.EngineInfo) -> None:
    assert sorted(r.knob for r in info.rules) == sorted(Knobs.names())


@pytest.mark.parametrize("info", list(catalog.INFO.values()), ids=lambda i: i.name)
def test_rules_depend_only_on_real_knobs(info: catalog.EngineInfo) -> None:
    for rule in info.rules:
        assert set(rule.depends_on) <= set(Knobs.names()) - {rule.knob}


def test_map_knobs_records_every_knob_in_order() -> None:
    mapping, setting = map_knobs("vllm", vllm.RULES, Knobs(), allow_approximate=False)
    assert [m.knob for m in mapping] == list(Knobs.names())
    assert all(m.status == "applied" for m in mapping)
    assert "--max-num-seqs" in setting.argv


def test_a_table_missing_a_knob_is_caught() -> None:
    with pytest.raises(KnobError, match="no rule for"):
        map_knobs("broken", vllm.RULES[1:], Knobs(), allow_approximate=False)


def test_all_refusals_are_reported_at_once() -> None:
    knobs = Knobs(policy="static", preemption="swap")
    with pytest.raises(KnobError) as err:
        vllm_plan(knobs)
    assert "policy='static'" in str(err.value) and "preemption='swap'" in str(err.value)
    assert "--allow-approximate" in str(err.value)


# ---------------------------------------------------------------- vLLM


def test_vllm_always_passes_both_batch_flags() -> None:
    plan = vllm_plan(Knobs())
    assert flag_value(plan.argv, "--max-num-seqs") == "256"
    assert flag_value(plan.argv, "--max-num-batched-tokens") == "8192"


def test_vllm_every_knob_value() -> None:
    knobs = Knobs(
        max_num_seqs=8, max_num_batched_tokens=512, policy="priority", preemption="recompute",
        chunked_prefill=False, weights_dtype="fp8", kv_cache_dtype="fp8",
        gpu_memory_utilization=0.8, prefix_caching=True, tensor_parallel_size=2,
        max_model_len=512, extra_args=("--enforce-eager",),
    )
    plan = vllm_plan(knobs)
    argv = plan.argv
    assert all(isinstance(a, str) for a in argv)
    assert argv[:3] == ("/venv/python", "-m", vllm.API_SERVER_MODULE)
    assert flag_value(argv, "--model") == "models/tiny-llama"
    assert flag_value(argv, "--served-model-name") == "tiny"
    assert flag_value(argv, "--host") == "127.0.0.1"
    assert flag_value(argv, "--port") == "18000"
    assert flag_value(argv, "--max-num-seqs") == "8"
    assert flag_value(argv, "--max-num-batched-tokens") == "512"
    assert flag_value(argv, "--scheduling-policy") == "priority"
    assert "--no-enable-chunked-prefill" in argv
    assert flag_value(argv, "--quantization") == "fp8"
    assert flag_value(argv, "--kv-cache-dtype") == "fp8"
    assert flag_value(argv, "--gpu-memory-utilization") == "0.8"
    assert "--enable-prefix-caching" in argv
    assert flag_value(argv, "--tensor-parallel-size") == "2"
    assert flag_value(argv, "--max-model-len") == "512"
    assert argv[-1] == "--enforce-eager"
    m = by_knob(plan)
    assert m["max_num_seqs"].flags == ("--max-num-seqs 8",)
    assert m["preemption"].flags == () and m["preemption"].status == "applied"
    assert plan.env["VLLM_NO_USAGE_STATS"] == "1"
    assert plan.base_url == "http://127.0.0.1:18000" and plan.model == "tiny"


def test_vllm_defaults() -> None:
    argv = vllm_plan(Knobs()).argv
    assert "--enable-chunked-prefill" in argv and "--no-enable-prefix-caching" in argv
    assert flag_value(argv, "--dtype") == "bfloat16"
    assert flag_value(argv, "--kv-cache-dtype") == "auto"
    assert "--max-model-len" not in argv


@pytest.mark.parametrize(
    ("knobs", "fragment"),
    [
        (Knobs(policy="static"), "static"),
        (Knobs(preemption="swap"), "swap"),
        (Knobs(preemption="none"), "recompute"),
    ],
)
def test_vllm_refuses_what_v1_cannot_do(knobs: Knobs, fragment: str) -> None:
    with pytest.raises(KnobError, match=fragment):
        vllm_plan(knobs)


def test_vllm_approximations_are_recorded() -> None:
    plan = vllm_plan(Knobs(policy="static", preemption="swap"), allow_approximate=True)
    m = by_knob(plan)
    assert m["policy"].status == "not_applied"
    assert "not applied" in m["policy"].note
    assert flag_value(plan.argv, "--scheduling-policy") == "fcfs"
    assert m["preemption"].status == "approximated"
    assert m["preemption"].note.startswith("approximated as recompute")


@pytest.mark.parametrize(
    ("knobs", "match"),
    [
        (Knobs(max_num_seqs=64, max_num_batched_tokens=32), "must be >= max_num_seqs"),
        (Knobs(chunked_prefill=False, max_num_batched_tokens=512, max_model_len=1024),
         "chunked_prefill off"),
    ],
)
def test_vllm_cross_knob_checks(knobs: Knobs, match: str) -> None:
    with pytest.raises(KnobError, match=match):
        vllm_plan(knobs)


def test_extra_args_override_a_mapped_flag() -> None:
    plan = vllm_plan(Knobs(extra_args=("--dtype", "float32")))
    assert plan.argv.count("--dtype") == 1
    assert flag_value(plan.argv, "--dtype") == "float32"
    m = by_knob(plan)["weights_dtype"]
    assert m.status == "not_applied" and "overridden by extra_args (--dtype)" in m.note


def test_extra_args_override_a_negated_flag() -> None:
    plan = vllm_plan(Knobs(extra_args=("--enable-chunked-prefill",), chunked_prefill=False))
    assert "--no-enable-chunked-prefill" not in plan.argv
    assert by_knob(plan)["chunked_prefill"].status == "not_applied"


def test_vllm_launcher_choice(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(vllm.PYTHON_ENV, "/opt/py")
    assert vllm.launcher() == ("/opt/py", "-m", vllm.API_SERVER_MODULE)
    assert vllm.launcher("/x/python")[0] == "/x/python"
    monkeypatch.delenv(vllm.PYTHON_ENV)
    monkeypatch.chdir(tmp_path)  # no .venvs here
    monkeypatch.setenv("PATH", str(tmp_path))
    assert vllm.launcher() == ("vllm", "serve")
    fake = tmp_path / "vllm"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert vllm.launcher() == ("vllm", "serve")
    adapter = vllm.VllmAdapter("m", port=1)
    argv = adapter.plan(Knobs()).argv
    assert argv[:3] == ("vllm", "serve", "m")  # `vllm serve` takes the model positionally


def test_vllm_attach_records_knobs_as_not_applied() -> None:
    plan = vllm.VllmAdapter("m").attach("http://127.0.0.1:9/", Knobs())
    assert not plan.launch and plan.argv == ()
    assert plan.base_url == "http://127.0.0.1:9"
    assert {m.status for m in plan.mapping} == {"not_applied"}


def test_a_free_port_is_chosen_when_none_is_given() -> None:
    plan = vllm.VllmAdapter("m", python="p").plan(Knobs())
    port = int(flag_value(plan.argv, "--port"))
    assert 0 < port < 65536 and plan.base_url.endswith(f":{port}")


# ---------------------------------------------------------------- TGI


def tgi_plan(knobs: Knobs, **kw: object) -> LaunchPlan:
    return tgi.TgiAdapter("models/tiny-llama", port=3000, runtime="native").plan(
        knobs, **kw)  # type: ignore[arg-type]


TGI_OK = Knobs(chunked_prefill=False, preemption="none")


def test_tgi_every_knob_value() -> None:
    knobs = dataclasses.replace(
        TGI_OK, max_num_seqs=16, max_num_batched_tokens=2048, weights_dtype="fp8",
        kv_cache_dtype="fp8", gpu_memory_utilization=0.85, prefix_caching=True,
        tensor_parallel_size=2, max_model_len=1024, extra_args=("--cuda-graphs", "0"),
    )
    plan = tgi_plan(knobs)
    argv = plan.argv
    assert argv[0] == tgi.LAUNCHER
    assert flag_value(argv, "--model-id") == "models/tiny-llama"
    assert flag_value(argv, "--hostname") == "127.0.0.1"
    assert flag_value(argv, "--usage-stats") == "off"
    assert flag_value(argv, "--max-concurrent-requests") == str(tgi.MAX_CONCURRENT_REQUESTS)
    assert flag_value(argv, "--max-batch-size") == "16"
    assert flag_value(argv, "--max-batch-prefill-tokens") == "2048"
    assert flag_value(argv, "--quantize") == "fp8" and "--dtype" not in argv
    assert flag_value(argv, "--kv-cache-dtype") == "fp8_e4m3fn"
    assert flag_value(argv, "--cuda-memory-fraction") == "0.85"
    assert flag_value(argv, "--num-shard") == "2"
    assert flag_value(argv, "--max-total-tokens") == "1024"
    assert flag_value(argv, "--max-input-tokens") == "1023"
    assert argv[-2:] == ("--cuda-graphs", "0")
    assert plan.env["PREFILL_CHUNKING"] == "0" and plan.env["PREFIX_CACHING"] == "1"
    assert plan.protocol == "tgi" and plan.version_paths == ("/info",)


@pytest.mark.parametrize(
    ("knobs", "match"),
    [
        (dataclasses.replace(TGI_OK, policy="priority"), "priorit"),
        (dataclasses.replace(TGI_OK, policy="static"), "static"),
        (dataclasses.replace(TGI_OK, preemption="recompute"), "never preempts"),
        (dataclasses.replace(TGI_OK, preemption="swap"), "never preempts"),
        (dataclasses.replace(TGI_OK, chunked_prefill=True), "--max-batch-size"),
    ],
)
def test_tgi_refusals(knobs: Knobs, match: str) -> None:
    with pytest.raises(KnobError, match=match):
        tgi_plan(knobs)


def test_tgi_default_knobs_need_approximation_and_say_how() -> None:
    plan = tgi_plan(Knobs(policy="priority"), allow_approximate=True)
    m = by_knob(plan)
    assert m["policy"].status == "not_applied"
    assert m["preemption"].status == "approximated"
    assert "none (reserve at admission)" in m["preemption"].note
    assert m["max_num_seqs"].status == "approximated"
    assert m["max_num_seqs"].flags == ("--max-batch-size 256",)
    assert plan.env["PREFILL_CHUNKING"] == "1"


def test_tgi_container_argv(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    plan = tgi.TgiAdapter(str(model), port=3001, runtime="podman", image="img:1").plan(TGI_OK)
    argv = plan.argv
    assert argv[:2] == ("podman", "run")
    assert flag_value(argv, "-p") == "127.0.0.1:3001:80"
    assert flag_value(argv, "-v") == f"{model}:/model:ro"
    assert "PREFILL_CHUNKING=0" in argv and "PREFIX_CACHING=0" in argv
    image_at = argv.index("img:1")
    assert argv[image_at + 1:image_at + 3] == ("--model-id", "/model")
    assert flag_value(argv, "--usage-stats") == "off"
    assert plan.env == {}  # the container gets its environment through -e
    assert plan.stop_argv == ("podman", "rm", "-f", "batchlab-tgi-3001")


# ---------------------------------------------------------------- TensorRT-LLM


def trt_plan(knobs: Knobs, **kw: object) -> LaunchPlan:
    return trtllm.TrtllmAdapter("nvidia/model-FP8", port=8001).plan(knobs, **kw)  # type: ignore[arg-type]


def trt_yaml(plan: LaunchPlan) -> dict[str, object]:
    loaded = yaml.safe_load(plan.config_files[trtllm.CONFIG_FILE])
    assert isinstance(loaded, dict)
    return loaded


def test_trtllm_argv_and_generated_yaml() -> None:
    knobs = Knobs(
        max_num_seqs=64, max_num_batched_tokens=4096, preemption="none", chunked_prefill=True,
        kv_cache_dtype="fp8", gpu_memory_utilization=0.85, prefix_caching=True,
        tensor_parallel_size=2, max_model_len=4096,
    )
    plan = trt_plan(knobs)
    assert plan.argv[:2] == ("trtllm-serve", "nvidia/model-FP8")
    assert flag_value(plan.argv, "--host") == "127.0.0.1"
    assert flag_value(plan.argv, "--backend") == "pytorch"
    config_arg = flag_value(plan.argv, "--extra_llm_api_options")
    assert config_arg == f"{CONFIG_DIR}/{trtllm.CONFIG_FILE}"
    assert plan.resolved_argv("/runs/a")[plan.argv.index(config_arg)] == (
        f"/runs/a/{trtllm.CONFIG_FILE}")
    assert trt_yaml(plan) == {
        "max_batch_size": 64,
        "max_num_tokens": 4096,
        "scheduler_config": {"capacity_scheduler_policy": "GUARANTEED_NO_EVICT"},
        "enable_chunked_prefill": True,
        "dtype": "bfloat16",
        "kv_cache_config": {"dtype": "fp8", "free_gpu_memory_fraction": 0.85,
                            "enable_block_reuse": True},
        "tensor_parallel_size": 2,
        "max_seq_len": 4096,
        "enable_iter_perf_stats": True,
        "return_perf_metrics": True,
        "perf_metrics_max_requests": 1000,
    }
    assert plan.telemetry.path == "/prometheus/metrics"


@pytest.mark.parametrize(
    ("knobs", "expected"),
    [
        (Knobs(), {"capacity_scheduler_policy": "MAX_UTILIZATION"}),
        (Knobs(policy="static", preemption="none"), {"capacity_scheduler_policy": "STATIC_BATCH"}),
        (Knobs(policy="priority", preemption="none"),
         {"waiting_queue_policy": "priority", "capacity_scheduler_policy": "GUARANTEED_NO_EVICT"}),
    ],
)
def test_trtllm_scheduler_config(knobs: Knobs, expected: dict[str, str]) -> None:
    assert trt_yaml(trt_plan(knobs))["scheduler_config"] == expected


@pytest.mark.parametrize(
    ("knobs", "match"),
    [
        (Knobs(weights_dtype="fp8"), "FP8"),
        (Knobs(preemption="swap"), "swap"),
        (Knobs(policy="static"), "STATIC_BATCH"),  # static never evicts: recompute conflicts
    ],
)
def test_trtllm_refusals(knobs: Knobs, match: str) -> None:
    with pytest.raises(KnobError, match=match):
        trt_plan(knobs)


def test_trtllm_swap_is_approximated_as_max_utilization() -> None:
    plan = trt_plan(Knobs(preemption="swap"), allow_approximate=True)
    assert trt_yaml(plan)["scheduler_config"] == {"capacity_scheduler_policy": "MAX_UTILIZATION"}
    m = by_knob(plan)["preemption"]
    assert m.status == "approximated"
    assert m.flags == ("scheduler_config.capacity_scheduler_policy: MAX_UTILIZATION",)


def test_trtllm_json_telemetry_option() -> None:
    plan = trtllm.TrtllmAdapter("m", port=1, json_telemetry=True).plan(Knobs())
    assert plan.telemetry.format == "trtllm_json" and plan.telemetry.path == "/metrics"


def test_config_tree_nests_dotted_keys() -> None:
    assert config_tree((("a.b", 1), ("a.c", 2), ("d", 3))) == {"a": {"b": 1, "c": 2}, "d": 3}


# ---------------------------------------------------------------- openai and reference


def test_openai_is_attach_only() -> None:
    adapter = openai.OpenAIAdapter("tiny", metric_map="llamacpp")
    with pytest.raises(KnobError, match="--url"):
        adapter.plan(Knobs())
    plan = adapter.attach("http://127.0.0.1:8003", Knobs())
    assert plan.telemetry.source("num_running") is not None
    assert plan.telemetry.source("num_running").names == ("llamacpp:requests_processing",)  # type: ignore[union-attr]
    assert {m.status for m in plan.mapping} == {"not_applied"}


def test_openai_metric_maps() -> None:
    assert openai.metric_spec("transformers").format == "none"
    assert openai.metric_spec(None).format == "none"
    spec = openai.metric_spec(openai.parse_metric_map("num_running=a,num_preemptions=b_total"))
    assert spec.source("num_running").names == ("a",)  # type: ignore[union-attr]
    assert spec.source("num_preemptions").kind == "counter"  # type: ignore[union-attr]
    with pytest.raises(KnobError, match="not a canonical signal"):
        openai.metric_spec({"running": "a"})
    with pytest.raises(KnobError, match="not a preset"):
        openai.metric_spec("sglang")
    with pytest.raises(KnobError, match="canonical=metric_name"):
        openai.parse_metric_map("num_running=a,broken")


def test_reference_attaches_with_vllm_metric_names() -> None:
    adapter = catalog.make_adapter("reference", model="llama-3.1-8b")
    plan = adapter.attach("http://127.0.0.1:8000", Knobs())
    assert plan.engine == "reference"
    assert plan.telemetry == vllm.TELEMETRY


def test_served_reference_flags() -> None:
    adapter = catalog.make_adapter("reference", model="llama-3.1-8b", gpu="a100-80gb", port=8100,
                                   executable="/py")
    knobs = Knobs(max_num_seqs=32, policy="priority", preemption="none", chunked_prefill=False,
                  prefix_caching=True, tensor_parallel_size=2, max_model_len=4096,
                  extra_args=("--block-size", "32"))
    argv = adapter.plan(knobs).argv
    assert argv[:5] == ("/py", "-m", "harness.cli", "serve", "reference")
    assert flag_value(argv, "--model") == "llama-3.1-8b"
    assert flag_value(argv, "--gpu") == "a100-80gb"
    assert flag_value(argv, "--port") == "8100"
    assert flag_value(argv, "--max-num-seqs") == "32"
    assert flag_value(argv, "--policy") == "priority"
    assert flag_value(argv, "--admission") == "reserve" and "--preemption" not in argv
    assert "--no-chunked-prefill" in argv and "--prefix-caching" in argv
    assert flag_value(argv, "--tp") == "2" and flag_value(argv, "--max-model-len") == "4096"
    assert argv[-2:] == ("--block-size", "32")
    swap = adapter.plan(Knobs(preemption="swap")).argv
    assert flag_value(swap, "--preemption") == "swap" and "--admission" not in swap


def test_served_reference_profile_and_own_settings() -> None:
    adapter = catalog.make_adapter(
        "reference", model="llama-3.1-8b", profile="vllm-h100-sxm",
        reference=ReferenceKnobs(admission="reserve", num_gpu_blocks=900, block_size=32))
    argv = adapter.plan(Knobs(max_num_seqs=8)).argv
    assert flag_value(argv, "--profile") == "vllm-h100-sxm"
    assert flag_value(argv, "--admission") == "reserve"
    assert flag_value(argv, "--num-gpu-blocks") == "900"
    assert flag_value(argv, "--block-size") == "32"
    assert "--swap-space-gib" not in argv
    assert argv.index("--profile") < argv.index("--max-num-seqs")  # knobs' extra_args last
    with pytest.raises(KnobError, match="num_gpu_blocks"):
        catalog.make_adapter("reference", model="llama-3.1-8b",
                             reference=ReferenceKnobs(num_gpu_blocks=0)).plan(Knobs())


@pytest.mark.parametrize("engine", ["vllm", "tgi", "trtllm", "llamacpp", "openai"])
def test_a_profile_or_reference_setting_for_another_engine_is_refused(engine: str) -> None:
    with pytest.raises(ValueError, match="reference engine only"):
        catalog.make_adapter(engine, model="m", profile="vllm-h100-sxm")
    with pytest.raises(ValueError, match="reference engine only"):
        catalog.make_adapter(engine, model="m", reference=ReferenceKnobs(admission="reserve"))
    catalog.make_adapter(engine, model="m", reference=ReferenceKnobs())  # nothing set: fine


def test_make_adapter_rejects_unknown_engines() -> None:
    with pytest.raises(ValueError, match="unknown engine"):
        catalog.make_adapter("sglang", model="m")


# ---------------------------------------------------------------- plan description, docs


def test_describe_shows_argv_config_and_mapping() -> None:
    text = trt_plan(Knobs(preemption="none")).describe()
    assert "argv:\n  trtllm-serve nvidia/model-FP8 --host 127.0.0.1" in text
    assert f"config file {CONFIG_DIR}/{trtllm.CONFIG_FILE}:" in text
    assert "capacity_scheduler_policy: GUARANTEED_NO_EVICT" in text
    assert "knob mapping:" in text and "max_num_seqs" in text


def test_mapping_text_covers_each_engine() -> None:
    text = catalog.mapping_text()
    for name in ("vllm", "tgi", "trtllm", "openai", "reference"):
        assert f"== {name}" in text
    assert "policy=static" in text and "REFUSED at plan time" in text


def test_docs_engines_md_is_up_to_date() -> None:
    doc = REPO / "docs" / "engines.md"
    assert doc.read_text() == catalog.mapping_markdown(), (
        "docs/engines.md is stale: run `batchlab engines --markdown > docs/engines.md`"
    )
