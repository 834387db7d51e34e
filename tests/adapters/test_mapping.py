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
from harness.cli import main

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


def test_vllm_unset_token_budget_with_chunking_off_is_not_batchlabs_8192() -> None:
    """Chunking off, vLLM needs max_num_batched_tokens >= max_model_len; unset, it uses
    max(max_model_len, its usual budget)."""
    plan = vllm_plan(Knobs.from_mapping({"chunked_prefill": False}))
    assert "--max-num-batched-tokens" not in plan.argv  # vLLM's own: at least the context
    m = by_knob(plan)["max_num_batched_tokens"]
    assert m.status == "default" and m.value is None and "context length" in m.note
    plan = vllm_plan(Knobs.from_mapping({"chunked_prefill": False, "max_model_len": 32768}))
    assert flag_value(plan.argv, "--max-num-batched-tokens") == "32768"
    m = by_knob(plan)["max_num_batched_tokens"]
    assert m.status == "applied" and m.value == 32768 and "max_model_len" in m.note
    # a short context: the usual budget, not one below max_num_seqs (vLLM would start)
    plan = vllm_plan(Knobs.from_mapping({"chunked_prefill": False, "max_model_len": 128}))
    assert flag_value(plan.argv, "--max-num-batched-tokens") == "8192"
    assert not plan.notes
    # a budget given without a context length batchlab could check it against: said so
    plan = vllm_plan(Knobs.from_mapping({"chunked_prefill": False,
                                         "max_num_batched_tokens": 4096}))
    assert flag_value(plan.argv, "--max-num-batched-tokens") == "4096"
    assert any("vLLM refuses to start unless the model's context length is at most 4096"
               in n for n in plan.notes)
    with pytest.raises(KnobError, match="max_model_len"):  # given below it: still refused
        vllm_plan(Knobs.from_mapping({"chunked_prefill": False, "max_model_len": 32768,
                                      "max_num_batched_tokens": 8192}))
    plan = vllm_plan(Knobs.from_mapping({"max_model_len": 32768}))  # chunking on: the pin
    assert flag_value(plan.argv, "--max-num-batched-tokens") == "8192"


@pytest.mark.parametrize(
    ("given", "fragment", "status"),
    [
        ({"kv_cache_dtype": "bf16", "weights_dtype": "bf16"}, "--kv-cache-dtype auto",
         "applied"),
        ({"kv_cache_dtype": "bf16", "weights_dtype": "fp8"}, "--kv-cache-dtype auto", "applied"),
        ({"kv_cache_dtype": "fp8"}, "--kv-cache-dtype fp8", "applied"),
    ],
)
def test_vllm_kv_dtype(given: dict[str, object], fragment: str, status: str) -> None:
    plan = vllm_plan(Knobs.from_mapping(given))
    m = by_knob(plan)["kv_cache_dtype"]
    assert m.flags == (fragment,) and m.status == status
    if given.get("weights_dtype"):
        assert flag_value(plan.argv, "--dtype") == "bfloat16"  # what makes auto bf16


def test_vllm_kv_bf16_without_a_model_dtype_is_not_claimed() -> None:
    """auto is the model dtype: with weights_dtype unset, the checkpoint's, maybe float16."""
    with pytest.raises(KnobError, match=r"kv_cache_dtype='bf16'.*checkpoint"):
        vllm_plan(Knobs.from_mapping({"kv_cache_dtype": "bf16"}))
    plan = vllm_plan(Knobs.from_mapping({"kv_cache_dtype": "bf16"}), allow_approximate=True)
    m = by_knob(plan)["kv_cache_dtype"]
    assert m.status == "approximated" and "auto (the checkpoint's dtype)" in m.note
    assert flag_value(plan.argv, "--kv-cache-dtype") == "auto" and "--dtype" not in plan.argv
    unset = by_knob(vllm_plan(Knobs.from_mapping({})))["kv_cache_dtype"]
    assert unset.status == "default" and unset.value == "auto"


