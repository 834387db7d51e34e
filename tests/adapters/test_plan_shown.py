"""A launch plan as people see it: the dry run and the manifest show it without its secrets,
and say which program starts the engine."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from adapters.base import Knobs
from adapters.process import ServerProcess
from harness.live import run as live
from harness.live.session import plan_for
from harness.target import RunOptions, TargetSpec
from harness.traces import Trace, TraceRequest

SECRETS = ("hf_SECRET123", "sk-LIVEKEY")


def trace() -> Trace:
    requests = (TraceRequest("r0", 0.0, num_prompt_tokens=8, num_output_tokens=5),)
    return Trace(requests, source="test", format="synthetic", digest="sha256:test")


def dry_run(engine: str, knobs: Knobs, **spec: Any) -> tuple[str, dict[str, Any]]:
    target = TargetSpec(engine, "launch", knobs=knobs, model="org/model", port=8123,
                        engine_env={"HF_TOKEN": "hf_SECRET123"}, **spec)
    out = io.StringIO()
    result = live.run_live(target, trace(), Path("unused"), RunOptions(), dry_run=True, out=out)
    return out.getvalue(), result


@pytest.fixture(autouse=True)
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: ServerProcess) -> None:
        raise AssertionError("a dry run must not start anything")

    monkeypatch.setattr(ServerProcess, "start", refuse)


def test_vllm_dry_run_shows_no_secret() -> None:
    knobs = Knobs.from_mapping({"extra_args": ["--api-key", "sk-LIVEKEY"]})
    text, result = dry_run("vllm", knobs, executable="/venv/python")
    shown = text + json.dumps(result)
    for secret in SECRETS:
        assert secret not in shown
    assert "HF_TOKEN=***" in text and "--api-key '***'" in text
    assert result["env"]["HF_TOKEN"] == "***"
    assert result["argv"][-2:] == ["--api-key", "***"]
    extra = next(m for m in result["mapping"] if m["knob"] == "extra_args")
    assert extra["value"] == ["--api-key", "***"]
    assert "DO_NOT_TRACK=1" in text  # allow-listed settings stay readable


def test_tgi_container_dry_run_shows_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    text, result = dry_run("tgi", Knobs.from_mapping({}), runtime="docker")
    for secret in SECRETS:
        assert secret not in text + json.dumps(result)
    assert "-e HF_TOKEN " in text and "HF_TOKEN=***" in text


def test_the_launcher_is_shown_and_recorded() -> None:
    text, result = dry_run("vllm", Knobs.from_mapping({}), executable="/venv/python")
    launcher = "/venv/python -m vllm.entrypoints.openai.api_server (the python given to batchlab)"
    assert f"launcher: {launcher}\n" in text
    assert result["launcher"] == launcher
    spec = TargetSpec("vllm", "launch", knobs=Knobs.from_mapping({}), model="m", port=8123,
                      executable="/venv/python")
    plan = plan_for(spec)
    manifest = live._engine_manifest(plan, spec.knobs, trace(), model="m",
                                     allow_approximate=False, argv=plan.argv, gpu=None,
                                     command=None)
    assert manifest["launch"]["launcher"] == launcher
