"""The llamacpp adapter: its mapping table, launch argv, attach plan and self-reported knobs.

The launch test starts the fake llama-server (``fake_llamacpp_server.py``) through the adapter,
with the argv it builds; the real binary is in ``test_llamacpp_real.py``.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from adapters import catalog, llamacpp
from adapters.base import KnobError, Knobs
from harness.live import run as live
from harness.target import RunOptions, TargetSpec
from harness.traces import TraceOptions, load_trace

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "tests" / "adapters" / "fake_llamacpp_server.py"


def plan_for(knobs: Knobs, tmp_path: Path, *, approximate: bool = False) -> list[str]:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    adapter = llamacpp.LlamaCppAdapter(model=str(gguf), served_model_name="tiny", port=8123,
                                       executable="/opt/llama-server")
    return list(adapter.plan(knobs, allow_approximate=approximate).argv)


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_every_mapped_knob_reaches_llama_server(tmp_path: Path) -> None:
    knobs = replace(Knobs(), max_num_seqs=8, max_num_batched_tokens=512, max_model_len=1024,
                    prefix_caching=False, kv_cache_dtype="bf16", preemption="none",
                    weights_dtype="bf16", gpu_memory_utilization=0.9)
    argv = plan_for(knobs, tmp_path, approximate=True)  # weights and memory: not applied
    assert argv[:3] == ["/opt/llama-server", "-m", str(tmp_path / "m.gguf")]
    assert flag(argv, "--alias") == "tiny" and flag(argv, "--host") == "127.0.0.1"
    assert flag(argv, "--port") == "8123" and "--metrics" in argv
    assert flag(argv, "-np") == "8"
    assert flag(argv, "-c") == str(8 * 1024)  # the total context: 8 slots of 1024 tokens
    assert flag(argv, "-b") == "512" and flag(argv, "-ub") == "512"
    assert "-cb" in argv and "-nocb" not in argv
    assert "--no-cache-prompt" in argv and flag(argv, "--cache-ram") == "0"
    assert flag(argv, "-ctk") == "bf16" and flag(argv, "-ctv") == "bf16"


def test_unset_knobs_are_llama_servers_own_defaults(tmp_path: Path) -> None:
    argv = plan_for(Knobs(given=frozenset()), tmp_path)
    assert "-np" not in argv and "-c" not in argv and "-b" not in argv
    assert "-cb" in argv  # pinned: continuous batching is stated
    adapter = llamacpp.LlamaCppAdapter(model=str(tmp_path / "m.gguf"), port=1)
    mapped = {m.knob: m for m in adapter.plan(Knobs(given=frozenset())).mapping}
    assert mapped["max_num_seqs"].status == "default" and mapped["max_num_seqs"].value == 4
    assert mapped["prefix_caching"].value is True
    assert mapped["kv_cache_dtype"].value == "f16"


def test_unset_slots_give_the_auto_slots_context(tmp_path: Path) -> None:
    argv = plan_for(Knobs(max_model_len=512, given=frozenset({"max_model_len"})), tmp_path)
    assert flag(argv, "-c") == str(4 * 512) and "-np" not in argv


def test_static_batching_turns_continuous_batching_off(tmp_path: Path) -> None:
    argv = plan_for(Knobs.from_mapping({"policy": "static"}), tmp_path)
    assert "-nocb" in argv and "-cb" not in argv


@pytest.mark.parametrize(("changes", "fragment"), [
    ({"policy": "priority"}, "no priority"),
    ({"preemption": "recompute"}, "never preempts"),
    ({"preemption": "swap"}, "never preempts"),
    ({"chunked_prefill": False}, "always splits a prompt"),
    ({"weights_dtype": "fp8"}, "GGUF file"),
    ({"kv_cache_dtype": "fp8"}, "no FP8 KV-cache type"),
    ({"gpu_memory_utilization": 0.5}, "not from a memory fraction"),
    ({"tensor_parallel_size": 2}, "not by tensor parallelism"),
])
def test_what_llama_server_cannot_honour_is_refused(tmp_path: Path, changes: dict[str, object],
                                                    fragment: str) -> None:
    knobs = Knobs.from_mapping(changes)
    with pytest.raises(KnobError, match=fragment):
        plan_for(knobs, tmp_path)


def test_bf16_weights_are_refused_for_what_is_really_wrong(tmp_path: Path) -> None:
    """The GGUF file's types are served as they are: bf16 is not missing, it cannot be asked."""
    with pytest.raises(KnobError) as err:
        plan_for(Knobs.from_mapping({"weights_dtype": "bf16"}), tmp_path)
    said = str(err.value)
    assert "FP8" not in said
    assert "cannot make the weights bf16" in said and "BF16 GGUF file" in said


LLAMA_GIVEN = {"max_num_seqs": 2, "max_model_len": 4096, "max_num_batched_tokens": 512,
               "kv_cache_dtype": "bf16", "policy": "fcfs"}