VLLM_GIVEN = Knobs(max_num_seqs=64, weights_dtype="fp8", tensor_parallel_size=2,
                   chunked_prefill=False, max_num_batched_tokens=8192, max_model_len=8192)


@pytest.mark.parametrize(
    ("extra", "knob", "gone"),
    [
        (("--max_num_seqs=64",), "max_num_seqs", "--max-num-seqs"),  # vLLM reads _ as -
        (("--max_num_seqs", "64"), "max_num_seqs", "--max-num-seqs"),
        (("--max_num_seqs", "064"), "max_num_seqs", "--max-num-seqs"),  # int("064") is 64
        (("-q", "fp8"), "weights_dtype", "--dtype"),  # -q is --quantization
        (("--quantization", "fp8"), "weights_dtype", "--dtype"),
        (("-tp", "2"), "tensor_parallel_size", "--tensor-parallel-size"),
        (("--no-enable_chunked_prefill",), "chunked_prefill", "--no-enable-chunked-prefill"),
    ],
)
def test_extra_args_override_a_mapped_flag_in_any_spelling(
        extra: tuple[str, ...], knob: str, gone: str) -> None:
    """An extra arg giving a knob's own value, however written, replaces the knob's flags."""
    plan = vllm_plan(dataclasses.replace(VLLM_GIVEN, extra_args=extra))
    m = by_knob(plan)[knob]
    assert m.status == "not_applied" and m.flags == ()
    assert m.note == f"overridden by extra_args ({extra[0].split('=')[0]})"
    assert m.value == getattr(VLLM_GIVEN, knob)
    assert gone not in plan.argv
    assert plan.argv[-len(extra):] == extra


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (("--max_num_seqs=128",),
         "max_num_seqs=64 sets --max-num-seqs 64, but extra_args set --max_num_seqs=128"),
        (("--max-num-seqs", "128"),
         "max_num_seqs=64 sets --max-num-seqs 64, but extra_args set --max-num-seqs 128"),
        (("--max-num-seqs", "64", "--max-num-seqs", "128"),  # argparse: the last one wins
         "max_num_seqs=64 sets --max-num-seqs 64, but extra_args set --max-num-seqs 128"),
        (("-q", "awq"), "weights_dtype='fp8' sets --quantization fp8, but extra_args set -q awq"),
        (("-tp", "4"),
         "tensor_parallel_size=2 sets --tensor-parallel-size 2, but extra_args set -tp 4"),
        (("--enable_chunked_prefill",), "chunked_prefill=False sets --no-enable-chunked-prefill, "
                                        "but extra_args set --enable_chunked_prefill"),
    ],
)
def test_extra_args_against_a_given_knob_are_refused(extra: tuple[str, ...], said: str) -> None:
    """The defect: max_num_seqs=64 with extra_args --max-num-seqs 128 ran vLLM with 128 while
    the run's knobs said 64 (recorded only as overridden), where --engine-env against a given
    knob was refused."""
    with pytest.raises(KnobError) as err:
        vllm_plan(dataclasses.replace(VLLM_GIVEN, extra_args=extra))
    assert str(err.value) == (
        f"vllm: a knob and extra_args ask for different settings: {said}. Drop one of them (a "
        "knob left unset lets extra_args decide, and is recorded as overridden).")


def test_extra_args_setting_a_flag_the_knob_leaves_out_are_refused() -> None:
    """-q fp8 quantizes the weights that weights_dtype=bf16 asks to keep in bf16."""
    with pytest.raises(KnobError) as err:
        vllm_plan(Knobs.from_mapping({"weights_dtype": "bf16", "extra_args": ["-q", "fp8"]}))
    assert ("weights_dtype='bf16' does not set -q, but extra_args set -q fp8, as another "
            "weights_dtype would"
            in str(err.value))


