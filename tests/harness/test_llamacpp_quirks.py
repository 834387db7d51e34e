"""What llama.cpp's server taught the generic path, each against a fake that reproduces it.

The fake (``tests/adapters/fake_llamacpp_server.py``) runs as its own process, attached to the
way a user attaches to a real llama-server (``--engine openai --url ... --metric-map llamacpp``
or ``--engine llamacpp --url ...``). One test per quirk:

- validate and calibrate read telemetry through ``--metric-map`` (the running-batch comparison);
- the speed probe that gets no token timestamps says why, on the console and in fidelity.json;
- repeated runs hit the server's prompt cache: a warning, and ``--prompt-salt``;
- ``--max-model-len`` is accepted for an attached server (it also clips the trace);
- a refused request's own message reaches the console (not just ``{'http_error': 7}``);
- an attached server's knobs are what the user stated or the server reports, else unknown.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest

from adapters.openai import OpenAIAdapter
from adapters.process import ServerProcess, free_port
from harness.calibrate import run_phases, speed_probe
from harness.calibrate.workload import Phase, burst
from harness.cli import main
from harness.target import UNSET

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "tests" / "adapters" / "fake_llamacpp_server.py"
TRACE = str(REPO / "harness" / "data" / "azure_conv_excerpt.csv")
SMALL_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 768,
    "num_hidden_layers": 4, "num_attention_heads": 12, "num_key_value_heads": 4,
    "head_dim": 64, "intermediate_size": 2048, "vocab_size": 2048,
    "max_position_embeddings": 2048, "tie_word_embeddings": False,
}
PROFILE = {  # a CPU-sized reference: steps of a few ms
    "device": "testdev", "memory_bytes": 8e9, "hbm_bandwidth_bytes_per_s": 1e11,
    "peak_bf16_flops": 2e11, "memory_efficiency": 1.0, "compute_efficiency": 1.0,
    "step_overhead_s": 0.003, "per_seq_overhead_s": 2e-4, "per_kv_token_overhead_s": 5e-7,
    "weight_bytes_per_param": 4.0, "kv_bytes_per_element": 4.0, "activation_fixed_bytes": 0.0,
}
BIG_VOCAB = ("--n-vocab", "50000")  # token-id prompts (no tokenizer) fit

pytestmark = pytest.mark.timeout(180)


@contextlib.contextmanager
def fake_llama(tmp_path: Path, *flags: str) -> Iterator[str]:
    """The fake llama-server in its own process; yields its URL."""
    port = free_port()
    argv = [sys.executable, str(FAKE), "-m", "fake.gguf", "--port", str(port), *flags]
    env = {"PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with ServerProcess(argv, log_dir=tmp_path, name=f"fake-llama-{port}", env=env,
                       cwd=str(REPO), grace_s=5) as server:
        server.start()
        import asyncio

        url = f"http://127.0.0.1:{port}"
        asyncio.run(server.wait_ready(url + "/health", timeout_s=60))
        yield url


def validation_files(tmp_path: Path, workload: list[dict[str, object]] | None = None
                     ) -> tuple[Path, Path]:
    config = tmp_path / "model" / "config.json"
    config.parent.mkdir(exist_ok=True)
    config.write_text(json.dumps(SMALL_LLAMA))
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({**PROFILE, "metadata": {"workload": workload or []}}))
    return config, profile


def validate_args(url: str, config: Path, profile: Path, out: Path, *extra: str) -> list[str]:
    return ["validate", "--engine", "openai", "--url", url, "--model", "m",
            "--reference-model", str(config), "--profile", str(profile), "--trace", TRACE,
            "--limit", "8", "--rate", "8", "--prompt-tokens", "32", "--output-tokens", "8",
            "--max-model-len", "1024", "--telemetry-interval-s", "0.05", "--out", str(out),
            *extra]


# ---------------------------------------------------------------- 4: --metric-map


def test_validate_reads_telemetry_through_the_metric_map(tmp_path: Path) -> None:
    config, profile = validation_files(tmp_path)
    out = tmp_path / "validate"
    with fake_llama(tmp_path, *BIG_VOCAB, "--itl-s", "0.01") as url:
        assert main(validate_args(url, config, profile, out, "--metric-map", "llamacpp")) == 0
    telemetry = pq.read_table(out / "live" / "telemetry.parquet").to_pylist()
    assert any((r["num_running"] or 0) > 0 for r in telemetry), telemetry
    fid = json.loads((out / "fidelity.json").read_text())
    assert fid["running_batch_size"]["mean"]["measured"] > 0  # the comparison is there


def test_calibration_phases_read_telemetry_through_the_metric_map(tmp_path: Path) -> None:
    with fake_llama(tmp_path, *BIG_VOCAB, "--itl-s", "0.01") as url:
        plan = OpenAIAdapter("m", metric_map="llamacpp").attach(url, UNSET)
        phase = Phase("decode-c2", burst("decode-c2", 2, 16, 16), "two decoding together")
        (result,) = run_phases(plan, [phase], tmp_path / "phases", tokenizer_path=None,
                               telemetry_interval_s=0.02, log=lambda _: None)
    assert result.summary["num_completed"] == 2
    rows = pq.read_table(tmp_path / "phases" / "decode-c2" / "telemetry.parquet").to_pylist()
    assert max(r["num_running"] or 0 for r in rows) > 0


# ---------------------------------------------------------------- 5: the speed probe


def test_a_speed_probe_without_token_timestamps_says_why(tmp_path: Path) -> None:
    reference = {"name": "decode-c2", "mean_decode_step_s": 0.01, "prompt_tokens": [16],
                 "output_tokens": [8], "num_requests": 2}
    with fake_llama(tmp_path, *BIG_VOCAB, "--empty-text") as url:
        plan = OpenAIAdapter("m", metric_map="llamacpp").attach(url, UNSET)
        probe = speed_probe(plan, reference, tmp_path / "probe", tokenizer_path=None)
    assert probe.drift is None
    assert probe.reason is not None and "carry no text" in probe.reason, probe


def test_validate_reports_why_the_speed_probe_measured_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    burst_without_figure = [{"name": "decode-c4", "num_requests": 4, "prompt_tokens": [16],
                             "output_tokens": [8], "mean_decode_step_s": None}]
    config, profile = validation_files(tmp_path, burst_without_figure)
    out = tmp_path / "validate"
    with fake_llama(tmp_path, *BIG_VOCAB) as url:
        assert main(validate_args(url, config, profile, out, "--metric-map", "llamacpp")) == 0
    speed = json.loads((out / "fidelity.json").read_text())["engine_speed_vs_calibration"]
    assert speed["before"] is None and "no mean decode step" in speed["before_reason"]
    captured = capsys.readouterr()
    assert "speed probe before the replay: not measured" in captured.err
    assert "Engine speed since calibration: not measured" in captured.out


# ---------------------------------------------------------------- 6: the prompt cache


def cache_hits(url: str) -> int:
    return int(httpx.get(url + "/_cache").json()["num_cache_hits"])


def replay_args(url: str, out: Path, *extra: str) -> list[str]:
    return ["replay", "--target", url, "--model", "m", "--trace", TRACE, "--limit", "4",
            "--rate", "20", "--prompt-tokens", "32", "--output-tokens", "4", "--out", str(out),
            "--overwrite", *extra]


def test_repeated_runs_warn_about_the_prompt_cache_and_a_salt_avoids_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with fake_llama(tmp_path, *BIG_VOCAB) as url:
        assert main(replay_args(url, tmp_path / "a")) == 0
        assert "may answer repeated prompts from its cache" in capsys.readouterr().err
        assert cache_hits(url) == 0
        assert main(replay_args(url, tmp_path / "b")) == 0
        assert cache_hits(url) == 4  # the same four prompts again: all from the cache
        capsys.readouterr()
        assert main(replay_args(url, tmp_path / "c", "--prompt-salt", "auto")) == 0
        assert "may answer repeated prompts" not in capsys.readouterr().err
        assert cache_hits(url) == 4  # salted: new prompts, no hit
        salt = json.loads((tmp_path / "c" / "manifest.json").read_text())["replay"]["prompt_salt"]
        assert salt and salt != "auto"  # the salt used is recorded, so the run can be repeated
        assert main(replay_args(url, tmp_path / "d", "--prompt-salt", salt)) == 0
        assert cache_hits(url) == 8


# ---------------------------------------------------------------- 7: --max-model-len


def test_max_model_len_is_accepted_for_an_attached_server(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with fake_llama(tmp_path, *BIG_VOCAB) as url:
        assert main(["replay", "--engine", "openai", "--url", url, "--model", "m", "--trace",
                     TRACE, "--limit", "4", "--rate", "20", "--output-tokens", "4",
                     "--max-model-len", "512", "--on-too-long", "clip", "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["knobs"]["max_model_len"] == 512
    assert manifest["knob_sources"]["max_model_len"] == "stated"
    requests = pq.read_table(out / "requests.parquet").to_pylist()
    assert all(r["num_prompt_tokens"] + r["num_target_output_tokens"] <= 512 for r in requests)


# ---------------------------------------------------------------- 8: the server's message


def test_the_servers_first_error_message_reaches_the_console(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, profile = validation_files(tmp_path)
    with fake_llama(tmp_path) as url:  # a 2,048-token vocabulary: token-id prompts fall outside
        assert main(replay_args(url, tmp_path / "replay")) == 1  # no request succeeded
        printed = capsys.readouterr()
        out = printed.out
        assert "failures: http_error 4" in out
        assert "first error: request" in out and "Prompt contains invalid tokens" in out
        assert "none of the 4 requests completed" in printed.err
        assert "is the server" not in printed.err  # it answered: its own words say why

        assert main(["calibrate", "--engine", "openai", "--url", url, "--model", "m",
                     "--reference-model", str(config), "--max-num-seqs", "4",
                     "--max-num-batched-tokens", "256", "--max-model-len", "512",
                     "--out", str(tmp_path / "p.json")]) != 0
        err = capsys.readouterr().err
        assert "http_error" in err and "Prompt contains invalid tokens" in err

        # every live request refused: nothing compared, so the validation fails, as replay
        # does, with the server's own words and the comparison still on disk
        assert main(validate_args(url, config, profile, tmp_path / "validate")) == 1
        printed = capsys.readouterr()
        assert "Prompt contains invalid tokens" in printed.out
        assert ("none of the 8 requests completed live (http_error 8): nothing was compared"
                in printed.err)
        assert (tmp_path / "validate" / "fidelity.json").is_file()


# ---------------------------------------------------------------- 9: knobs of attached servers


def test_an_attached_servers_knobs_are_stated_reported_or_unknown(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    with fake_llama(tmp_path, *BIG_VOCAB, "-np", "4", "-c", "4096") as url:
        assert main(["replay", "--engine", "llamacpp", "--url", url, "--model", "m",
                     "--trace", TRACE, "--limit", "4", "--rate", "20", "--output-tokens", "4",
                     "--prompt-tokens", "16", "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["knobs"]["max_num_seqs"] == 4  # /props total_slots, not batchlab's 256
    assert manifest["knobs"]["max_model_len"] == 1024  # one slot's context: 4096 / 4
    assert manifest["knob_sources"]["max_num_seqs"] == "reported"
    assert manifest["knobs"]["gpu_memory_utilization"] == "unknown"
    assert {m["value"] for m in manifest["mapping"] if m["knob"] == "max_num_seqs"} == {4}
    assert not any(m["value"] == 256 for m in manifest["mapping"])

    report = tmp_path / "report.md"
    assert main(["report", str(out), "-o", str(report)]) == 0
    text = report.read_text()
    assert "attached to a server started outside batchlab" in text
    assert "max_num_seqs=4 (reported)" in text and "max_num_seqs=256" not in text


def test_validate_records_stated_knobs_for_an_attached_server(tmp_path: Path) -> None:
    config, profile = validation_files(tmp_path)
    out = tmp_path / "validate"
    with fake_llama(tmp_path, *BIG_VOCAB, "-np", "4", "-c", "4096") as url:
        assert main(validate_args(url, config, profile, out, "--max-num-seqs", "8")) == 0
    manifest = json.loads((out / "live" / "manifest.json").read_text())
    assert manifest["knobs"]["max_num_seqs"] == 8
    assert manifest["knob_sources"]["max_num_seqs"] == "stated"
    assert manifest["knobs"]["max_num_batched_tokens"] == "unknown"
    assert not any(m["value"] == 256 for m in manifest["mapping"])
