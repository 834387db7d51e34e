"""Live runs without a real engine: dry run, launch of a stand-in vLLM, attach, failures."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from adapters import vllm
from adapters.base import KnobError, Knobs
from adapters.knobs import ReferenceKnobs
from adapters.process import EngineExited, EngineStartError, ServerProcess, free_port
from harness.cli import main
from harness.live import run as live
from harness.report import render_run_report
from harness.target import UNSET, RunOptions, TargetSpec
from harness.traces import Trace, TraceRequest


def run_live(engine: str, knobs: Knobs, trace: Trace, replay: dict[str, Any],
             out_dir: Path | str, *, launch: bool = True, dry_run: bool = False,
             out: Any = None, **spec: Any) -> dict[str, Any]:
    """``harness.live.run_live`` with a ``TargetSpec`` built from keyword arguments."""
    target = TargetSpec(engine, "launch" if launch else "attach", knobs=knobs, **spec)
    return live.run_live(target, trace, Path(out_dir), RunOptions(replay=replay),
                         dry_run=dry_run, out=out)

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "tests" / "adapters" / "fake_vllm_server.py"


def small_trace(n: int = 6, gap_s: float = 0.0) -> Trace:
    requests = tuple(
        TraceRequest(f"r{i}", i * gap_s, num_prompt_tokens=8, num_output_tokens=5)
        for i in range(n)
    )
    return Trace(requests, source="test", format="synthetic", digest="sha256:test")


def fake_python(tmp_path: Path, *extra: str) -> str:
    """A "python" for the vLLM adapter that starts the stand-in server with the same argv."""
    script = tmp_path / "fake-python"
    args = " ".join(extra)
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@" {args}\n')
    script.chmod(0o755)
    return str(script)


def test_an_engine_that_dies_mid_run_ends_the_replay_and_the_run_says_so(
        tmp_path: Path) -> None:
    """The launched server is killed once it has served 3 requests of a 4 s trace (not at a
    time: on a busy machine a time could come before any request was served): the replay stops
    sending (it used to send the rest into a dead port and call the run finished), what was
    measured is on disk, and the manifest, the summary and the report say how the run ended."""
    out = tmp_path / "run"
    with pytest.raises(EngineExited, match=r"the engine exited \(code -9\)") as raised:
        run_live("vllm", Knobs(max_num_seqs=4), small_trace(80, gap_s=0.05),
                 {"timeout_s": 30}, out, launch=True, model="tiny-model",
                 executable=fake_python(tmp_path, "--crash-after-requests", "3"),
                 ready_timeout_s=60, telemetry_interval_s=0.05)
    summary = json.loads((out / "summary.json").read_text())
    assert raised.value.summary == summary
    assert summary["stopped_early"].startswith("the engine exited (code -9)")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "failed" and manifest["engine"]["status"] == "failed"
    assert summary["status"] == "failed"  # as the manifest says: not an early-stop check's stop
    assert manifest["num_not_sent"] > 20  # it stopped sending within about 0.1 s
    rows = pq.read_table(out / "requests.parquet").to_pylist()
    assert len(rows) == manifest["num_recorded"] == 80 - manifest["num_not_sent"]
    assert sum(r["error_kind"] is None for r in rows) == summary["num_completed"] >= 3
    report = render_run_report(out).read_text()
    assert "did not run to its end: the engine exited (code -9)" in report


def shown_argv(text: str) -> list[str]:
    """The argv a dry run prints: a JSON list, one item a line."""
    block = text.split("argv (JSON, one item a line):\n", 1)[1]
    return json.loads(block[:block.index("\n  ]") + len("\n  ]")])


def test_dry_run_prints_the_plan_and_starts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: ServerProcess) -> None:
        raise AssertionError("a dry run must not start anything")

    monkeypatch.setattr(ServerProcess, "start", refuse)
    out = io.StringIO()
    result = run_live(
        "trtllm", Knobs.from_mapping({"max_num_seqs": 16, "preemption": "none"}),
        small_trace(), {}, "unused",
        launch=True, dry_run=True, model="org/model", port=8123, out=out,
    )
    text = out.getvalue()
    assert result["dry_run"] is True and result["argv"][0] == "trtllm-serve"
    assert shown_argv(text)[:6] == ["trtllm-serve", "org/model", "--host", "127.0.0.1",
                                    "--port", "8123"]
    assert "max_batch_size: 16" in text and "GUARANTEED_NO_EVICT" in text
    assert "knob mapping:" in text
    assert not Path("unused").exists()


def test_dry_run_from_the_command_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main([
        "replay", "--engine", "vllm", "--launch", "--model-path", "models/tiny-llama",
        "--model", "tiny", "--max-num-seqs", "2", "--extra-arg=--enforce-eager",
        "--trace", str(REPO / "harness" / "data" / "azure_conv_excerpt.csv"), "--limit", "4",
        "--engine-executable", "/venv/python", "--dry-run", "--out", str(tmp_path / "run"),
    ])
    out = capsys.readouterr().out
    assert code == 0, out
    argv = shown_argv(out)
    assert argv[:5] == ["/venv/python", "-m", "vllm.entrypoints.openai.api_server", "--model",
                        "models/tiny-llama"]
    assert argv[argv.index("--max-num-seqs") + 1] == "2" and "--enforce-eager" in argv
    assert not (tmp_path / "run").exists()


def test_command_line_refusal_is_a_user_error(capsys: pytest.CaptureFixture[str]) -> None:
    code = main([
        "replay", "--engine", "vllm", "--launch", "--model-path", "m", "--policy", "static",
        "--trace", str(REPO / "harness" / "data" / "azure_conv_excerpt.csv"), "--dry-run",
    ])
    assert code == 2
    assert "vllm cannot honour: policy='static'" in capsys.readouterr().err


def test_launch_replay_and_teardown_with_a_stand_in_vllm(tmp_path: Path) -> None:
    out = tmp_path / "run"
    knobs = Knobs(max_num_seqs=2, max_num_batched_tokens=64, max_model_len=128)
    summary = run_live(
        "vllm", knobs, small_trace(6), {"timeout_s": 30}, out, launch=True,
        model="tiny-model", engine_env={"VLLM_CPU_KVCACHE_SPACE": "1"},
        executable=fake_python(tmp_path), ready_timeout_s=60, telemetry_interval_s=0.02,
    )
    assert summary["num_requests"] == 6 and summary["num_completed"] == 6
    manifest = json.loads((out / "manifest.json").read_text())
    engine = manifest["engine"]
    assert engine["name"] == "vllm" and engine["version"] == "0.0.0-fake"
    assert engine["status"] == "finished" and engine["mode"] == "launch"
    assert engine["exit"]["signal_used"] == "SIGTERM"
    argv = manifest["launch"]["argv"]
    assert argv[argv.index("--max-num-seqs") + 1] == "2"
    assert manifest["launch"]["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    mapped = {m["knob"]: m for m in manifest["mapping"]}
    assert mapped["max_num_seqs"]["flags"] == ["--max-num-seqs 2"]
    assert manifest["knobs"]["max_num_seqs"] == 2
    assert manifest["trace"]["digest"] == "sha256:test"
    assert manifest["batchlab_version"] and manifest["host"]
    telemetry = pq.read_table(out / "telemetry.parquet").to_pylist()
    assert telemetry and max(r["num_running"] for r in telemetry) <= 2
    # the stand-in exports the old KV name: read through the alias
    assert all(r["kv_usage"] is not None for r in telemetry)
    # nor a preemption counter, nor prefix-cache counters
    assert manifest["telemetry"]["missing"] == ["num_preemptions", "prefix_cache_queries",
                                                "prefix_cache_hits"]
    requests = pq.read_table(out / "requests.parquet").to_pylist()
    assert len(requests) == 6 and all(r["error_kind"] is None for r in requests)
    assert "fake vllm argv" in (out / "vllm-server.stdout.log").read_text()


@pytest.mark.parametrize("ignores", [True, False])
def test_chunked_prefill_off_that_the_server_log_shows_ignored_is_recorded_not_applied(
        tmp_path: Path, ignores: bool, capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM V1 releases turned chunked prefill on whatever --no-enable-chunked-prefill said,
    and logged so at start-up: the run records the knob as not applied, with the engine's
    actual setting, and says so on the console and in the report. A release that honours
    the flag logs nothing of the kind, and the knob stays applied."""
    out = tmp_path / "run"
    knobs = Knobs(chunked_prefill=False, max_num_batched_tokens=256, max_model_len=128)
    extra = ("--ignore-no-chunking",) if ignores else ()
    run_live("vllm", knobs, small_trace(2), {"timeout_s": 30}, out, launch=True,
             model="tiny-model", executable=fake_python(tmp_path, *extra),
             ready_timeout_s=60, telemetry_interval_s=0.05)
    manifest = json.loads((out / "manifest.json").read_text())
    mapped = {m["knob"]: m for m in manifest["mapping"]}["chunked_prefill"]
    assert mapped["flags"] == ["--no-enable-chunked-prefill"] and mapped["value"] is False
    err = capsys.readouterr().err
    render_run_report(out)
    report = (out / "report.md").read_text()
    if ignores:
        assert mapped["status"] == "not_applied"
        assert "Chunked prefill is enabled" in mapped["note"] and "#18547" in mapped["note"]
        assert manifest["knobs"]["chunked_prefill"] is True  # what the engine ran with
        assert "warning: vllm: chunked_prefill not applied" in err
        assert "chunked_prefill=false not applied" in report
    else:
        assert mapped["status"] == "applied"
        assert manifest["knobs"]["chunked_prefill"] is False
        assert "chunked_prefill" not in err and "not applied" not in report