def test_every_contradiction_is_named_at_once() -> None:
    knobs = Knobs.from_mapping({"max_num_seqs": 8, "max_model_len": 512, "extra_args": [
        "--max-model-len=1024", "--enforce-eager", "--max-num-seqs", "16"]})
    with pytest.raises(KnobError) as err:
        vllm_plan(knobs)
    assert ("max_num_seqs=8 sets --max-num-seqs 8, but extra_args set --max-num-seqs 16; "
            "max_model_len=512 sets --max-model-len 512, but extra_args set "
            "--max-model-len=1024. Drop one of them") in str(err.value)


def test_extra_args_against_a_knob_and_engine_env_are_both_named() -> None:
    adapter = tgi.TgiAdapter("m", port=3000, runtime="native", env={"PREFIX_CACHING": "1"})
    knobs = Knobs.from_mapping({"prefix_caching": False, "chunked_prefill": False,
                                "max_num_seqs": 8, "extra_args": ["--max-batch-size", "9"]})
    with pytest.raises(KnobError) as err:
        adapter.plan(knobs)
    assert str(err.value) == (
        "tgi: a knob and --engine-env ask for different settings: prefix_caching=False sets "
        "PREFIX_CACHING=0, but --engine-env sets PREFIX_CACHING=1. Drop one of them (a knob "
        "left unset lets --engine-env decide, and is recorded as overridden). tgi: a knob and "
        "extra_args ask for different settings: max_num_seqs=8 sets --max-batch-size 8, but "
        "extra_args set --max-batch-size 9. Drop one of them (a knob left unset lets "
        "extra_args decide, and is recorded as overridden).")


def test_tgi_extra_args_with_the_knobs_value_are_accepted_and_others_refused() -> None:
    """0.50 is the 0.5 the memory conversion passes; --quantize fp8 is no bf16 weights."""
    knobs = Knobs.from_mapping({"gpu_memory_utilization": 0.45,
                                "extra_args": ["--cuda-memory-fraction", "0.50"]})
    m = by_knob(tgi.TgiAdapter("m", port=3000, runtime="native").plan(knobs))
    assert m["gpu_memory_utilization"].status == "not_applied"
    assert m["gpu_memory_utilization"].note == "overridden by extra_args (--cuda-memory-fraction)"
    with pytest.raises(KnobError, match=r"weights_dtype='bf16' does not set --quantize, but "
                                        r"extra_args set --quantize=fp8, as another weights_dtype "
                                        r"would\. Drop one of them"):
        tgi.TgiAdapter("m", port=3000, runtime="native").plan(Knobs.from_mapping(
            {"weights_dtype": "bf16", "extra_args": ["--quantize=fp8"]}))