@pytest.mark.parametrize(("extra", "knob", "mapped_flag", "policy"), [
    (["--ctx-size", "8192"], "max_model_len", "-c", "fcfs"),  # 2 slots x 4096
    (["--parallel", "2"], "max_num_seqs", "-np", "fcfs"),
    (["--batch-size", "512"], "max_num_batched_tokens", "-b", "fcfs"),
    (["--cache-type-k", "bf16"], "kv_cache_dtype", "-ctk", "fcfs"),
    (["--cont-batching"], "policy", "-cb", "fcfs"),
    (["--no-cont-batching"], "policy", "-nocb", "static"),
])
def test_extra_args_override_a_flag_written_long_or_short(
        tmp_path: Path, extra: list[str], knob: str, mapped_flag: str, policy: str) -> None:
    """An extra arg giving a knob's own value, written long or short, replaces its flags."""
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    knobs = Knobs.from_mapping({**LLAMA_GIVEN, "policy": policy, "extra_args": extra})
    plan = llamacpp.LlamaCppAdapter(model=str(gguf), port=1, executable="/x").plan(knobs)
    assert mapped_flag not in plan.argv  # llama-server would see the knob twice
    mapped = {m.knob: m for m in plan.mapping}
    assert mapped[knob].status == "not_applied"
    assert mapped[knob].note == f"overridden by extra_args ({extra[0]})"


@pytest.mark.parametrize(("extra", "said"), [
    (["--ctx-size", "2048"], "max_model_len=4096 sets -c 8192, but extra_args set --ctx-size 2048"),
    (["-np", "3"], "max_num_seqs=2 sets -np 2, but extra_args set -np 3"),
    (["-ub", "64"], "max_num_batched_tokens=512 sets -ub 512, but extra_args set -ub 64"),
    (["-ctk", "q8_0"], "kv_cache_dtype='bf16' sets -ctk bf16, but extra_args set -ctk q8_0"),
    (["--no-cont-batching"], "policy='fcfs' sets -cb, but extra_args set --no-cont-batching"),
    (["-nocb"], "policy='fcfs' sets -cb, but extra_args set -nocb"),
])
def test_extra_args_against_a_given_knob_are_refused(
        tmp_path: Path, extra: list[str], said: str) -> None:
    """The defect: an extra arg with another value than a knob the user gave ran the engine
    with the extra arg's value while the run's knobs said the knob's."""
    knobs = Knobs.from_mapping({**LLAMA_GIVEN, "extra_args": extra})
    with pytest.raises(KnobError) as err:
        llamacpp.LlamaCppAdapter(model=str(tmp_path / "m.gguf"), port=1).plan(knobs)
    assert str(err.value) == (
        f"llamacpp: a knob and extra_args ask for different settings: {said}. Drop one of them "
        "(a knob left unset lets extra_args decide, and is recorded as overridden).")


def test_switches_are_compared_as_on_or_off(tmp_path: Path) -> None:
    """--no-cache-prompt is prompt caching off, as prefix_caching=false passes it."""
    adapter = llamacpp.LlamaCppAdapter(model=str(tmp_path / "m.gguf"), port=1)
    same = adapter.plan(Knobs.from_mapping({"prefix_caching": False,
                                            "extra_args": ["--no-cache-prompt"]}))
    assert {m.knob: m for m in same.mapping}["prefix_caching"].status == "not_applied"
    with pytest.raises(KnobError, match="prefix_caching=True sets --cache-prompt, but "
                                        "extra_args set --no-cache-prompt"):
        adapter.plan(Knobs.from_mapping({"prefix_caching": True,
                                         "extra_args": ["--no-cache-prompt"]}))
    with pytest.raises(KnobError, match="prefix_caching=False sets --cache-ram 0, but "
                                        "extra_args set --cache-ram 512"):
        adapter.plan(Knobs.from_mapping({"prefix_caching": False,
                                         "extra_args": ["--cache-ram", "512"]}))


def test_an_extra_arg_that_tunes_beyond_a_given_knob_is_an_override(tmp_path: Path) -> None:
    """--cache-ram 8192 with prefix caching on asks for nothing prefix_caching=true contradicts
    (only prefix_caching=false sets --cache-ram, to 0): accepted and recorded as overridden,
    where a rule refusing every flag the knob's value leaves out refused it."""
    adapter = llamacpp.LlamaCppAdapter(model=str(tmp_path / "m.gguf"), port=1)
    plan = adapter.plan(Knobs.from_mapping({"prefix_caching": True,
                                            "extra_args": ["--cache-ram", "8192"]}))
    mapped = {m.knob: m for m in plan.mapping}["prefix_caching"]
    assert mapped.status == "not_applied"
    assert mapped.note == "overridden by extra_args (--cache-ram)"
    assert plan.argv[-2:] == ("--cache-ram", "8192")


