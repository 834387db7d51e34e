"""`batchlab validate` against the served reference engine when something is wrong: the engine
dies mid-replay, the profile does not describe this engine, the engine's KV cache size.

The served reference (``batchlab serve reference``, in a child process) runs the catalog's
datasheet coefficients, or the profile validate is given; an empty profile holds the catalog's,
so the simulation predicts the served engine and any large error is the harness's, not the
model's.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path

import pytest

from harness.cli import main
from harness.serve import ReferenceChild, launch_server_process

pytestmark = pytest.mark.timeout(300)

SERVED = ("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--max-num-seqs", "8",
          "--max-num-batched-tokens", "2048", "--max-model-len", "2048")
TARGET = ["--engine", "reference", "--model", "llama-3.1-8b", "--reference-model",
          "llama-3.1-8b", "--max-num-seqs", "8", "--max-num-batched-tokens", "2048",
          "--max-model-len", "2048"]
TRACE = ["--trace", "harness/data/azure_conv_excerpt.csv", "--on-too-long", "clip",
         "--limit", "20", "--rate", "2"]


def _profile(tmp_path: Path, **fields: object) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"source": "test", **fields}))
    return path


def _completed(url: str) -> float:
    """The served engine's vllm:request_success_total, summed over its finish reasons."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total"))


def _kill_after(server: ReferenceChild, completed: int, stop: threading.Event) -> None:
    """Kill the server as a crash would once it has completed ``completed`` requests."""
    while not stop.wait(0.05) and server.process.poll() is None:
        try:
            done = _completed(server.url)
        except OSError:
            continue
        if done >= completed:
            server.process.kill()
            return


def test_validate_exits_1_and_compares_only_what_both_completed_when_the_engine_dies(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "v"
    # 20 ms more per step, on both sides: ~26 ms steps stream a third as many tokens per second
    # as the catalog's ~6 ms ones, so a loaded machine seldom puts the served engine behind
    # (behind, it runs its late steps back to back and its TPOT comes out short)
    profile = _profile(tmp_path, step_overhead_s=0.02,
                       metadata={"reference_model": "llama-3.1-8b"})
    with launch_server_process((*SERVED, "--profile", str(profile)),
                               log_path=tmp_path / "server.log") as server:
        # a crash once the engine has completed 3 requests: mid-replay however loaded the machine
        stop = threading.Event()
        killer = threading.Thread(target=_kill_after, args=(server, 3, stop), daemon=True)
        killer.start()
        try:
            code = main(["validate", "--url", server.url, *TARGET, *TRACE,
                         "--profile", str(profile), "--out", str(out)])
        finally:
            stop.set()
            killer.join()
    captured = capsys.readouterr()
    assert code == 1, captured.err
    assert "stopped answering" in captured.err and str(out) in captured.err
    fid = json.loads((out / "fidelity.json").read_text())
    completed = fid["num_completed"]
    assert completed["predicted"] == 20 and 0 < completed["measured"] < 20
    compared = fid["requests_compared"]
    assert compared["basis"] == "completed on both sides"
    assert compared["num_compared"] == completed["measured"]
    assert fid["live_failed"]
    # like with like: the same requests on both sides, so throughput is not 20 vs a few
    assert abs(fid["output_tokens_per_s"]["relative_error"]) < 0.5, fid["output_tokens_per_s"]
    assert abs(fid["tpot_s"]["p50"]["relative_error"]) < 0.5, fid["tpot_s"]
    assert "Compared on" in (out / "fidelity.md").read_text()
    assert "Compared on" in captured.out
    assert (out / "live" / "requests.parquet").exists()
    # its live run folder says it failed, as a replay's does: report and compare read it so
    live = [json.loads((out / "live" / f).read_text()) for f in ("summary.json", "manifest.json")]
    assert live[0]["status"] == live[1]["status"] == "failed"
    assert live[1]["error"] == fid["live_failed"]


def test_validate_reads_the_served_engines_kv_cache(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The served reference exports vLLM's vllm:cache_config_info: validate simulates the
    engine's 160 blocks, not a size of its own."""
    out = tmp_path / "v"
    profile = _profile(tmp_path)
    with launch_server_process((*SERVED, "--num-gpu-blocks", "160"),
                               log_path=tmp_path / "server.log") as server:
        assert main(["validate", "--url", server.url, *TARGET, *TRACE,
                     "--profile", str(profile), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    fid = json.loads((out / "fidelity.json").read_text())
    assert fid["context"]["kv_cache"] == {"block_size": 16, "num_blocks": 160,
                                          "source": "engine"}
    assert fid["warnings"] == [] and "warning" not in captured.err
    assert abs(fid["ttft_s"]["p90"]["relative_error"]) < 0.5, fid["ttft_s"]
    # the live side is the reference engine served over HTTP: itself a prediction, never
    # called "measured", on the terminal and in fidelity.md
    for text in (captured.out, (out / "fidelity.md").read_text()):
        assert "served reference (itself predicted)" in text
        assert "| measured |" not in text


@pytest.mark.parametrize(("fields", "args", "said"), [
    ({"device": "a100-80gb"}, ["--gpu", "h100-sxm"],
     "--gpu 'h100-sxm' but the profile (test) was fitted on device 'a100-80gb'"),
    ({"metadata": {"reference_model": "llama-3.1-8b"}}, ["--reference-model", "llama-3.2-1b"],
     "--reference-model 'llama-3.2-1b' but the profile (test) was fitted with reference model "
     "'llama-3.1-8b'"),
    ({"memory_efficency": 0.5}, [], "unknown profile key 'memory_efficency'; did you mean "
     "'memory_efficiency'?"),
])
def test_validate_refuses_a_profile_of_another_engine_before_anything_runs(
        fields: dict[str, object], args: list[str], said: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    profile = _profile(tmp_path, **fields)
    # nothing listens on port 9: a check made after attaching would fail with "no ready
    # server" instead, after waiting for it
    assert main(["validate", "--url", "http://127.0.0.1:9", *TARGET, *args, *TRACE,
                 "--profile", str(profile), "--out", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err
    assert said in err and "no ready server" not in err
    assert not (tmp_path / "v").exists()


def test_validate_refuses_a_telemetry_interval_not_above_zero(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--url", "http://127.0.0.1:9", *TARGET, *TRACE,
                 "--telemetry-interval-s", "0", "--profile", str(_profile(tmp_path))]) == 2
    assert "--telemetry-interval-s: must be a number of seconds > 0" in capsys.readouterr().err