def test_the_command_line_refuses_extra_args_against_a_knob_before_anything_starts(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main([
        "replay", "--launch", "--engine", "vllm", "--engine-executable", "/venv/python",
        "--model-path", str(tmp_path), "--model", "tiny", "--max-num-seqs", "64",
        "--extra-arg=--max-num-seqs", "--extra-arg=128",
        "--trace", str(REPO / "harness" / "data" / "azure_conv_excerpt.csv"), "--limit", "4",
        "--dry-run", "--out", str(tmp_path / "o"),
    ])
    err = capsys.readouterr().err
    assert code == 2
    assert ("max_num_seqs=64 sets --max-num-seqs 64, but extra_args set --max-num-seqs 128"
            in err)


def test_extra_args_setting_an_unset_knob_are_not_recorded_as_its_default() -> None:
    plan = vllm_plan(Knobs.from_mapping({"extra_args": ["--kv-cache-dtype", "fp8"]}))
    m = by_knob(plan)["kv_cache_dtype"]
    assert m.status == "not_applied" and m.value is None
    assert m.note == "overridden by extra_args (--kv-cache-dtype)"


def test_extra_args_override_a_mapped_flag() -> None:
    plan = vllm_plan(Knobs.from_mapping({"extra_args": ["--dtype", "float32"]}))
    assert plan.argv.count("--dtype") == 1
    assert flag_value(plan.argv, "--dtype") == "float32"
    m = by_knob(plan)["weights_dtype"]
    assert m.status == "not_applied" and "overridden by extra_args (--dtype)" in m.note


def test_extra_args_override_a_negated_flag() -> None:
    plan = vllm_plan(Knobs(extra_args=("--no-enable-chunked-prefill",), chunked_prefill=False))
    assert plan.argv.count("--no-enable-chunked-prefill") == 1
    assert by_knob(plan)["chunked_prefill"].status == "not_applied"
    unset = vllm_plan(Knobs.from_mapping({"extra_args": ["--enable-chunked-prefill"]}))
    assert by_knob(unset)["chunked_prefill"].status == "not_applied"


def test_vllm_plan_says_which_launcher_and_why(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    monkeypatch.delenv(vllm.PYTHON_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no vllm command
    monkeypatch.chdir(tmp_path)
    venv_python = tmp_path / vllm.DEFAULT_VENV_PYTHON
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text("")
    plan = vllm.VllmAdapter("m", port=1).plan(Knobs())
    assert plan.argv[0] == vllm.DEFAULT_VENV_PYTHON  # the choice itself is unchanged
    assert plan.launcher.startswith(f"{vllm.DEFAULT_VENV_PYTHON} -m {vllm.API_SERVER_MODULE}")
    assert "the CPU build `make engines` installs" in plan.launcher
    assert f"launcher: {plan.launcher}\n" in plan.describe()
    monkeypatch.setenv(vllm.PYTHON_ENV, "/opt/py")
    assert f"${vllm.PYTHON_ENV}" in vllm.VllmAdapter("m", port=1).plan(Knobs()).launcher
    assert "given" in vllm.VllmAdapter("m", port=1, python="/x").plan(Knobs()).launcher


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
    assert flag_value(argv, "--cuda-memory-fraction") == str(0.85 / 0.9)
    assert plan.env["TGI_WIGGLE_ROOM"] == "0.9"
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


def test_tgi_preemption_default_is_none() -> None:
    m = by_knob(tgi_plan(Knobs.from_mapping({})))["preemption"]
    assert m.status == "default" and m.value == "none"


def test_tgi_refuses_a_prefill_budget_below_the_input_length_without_chunking() -> None:
    """TGI's router refuses to start unless max_batch_prefill_tokens >= max_input_tokens."""
    knobs = Knobs.from_mapping({"chunked_prefill": False, "max_model_len": 32768,
                                "max_num_batched_tokens": 8192})
    with pytest.raises(KnobError) as err:
        tgi_plan(knobs)
    said = str(err.value)
    assert "max_num_batched_tokens (8192" in said and "max_model_len - 1 (32767" in said
    assert "--max-batch-prefill-tokens" in said and "--max-input-tokens" in said
    tgi_plan(Knobs.from_mapping({"chunked_prefill": False, "max_model_len": 32768,
                                 "max_num_batched_tokens": 32767}))
    tgi_plan(Knobs.from_mapping({"max_model_len": 32768, "max_num_batched_tokens": 8192}))


def test_tgi_unset_prefill_budget_without_chunking_covers_the_input() -> None:
    plan = tgi_plan(Knobs.from_mapping({"chunked_prefill": False, "max_model_len": 32768}))
    assert flag_value(plan.argv, "--max-batch-prefill-tokens") == "32767"
    assert flag_value(plan.argv, "--max-input-tokens") == "32767"
    m = by_knob(plan)["max_num_batched_tokens"]
    assert m.status == "applied" and m.value == 32767 and "max_input_tokens" in m.note
    unset = by_knob(tgi_plan(Knobs.from_mapping({"max_model_len": 32768})))
    assert unset["max_num_batched_tokens"].status == "default"  # chunking on: TGI's own


@pytest.mark.parametrize(("utilization", "fraction"), [(0.9, "1.0"), (0.45, "0.5"),
                                                       (0.85, str(0.85 / 0.9))])
def test_tgi_memory_fraction_gives_vllms_kv_budget(utilization: float, fraction: str) -> None:
    """KV = free - (1 - f x 0.9) x total; f = u / 0.9 makes it u x total - weights - act."""
    plan = tgi_plan(Knobs.from_mapping({"gpu_memory_utilization": utilization}))
    assert flag_value(plan.argv, "--cuda-memory-fraction") == fraction
    assert plan.env["TGI_WIGGLE_ROOM"] == "0.9"
    m = by_knob(plan)["gpu_memory_utilization"]
    assert m.status == "applied" and "/ 0.9" in m.note
    assert m.flags == (f"--cuda-memory-fraction {fraction}", "TGI_WIGGLE_ROOM=0.9")


def test_tgi_memory_above_what_it_can_give_is_refused_or_approximated() -> None:
    knobs = Knobs.from_mapping({"gpu_memory_utilization": 0.95})
    with pytest.raises(KnobError, match=r"gpu_memory_utilization=0.95"):
        tgi_plan(knobs)
    plan = tgi_plan(knobs, allow_approximate=True)
    assert flag_value(plan.argv, "--cuda-memory-fraction") == "1.0"
    m = by_knob(plan)["gpu_memory_utilization"]
    assert m.status == "approximated" and m.note.startswith("approximated as 0.9")


def test_tgi_refuses_another_wiggle_room_than_the_conversion_assumes() -> None:
    adapter = tgi.TgiAdapter("m", port=3000, runtime="native", env={"TGI_WIGGLE_ROOM": "0.8"})
    with pytest.raises(KnobError, match="TGI_WIGGLE_ROOM"):
        adapter.plan(Knobs.from_mapping({"gpu_memory_utilization": 0.8}))
    adapter.plan(Knobs.from_mapping({}))  # no conversion: the user's value stands


@pytest.mark.parametrize(
    ("given", "outcome"),
    [
        ({"kv_cache_dtype": "bf16", "weights_dtype": "bf16"}, "applied"),
        ({"kv_cache_dtype": "bf16"}, "refused"),
        ({"kv_cache_dtype": "bf16", "weights_dtype": "fp8"}, "refused"),
    ],
)
def test_tgi_kv_bf16_is_only_claimed_when_the_model_dtype_is_bf16(
        given: dict[str, object], outcome: str) -> None:
    knobs = Knobs.from_mapping(given)
    if outcome == "refused":
        with pytest.raises(KnobError, match="fp8_e4m3fn or fp8_e5m2"):
            tgi_plan(knobs)
        m = by_knob(tgi_plan(knobs, allow_approximate=True))["kv_cache_dtype"]
        assert m.status == "approximated" and "model dtype" in m.note
    else:
        plan = tgi_plan(knobs)
        assert flag_value(plan.argv, "--dtype") == "bfloat16"
        assert by_knob(plan)["kv_cache_dtype"].status == "applied"
    assert "--kv-cache-dtype" not in tgi_plan(knobs, allow_approximate=True).argv


def test_tgi_container_argv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    model = tmp_path / "model"
    model.mkdir()
    plan = tgi.TgiAdapter(str(model), port=3001, runtime="podman", image="img:1").plan(TGI_OK)
    argv = plan.argv
    assert argv[:2] == ("podman", "run")
    assert flag_value(argv, "--gpus") == "all"
    assert flag_value(argv, "-p") == "127.0.0.1:3001:80"
    assert flag_value(argv, "-v") == f"{model}:/model:ro"
    image_at = argv.index("img:1")
    assert argv[image_at + 1:image_at + 3] == ("--model-id", "/model")
    assert flag_value(argv, "--usage-stats") == "off"
    assert plan.stop_argv == ("podman", "rm", "-f", "batchlab-tgi-3001")


def test_tgi_container_environment_is_passed_by_name_only() -> None:
    """`-e K=V` would show the value to any local user through ps: the runtime client reads
    it from its own environment instead."""
    adapter = tgi.TgiAdapter("m", port=3002, runtime="docker", env={"HF_TOKEN": "hf_SECRET1"})
    plan = adapter.plan(TGI_OK)
    assert not any("hf_SECRET1" in a for a in plan.argv)
    env_names = [plan.argv[i + 1] for i, a in enumerate(plan.argv) if a == "-e"]
    assert env_names == ["HF_HUB_OFFLINE", "HF_TOKEN", "PREFILL_CHUNKING", "PREFIX_CACHING",
                         "TGI_WIGGLE_ROOM"]
    assert plan.env["HF_TOKEN"] == "hf_SECRET1" and plan.env["PREFILL_CHUNKING"] == "0"


@pytest.mark.parametrize(
    ("runtime", "devices", "expected"),
    [
        ("docker", "0,1", ("--gpus", '"device=0,1"')),
        ("docker", "3", ("--gpus", '"device=3"')),
        ("/usr/bin/podman", "2, 3", ("--device", "nvidia.com/gpu=2", "--device",
                                     "nvidia.com/gpu=3")),
        ("docker", None, ("--gpus", "all")),
        ("docker", "", ()),
    ],
)
def test_tgi_container_gpus_follow_cuda_visible_devices(
        runtime: str, devices: str | None, expected: tuple[str, ...]) -> None:
    assert tgi.gpu_flags(runtime, devices) == expected


def test_tgi_container_takes_the_gpus_cuda_visible_devices_names(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    plan = tgi.TgiAdapter("m", port=3003, runtime="docker").plan(TGI_OK)
    assert flag_value(plan.argv, "--gpus") == '"device=5"' and "all" not in plan.argv
    # the engine's own environment wins; inside, the container numbers its GPUs from 0
    plan = tgi.TgiAdapter("m", port=3003, runtime="docker",
                          env={"CUDA_VISIBLE_DEVICES": "0,1"}).plan(TGI_OK)
    assert flag_value(plan.argv, "--gpus") == '"device=0,1"'
    assert "CUDA_VISIBLE_DEVICES" not in plan.argv and "CUDA_VISIBLE_DEVICES" not in plan.env
    assert any("CUDA_VISIBLE_DEVICES=0,1" in n for n in plan.notes)


# ---------------------------------------------------------------- TensorRT-LLM


def trt_plan(knobs: Knobs, **kw: object) -> LaunchPlan:
    return trtllm.TrtllmAdapter("nvidia/model-FP8", port=8001).plan(knobs, **kw)  # type: ignore[arg-type]


def trt_knobs(**given: object) -> Knobs:
    """Only ``given`` set: TensorRT-LLM cannot honour a full default configuration (its memory
    fraction and KV dtype mean something else there)."""
    return Knobs.from_mapping(given)


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
    plan = trt_plan(knobs, allow_approximate=True)  # gpu_memory_utilization: see below
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
        (trt_knobs(preemption="recompute"), {"capacity_scheduler_policy": "MAX_UTILIZATION"}),
        (trt_knobs(policy="static", preemption="none"),
         {"capacity_scheduler_policy": "STATIC_BATCH"}),
        (trt_knobs(policy="priority", preemption="none"),
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
    plan = trtllm.TrtllmAdapter("m", port=1, json_telemetry=True).plan(trt_knobs())
    assert plan.telemetry.format == "trtllm_json" and plan.telemetry.path == "/metrics"
    # with return_perf_metrics on, the Prometheus collector drains the JSON endpoint's queue
    config = trt_yaml(plan)
    assert config["enable_iter_perf_stats"] is True and config["return_perf_metrics"] is False
    prometheus = trtllm.TrtllmAdapter("m", port=1).plan(trt_knobs())
    assert trt_yaml(prometheus)["return_perf_metrics"] is True


def test_trtllm_refuses_prompts_longer_than_its_token_budget_without_chunking() -> None:
    """Without chunked prefill (TensorRT-LLM's default) a prompt above max_num_tokens fails."""
    for given in ({"max_model_len": 32768, "max_num_batched_tokens": 8192},
                  {"max_model_len": 32768, "max_num_batched_tokens": 8192,
                   "chunked_prefill": False}):
        with pytest.raises(KnobError) as err:
            trt_plan(trt_knobs(**given))
        assert "max_num_batched_tokens (8192" in str(err.value)
        assert "max_model_len (32768" in str(err.value)
    trt_plan(trt_knobs(max_model_len=32768, max_num_batched_tokens=8192, chunked_prefill=True))


def test_trtllm_unset_token_budget_covers_a_long_context_without_chunking() -> None:
    plan = trt_plan(trt_knobs(max_model_len=32768))
    assert trt_yaml(plan)["max_num_tokens"] == 32768
    m = by_knob(plan)["max_num_batched_tokens"]
    assert m.status == "applied" and m.value == 32768 and "max_model_len" in m.note
    plan = trt_plan(trt_knobs(max_model_len=4096))  # within the default: nothing passed
    assert "max_num_tokens" not in trt_yaml(plan)
    m = by_knob(plan)["max_num_batched_tokens"]
    assert m.status == "default" and m.value == 8192  # TensorRT-LLM's own, known
    plan = trt_plan(trt_knobs(max_model_len=32768, chunked_prefill=True))
    assert "max_num_tokens" not in trt_yaml(plan)


def test_trtllm_memory_fraction_is_not_vllms() -> None:
    with pytest.raises(KnobError, match=r"gpu_memory_utilization=0.85.*free after"):
        trt_plan(trt_knobs(gpu_memory_utilization=0.85))
    plan = trt_plan(trt_knobs(gpu_memory_utilization=0.85), allow_approximate=True)
    assert trt_yaml(plan)["kv_cache_config"] == {"free_gpu_memory_fraction": 0.85}
    m = by_knob(plan)["gpu_memory_utilization"]
    assert m.status == "approximated" and "of free memory" in m.note


def test_trtllm_kv_bf16_is_not_enforced_and_says_so() -> None:
    """auto takes the checkpoint's KV quantization: an FP8 ModelOpt checkpoint runs FP8 KV."""
    with pytest.raises(KnobError, match=r"kv_cache_dtype='bf16'.*checkpoint"):
        trt_plan(trt_knobs(kv_cache_dtype="bf16"))
    plan = trt_plan(trt_knobs(kv_cache_dtype="bf16"), allow_approximate=True)
    assert trt_yaml(plan)["kv_cache_config"] == {"dtype": "auto"}
    assert by_knob(plan)["kv_cache_dtype"].status == "approximated"
    unset = by_knob(trt_plan(trt_knobs()))["kv_cache_dtype"]
    assert unset.status == "default" and unset.value == "auto"


@pytest.mark.parametrize(
    ("extra", "knob", "key"),
    [
        (("--max_batch_size", "64"), "max_num_seqs", "max_batch_size"),
        (("--max-batch-size=64",), "max_num_seqs", "max_batch_size"),
        (("--tp_size", "2"), "tensor_parallel_size", "tensor_parallel_size"),
        (("--free_gpu_memory_fraction", "0.90"), "gpu_memory_utilization", "kv_cache_config"),
        (("--max_num_tokens", "8192"), "max_num_batched_tokens", "max_num_tokens"),
    ],
)
def test_trtllm_cli_flags_in_extra_args_replace_the_yaml_keys(
        extra: tuple[str, ...], knob: str, key: str) -> None:
    knobs = trt_knobs(max_num_seqs=64, tensor_parallel_size=2, gpu_memory_utilization=0.9,
                      max_num_batched_tokens=8192, extra_args=list(extra))
    plan = trt_plan(knobs, allow_approximate=True)
    assert key not in trt_yaml(plan)  # one value reaches the engine: the command line's
    assert plan.argv[-len(extra):] == extra
    m = by_knob(plan)[knob]
    assert m.status == "not_applied" and m.note.startswith("overridden by extra_args")


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (("--max_batch_size", "512"),
         "max_num_seqs=64 sets max_batch_size: 64, but extra_args set --max_batch_size 512"),
        (("--tp_size=4",),
         "tensor_parallel_size=2 sets tensor_parallel_size: 2, but extra_args set --tp_size=4"),
        (("--enable_chunked_prefill",), "chunked_prefill=False sets enable_chunked_prefill: "
                                        "false, but extra_args set --enable_chunked_prefill"),
    ],
)
def test_trtllm_cli_flags_against_a_given_knob_are_refused(
        extra: tuple[str, ...], said: str) -> None:
    knobs = trt_knobs(max_num_seqs=64, tensor_parallel_size=2, chunked_prefill=False,
                      extra_args=list(extra))
    with pytest.raises(KnobError) as err:
        trt_plan(knobs)
    assert f"trtllm: a knob and extra_args ask for different settings: {said}." in str(err.value)
    assert trt_plan(trt_knobs(extra_args=list(extra))).mapping  # unset: extra_args decide


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
    text = trt_plan(trt_knobs(preemption="none")).describe()
    assert ('argv (JSON, one item a line):\n  [\n    "trtllm-serve",\n'
            '    "nvidia/model-FP8",\n    "--host",\n    "127.0.0.1",\n') in text
    assert f"config file {CONFIG_DIR}/{trtllm.CONFIG_FILE}:" in text
    assert "capacity_scheduler_policy: GUARANTEED_NO_EVICT" in text
    assert "knob mapping:" in text and "max_num_seqs" in text


def test_mapping_text_covers_each_engine() -> None:
    text = catalog.mapping_text()
    for name in ("vllm", "tgi", "trtllm", "openai", "reference"):
        assert f"== {name}" in text
    assert "policy=static" in text and "REFUSED at plan time" in text


def section(text: str, engine: str) -> str:
    return text.split(f"== {engine}:")[1].split("\n== ")[0]


def test_mapping_text_says_what_an_unset_token_budget_follows() -> None:
    text = catalog.mapping_text()
    vllm_text = section(text, "vllm")
    assert ("max_num_batched_tokens unset (chunked_prefill=false, max_model_len=unset) -> "
            "(no flag)") in vllm_text
    assert ("max_num_batched_tokens unset (chunked_prefill=false, max_model_len=L) -> "
            "--max-num-batched-tokens 'max(L, 8192)'") in vllm_text
    assert ("max_num_batched_tokens unset (chunked_prefill=false, max_model_len=L) -> "
            "--max-batch-prefill-tokens L-1") in section(text, "tgi")
    trt = section(text, "trtllm")
    assert "the engine's own default: 8192" in trt
    assert ("max_num_batched_tokens unset (chunked_prefill=unset, max_model_len=L) -> "
            "max_num_tokens: L") in trt
    assert "preemption unset" in section(text, "tgi")
    assert ("(the engine's own default: none (huggingface/text-generation-inference "
            "backends/v3/src/queue.rs, router/src/infer/mod.rs (KV reserved at admission) "
            "@db931fcf, read 2026-11-30))") in section(text, "tgi")


def test_rows_show_each_case_of_a_dependency_only_when_they_differ() -> None:
    rows = {r.when: r for r in catalog.rows(catalog.INFO["vllm"])}
    assert rows["kv_cache_dtype=bf16 (weights_dtype=unset)"].outcome == "refused"
    assert rows["kv_cache_dtype=bf16 (weights_dtype=bf16)"].outcome == "applied"
    assert rows["kv_cache_dtype=fp8"].settings == "--kv-cache-dtype fp8"  # the same for all


def test_docs_engines_md_is_up_to_date() -> None:
    doc = REPO / "docs" / "engines.md"
    assert doc.read_text() == catalog.mapping_markdown(), (
        "docs/engines.md is stale: run `batchlab engines --markdown > docs/engines.md`"
    )
