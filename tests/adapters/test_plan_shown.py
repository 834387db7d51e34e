"""A launch plan as people see it: the dry run and the manifest show it without its secrets,
and say which program starts the engine."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from adapters import trtllm
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


def shown_argv(text: str) -> list[str]:
    """The argv a dry run prints: a JSON list, one item a line."""
    block = text.split("argv (JSON, one item a line):\n", 1)[1]
    return json.loads(block[:block.index("\n  ]") + len("\n  ]")])


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
    argv = shown_argv(text)
    assert argv[argv.index("HF_TOKEN") - 1] == "-e" and "HF_TOKEN=***" in text


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


def test_argv_is_shown_as_a_list_with_the_config_folder_resolved() -> None:
    """Issue: the dry run printed argv as one shell-quoted string with {config_dir} unresolved
    even when the run folder was known; an item with spaces or an empty one was ambiguous."""
    plan = trtllm.TrtllmAdapter("org/my model", port=8123).plan(
        Knobs.from_mapping({"extra_args": ["--reasoning_parser", ""]}))
    text = plan.describe(config_dir="/runs/a b")
    assert ('argv (JSON, one item a line):\n  [\n    "trtllm-serve",\n    "org/my model",\n'
            '    "--host",\n') in text
    argv = shown_argv(text)
    assert argv[argv.index("--extra_llm_api_options") + 1] == "/runs/a b/trtllm-serve.yaml"
    assert argv[-2:] == ["--reasoning_parser", ""]
    assert "config file /runs/a b/trtllm-serve.yaml:" in text
    assert "{config_dir}" not in text
    # not known yet: the placeholder stays, and says so by its name
    assert shown_argv(plan.describe())[argv.index("--extra_llm_api_options") + 1] == (
        "{config_dir}/trtllm-serve.yaml")


def test_the_command_lines_dry_run_resolves_the_config_folder_to_the_run_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from harness.cli import main

    out = tmp_path / "run"
    assert main(["replay", "--engine", "trtllm", "--launch", "--model", "org/m",
                 "--max-model-len", "2048", "--trace", "synthetic", "--rate", "1",
                 "--num-requests", "2", "--prompt-tokens", "8", "--output-tokens", "2",
                 "--dry-run", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "{config_dir}" not in text
    assert f'"{out.resolve()}/trtllm-serve.yaml"' in text
    assert not out.exists()  # a dry run writes nothing