def test_a_server_that_dies_at_start_is_recorded(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with pytest.raises(EngineStartError, match="unknown flag --max-num-sqs"):
        run_live(
            "vllm", Knobs(), small_trace(2), {}, out, launch=True, model="m",
            executable=fake_python(tmp_path, "--fail", "'unknown flag --max-num-sqs'"),
            ready_timeout_s=60,
        )
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "failed"
    assert "unknown flag" in manifest["error"]
    assert manifest["engine"]["exit"]["signal_used"] == "none"


def test_attach_to_a_running_server(tmp_path: Path) -> None:
    port = free_port()
    with ServerProcess([sys.executable, str(FAKE), "--port", str(port)], log_dir=tmp_path,
                       env={"PYTHONPATH": str(REPO)}) as server:
        server.start()
        out = tmp_path / "run"
        run_live("vllm", UNSET, small_trace(3), {"timeout_s": 30}, out, launch=False,
                 url=f"http://127.0.0.1:{port}", model="m", telemetry_interval_s=0.05)
        assert server.poll() is None  # batchlab does not stop what it did not start
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["engine"]["mode"] == "attach" and manifest["launch"] is None
    assert {m["status"] for m in manifest["mapping"]} == {"not_applied"}
    assert (out / "telemetry.parquet").exists()


def test_attach_refuses_knobs_it_cannot_apply() -> None:
    with pytest.raises(KnobError, match="max_num_seqs"):
        run_live("vllm", Knobs(max_num_seqs=4), small_trace(), {}, "unused", launch=False,
                 url="http://127.0.0.1:9", model="m", dry_run=True, out=io.StringIO())


@pytest.mark.parametrize("spec", [{"profile": "vllm-h100-sxm"},
                                  {"reference": ReferenceKnobs(num_gpu_blocks=100)}])
def test_attach_refuses_the_served_references_own_settings(spec: dict[str, Any]) -> None:
    name = "profile" if "profile" in spec else "num_gpu_blocks"
    with pytest.raises(KnobError, match=name):
        run_live("reference", Knobs(), small_trace(), {}, "unused", launch=False,
                 url="http://127.0.0.1:9", model="m", dry_run=True, out=io.StringIO(), **spec)


def test_a_profile_for_another_engine_is_refused_at_plan_time() -> None:
    with pytest.raises(KnobError, match="reference engine only"):
        run_live("vllm", Knobs(), small_trace(), {}, "unused", launch=True, model="m",
                 dry_run=True, out=io.StringIO(), profile="vllm-h100-sxm")


def test_openai_is_not_launched() -> None:
    with pytest.raises(KnobError, match="--url"):
        run_live("openai", Knobs(), small_trace(), {}, "unused", launch=True, model="m",
                 dry_run=True, out=io.StringIO())


def test_served_reference_end_to_end(tmp_path: Path) -> None:
    """The whole live path on a real server with real Prometheus metrics, and no GPU."""
    out = tmp_path / "run"
    trace = Trace(
        tuple(TraceRequest(f"r{i}", 0.0, num_prompt_tokens=64, num_output_tokens=32)
              for i in range(12)),
        source="test", format="synthetic", digest="sha256:test",
    )
    summary = run_live(
        "reference", Knobs(max_num_seqs=4, max_num_batched_tokens=256), trace,
        {"timeout_s": 60}, out, launch=True, model="llama-3.1-8b", gpu="h100-sxm",
        ready_timeout_s=120, telemetry_interval_s=0.02, profile="vllm-h100-sxm",
    )
    assert summary["num_completed"] == 12
    manifest = json.loads((out / "manifest.json").read_text())
    argv = manifest["launch"]["argv"]
    assert argv[argv.index("--max-num-seqs") + 1] == "4"
    assert argv[argv.index("--profile") + 1] == "vllm-h100-sxm"
    assert manifest["engine"]["version"] is not None
    # its timings are the profile's predictions: the server says so, and so does the report
    prediction = manifest["engine"]["version_probe"]["body"]["prediction"]
    assert prediction["profile"] == "vllm-h100-sxm" and prediction["accuracy"]
    render_run_report(out)
    report = (out / "report.md").read_text().splitlines()
    predicted = next(ln for ln in report if ln.startswith("| Predicted |"))
    assert "**predicted** by the reference engine served over HTTP" in predicted
    assert "`vllm-h100-sxm`" in predicted and "(#how-accurate-the-predictions-are)" in predicted
    accuracy = next(ln for ln in report if ln.startswith(f"| `{out.name}` | profile"))
    assert accuracy.startswith(f"| `{out.name}` | profile `vllm-h100-sxm`, served over HTTP | "
                               f"{prediction['accuracy']['held_out_num_rows']} held-out figures "
                               "(docs/fidelity.md) |")
    assert manifest["engine"]["exit"]["signal_used"] in ("SIGTERM", "none")
    telemetry = pq.read_table(out / "telemetry.parquet").to_pylist()
    running = [r["num_running"] for r in telemetry if r["num_running"] is not None]
    assert running and max(running) <= 4
    assert max(r["num_waiting"] or 0 for r in telemetry) > 0


def test_launch_and_url_are_exclusive() -> None:
    with pytest.raises(KnobError, match="exactly one"):
        run_live("vllm", Knobs(), small_trace(), {}, "unused", launch=True,
                 url="http://127.0.0.1:9", model="m", dry_run=True, out=io.StringIO())


def test_vllm_python_env_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(vllm.PYTHON_ENV, "/custom/python")
    result = run_live("vllm", Knobs(), small_trace(), {}, "unused", launch=True, model="m",
                      dry_run=True, out=io.StringIO())
    assert result["argv"][0] == "/custom/python"
    assert os.environ[vllm.PYTHON_ENV] == "/custom/python"


def test_a_session_gives_an_ignored_knob_the_value_the_engine_ran_with() -> None:
    """calibrate and validate fit and simulate the knobs as the engine ran them: chunked
    prefill on, where the server's log showed it ignored the request to turn it off."""
    from harness.live.session import EngineSession

    plan = vllm.VllmAdapter(model="m", port=1).plan(
        Knobs(chunked_prefill=False, max_num_batched_tokens=256, max_model_len=128))
    assert plan.log_checks == (vllm.CHUNKED_PREFILL_IGNORED,)
    knobs = Knobs(chunked_prefill=False, max_num_seqs=8)
    ran = EngineSession(plan, None, 0.0, plan.log_checks).ran_with(knobs)
    assert ran.chunked_prefill is True and ran.max_num_seqs == 8
    assert EngineSession(plan, None, 0.0).ran_with(knobs) is knobs
    # the token budget batchlab derived for chunking off (max_model_len, with no budget
    # given) is the one the engine ran with, chunking on: the simulation takes it too
    asked = Knobs(chunked_prefill=False, max_model_len=16384,
                  given=frozenset({"chunked_prefill", "max_model_len"}))
    plan = vllm.VllmAdapter(model="m", port=1).plan(asked)
    ran = EngineSession(plan, None, 0.0, plan.log_checks).ran_with(asked)
    assert ran.chunked_prefill is True and ran.max_num_batched_tokens == 16384
    assert ran.is_given("max_num_batched_tokens") and not ran.is_given("max_num_seqs")
    # asked on, or turned off through extra_args: nothing to check
    assert vllm.VllmAdapter(model="m", port=1).plan(Knobs()).log_checks == ()


def test_a_session_marks_a_knob_its_server_ignored_in_the_plan_it_hands_on(
        tmp_path: Path) -> None:
    """validate and calibrate record the session's plan: its mapping says chunked prefill
    was not applied, with why, as a replay's manifest does."""
    from harness.live.session import engine_session

    knobs = Knobs(chunked_prefill=False, max_num_batched_tokens=256, max_model_len=128)
    spec = TargetSpec("vllm", "launch", knobs=knobs, model="tiny-model",
                      executable=fake_python(tmp_path, "--ignore-no-chunking"),
                      ready_timeout_s=60)
    with engine_session(spec, tmp_path / "logs") as session:
        mapped = {m.knob: m for m in session.plan.mapping}
    assert mapped["chunked_prefill"].status == "not_applied"
    assert "#18547" in mapped["chunked_prefill"].note
    assert mapped["max_num_seqs"].status == "applied"