def test_approximations_are_recorded(tmp_path: Path) -> None:
    knobs = Knobs.from_mapping({"kv_cache_dtype": "fp8", "preemption": "recompute"})
    adapter = llamacpp.LlamaCppAdapter(model=str(tmp_path / "m.gguf"), port=1)
    plan = adapter.plan(knobs, allow_approximate=True)
    mapped = {m.knob: m for m in plan.mapping}
    assert mapped["kv_cache_dtype"].status == "approximated"
    assert mapped["kv_cache_dtype"].flags == ("-ctk q8_0 -ctv q8_0",)
    assert mapped["preemption"].status == "approximated"


def test_a_model_folder_loads_the_gguf_beside_it(tmp_path: Path) -> None:
    folder = tmp_path / "small-llama"
    folder.mkdir()
    with pytest.raises(KnobError, match="without one GGUF file"):
        llamacpp.gguf_path(str(folder))
    (tmp_path / "small-llama.gguf").write_bytes(b"GGUF")
    assert llamacpp.gguf_path(str(folder)) == str(tmp_path / "small-llama.gguf")
    assert llamacpp.gguf_path(str(tmp_path / "x.gguf")) == str(tmp_path / "x.gguf")


def test_the_binary_is_found_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    assert llamacpp.find_executable("/given") == "/given"
    monkeypatch.setenv(llamacpp.EXECUTABLE_ENV, "/from/env")
    assert llamacpp.find_executable() == "/from/env"
    monkeypatch.delenv(llamacpp.EXECUTABLE_ENV)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert llamacpp.find_executable() == llamacpp.DEFAULT_BINARY


def test_attach_probes_props_and_reads_llamacpp_metrics() -> None:
    plan = catalog.make_adapter("llamacpp", model="m").attach("http://127.0.0.1:9/", Knobs())
    assert not plan.launch and plan.base_url == "http://127.0.0.1:9"
    assert plan.version_paths == ("/props",)
    assert plan.telemetry.source("num_running").names == ("llamacpp:requests_processing",)  # type: ignore[union-attr]
    assert {m.status for m in plan.mapping} == {"not_applied"}


def test_reported_knobs_from_props_and_slots() -> None:
    props = {"total_slots": 8, "default_generation_settings": {"n_ctx": 512}}
    assert catalog.server_reported_knobs(props) == {"max_num_seqs": 8, "max_model_len": 512}
    slots = [{"id": 0, "n_ctx": 256}, {"id": 1, "n_ctx": 256}]
    assert catalog.server_reported_knobs(None, slots) == {"max_num_seqs": 2,
                                                           "max_model_len": 256}
    assert catalog.server_reported_knobs({"version": "0.32.0"}) == {}
    values, sources = catalog.attached_knobs(
        Knobs(max_num_seqs=16, given=frozenset({"max_num_seqs"})), {"max_num_seqs": 8,
                                                                    "max_model_len": 512})
    assert values["max_num_seqs"] == 16 and sources["max_num_seqs"] == "stated"
    assert values["max_model_len"] == 512 and sources["max_model_len"] == "reported"
    assert values["policy"] == "unknown" and sources["policy"] == "unknown"


def test_the_engine_asks_for_its_exact_token_count() -> None:
    assert catalog.replay_defaults("llamacpp") == {"timings_per_token": True}
    assert catalog.replay_defaults("vllm") == {}


def test_launch_through_the_adapter_against_the_fake(tmp_path: Path) -> None:
    # The adapter's argv[0] is one executable; a two-line wrapper runs the fake with it.
    wrapper = tmp_path / "llama-server"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    trace = load_trace(REPO / "harness" / "data" / "azure_conv_excerpt.csv",
                       TraceOptions(limit=6, time_scale=0.01, prompt_tokens=16,
                                    output_tokens=8))
    knobs = Knobs.from_mapping({"max_num_seqs": 2, "max_model_len": 256,
                                "extra_args": ["--n-vocab", "50000"]})  # token-id prompts fit
    spec = TargetSpec("llamacpp", "launch", knobs=knobs, model=str(gguf),
                      served_model_name="tiny", executable=str(wrapper),
                      engine_env={"PYTHONPATH": str(REPO) + os.pathsep
                                  + os.environ.get("PYTHONPATH", "")},
                      telemetry_interval_s=0.02, ready_timeout_s=60)
    out = tmp_path / "run"
    summary = live.run_live(spec, trace, out, RunOptions(replay={"timeout_s": 30}))
    assert summary["num_completed"] == 6
    manifest = json.loads((out / "manifest.json").read_text())
    argv = manifest["launch"]["argv"]
    assert argv[argv.index("-np") + 1] == "2" and argv[argv.index("-c") + 1] == "512"
    assert manifest["engine"]["version"] == "b0-fake"  # /props build_info
    assert manifest["replay"]["timings_per_token"] is True
    telemetry = pq.read_table(out / "telemetry.parquet").to_pylist()
    assert max(r["num_running"] or 0 for r in telemetry) <= 2  # two slots
